"""Result folders side by side: load runs of one kind and merge their tables.

Pure pandas: reads the metadata.json and CSV files a command wrote, checks them, and gives
one DataFrame per table with a `run` column first. Every problem (a missing folder or
file, a corrupt CSV or JSON, a schema this benchbatch does not know, folders of different
kinds) is a UserError naming the bad file: one line, exit code 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from benchbatch.core.inputs import numeric
from benchbatch.errors import UserError
from benchbatch.output.results import SCHEMA_VERSION

ARGUMENT = "RUN_DIR"
KNOWN_SCHEMAS = {SCHEMA_VERSION}

# The columns compare reads from each table (a table without them is corrupt), and which
# of those must be numbers.
COLUMNS = {
    "probe": ("kind", "label", "tflops", "gbps", "status"),
    "phases": ("phase", "label", "batch", "tokens", "step_ms", "us_per_token", "tflops", "status"),
    "sweep": ("context", "batch", "step_ms", "tokens_per_s", "status"),
    "occupancy": ("policy", "slots", "total_steps", "occupancy", "speedup_vs_static"),
    "engine": ("policy", "total_steps", "wall_s", "tokens_per_s", "occupancy"),
    "serve": ("policy", "source", "rate", "rate_rps", "output_throughput_tps", "ttft_p50_s",
              "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"),
    "slo": ("policy", "source", "sustained_rps"),
}  # fmt: skip
NUMERIC = (
    "tflops", "gbps", "batch", "tokens", "context", "step_ms", "us_per_token", "tokens_per_s",
    "slots", "total_steps", "occupancy", "speedup_vs_static", "wall_s", "rate_rps",
    "output_throughput_tps", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "sustained_rps",
)  # fmt: skip
UNBOUNDED = ("rate_rps", "sustained_rps")  # may be inf (max: every request queued at once)
TEXT = {"serve": ("rate",)}  # '2.4' and 'max' in one column: read as text in every folder

# What each command's folder holds: (tables it always writes, tables it may write).
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "probe": (("probe",), ()),
    "phases": (("phases",), ("probe",)),  # probe.csv: the ceilings it measured first
    "sweep": (("sweep",), ("probe",)),
    "occupancy": (("occupancy",), ("engine",)),
    "reproduce": (("probe", "phases", "sweep", "occupancy"), ("engine", "serve", "slo")),
    "serve-sweep": (("serve", "slo"), ()),
}
TABLE_ORDER = ("probe", "phases", "sweep", "occupancy", "engine", "serve", "slo", "peer_check")


@dataclass
class RunData:
    label: str
    folder: Path
    kind: str
    meta: dict
    tables: dict[str, pd.DataFrame]

    def describe(self) -> dict:
        """Who is who in a comparison: label, kind, device, dtype, model, status."""
        env, cfg = _object(self.meta.get("environment")), _object(self.meta.get("config"))
        model = _text(cfg.get("name", "-"))
        if cfg.get("hidden"):
            model += f" ({_text(cfg['hidden'])} x {_text(cfg.get('layers', '?'))})"
        graphs = _object(self.meta.get("options")).get("cuda_graphs")
        if not str(env.get("device", "")).startswith("cuda"):  # a CPU's run has no graphs
            graphs = None
        return {
            "run": self.label,
            "kind": self.kind,
            "device": _text(env.get("device_name", "-")),
            "dtype": _text(env.get("dtype", "-")),
            "model": model,
            "cuda_graphs": graphs if isinstance(graphs, bool) else None,
            "status": _text(self.meta.get("status", "-")),
            "folder": str(self.folder),
        }


# Options that say where a run went or how it printed, not what it measured.
NOT_MEASURED = frozenset({"out", "force", "json_out", "label", "quiet"})


# The environment's parts a comparison names where the runs differ (the device and dtype
# are the runs table's own columns): another benchbatch or torch measures other code.
VERSIONS = (("benchbatch_version", "benchbatch version"), ("torch_version", "torch version"))


def differences(runs: list[RunData]) -> dict[str, list[str]]:
    """What the runs measured differently: the benchbatch and torch versions, the model's
    weight layout, each model size (metadata's config) and each option whose values are not
    all alike, its values in the runs' order (as text; an option a run does not have and
    one it left unset both "-"). A ratio between runs then compares these too; the device
    is the runs table's own column. --cuda-graphs is left out where no run was on CUDA (a
    CPU has no graphs)."""
    found: dict[str, list[str]] = {}
    envs = [_object(r.meta.get("environment")) for r in runs]
    for key, name in VERSIONS:
        values = [_text(e.get(key, "-")) for e in envs]
        if len(set(values)) > 1:
            found[name] = values
    layouts = [_text(r.meta.get("weight_layout", "-")) for r in runs]  # the engine's kernels
    if len(set(layouts)) > 1:  # packed against strided: up to 1.6x a step on one CPU
        found["weight layout"] = layouts
    models = [_object(r.meta.get("config")) for r in runs]
    parts = (("config", frozenset({"name"})), ("options", NOT_MEASURED))
    if not all(models) and any(models):  # a run without a model (simulated): its name alone
        found["model"] = [_text(m.get("name", "none")) for m in models]
        parts = parts[1:]
    cuda = any(str(e.get("device", "")).startswith("cuda") for e in envs)
    for part, skip in parts:
        given = [_object(r.meta.get(part)) for r in runs]
        for key in dict.fromkeys(k for g in given for k in g):
            if key in skip or key in found or (key == "cuda_graphs" and not cuda):
                continue  # a size given: the config's value says it
            values = [_text(g.get(key)) if g.get(key) is not None else "-" for g in given]
            if len(set(values)) > 1:
                found[key] = values
    return found


def _object(value) -> dict:
    """A part of a hand-edited metadata.json that should be an object: {} if it is not."""
    return value if isinstance(value, dict) else {}


def _text(value) -> str:
    """A value of metadata.json as one short line of text, whatever its type."""
    from benchbatch.core.inputs import short

    return short(value if isinstance(value, str) else json.dumps(value), 80)


def fail(message: str) -> UserError:
    return UserError(ARGUMENT, message)


def read_metadata(folder: Path) -> dict:
    """A run folder's metadata.json, checked: a dict with a command and a known schema."""
    if not folder.exists():
        raise fail(f"{folder} does not exist")
    if not folder.is_dir():
        raise fail(f"{folder} is not a folder")
    path = folder / "metadata.json"
    if not path.exists():
        raise fail(f"{path} does not exist: not a benchbatch result folder")
    from benchbatch.core.inputs import read_json

    try:
        meta = read_json(path, ARGUMENT)
    except UserError as e:
        raise fail(f"{path} is corrupt: {e.message.removeprefix(str(path)).lstrip(': ')}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("command"), str):
        raise fail(f"{path} is corrupt: no 'command' (not written by benchbatch)")
    version = meta.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in KNOWN_SCHEMAS:
        known = ", ".join(str(v) for v in sorted(KNOWN_SCHEMAS))
        raise fail(f"{path} has schema_version {_text(version)}; this benchbatch reads {known}")
    if meta["command"] not in KINDS:
        kinds = ", ".join(KINDS)
        raise fail(f"{path}: a {_text(repr(meta['command']))} run; compare reads {kinds} folders")
    return meta


def read_table(folder: Path, table: str) -> pd.DataFrame:
    """One CSV of a run folder, with the columns compare needs, numbers where numbers go."""
    import io

    from benchbatch.core.inputs import cut_short, read_bytes

    path = folder / f"{table}.csv"
    if not path.exists():
        raise fail(f"{path} does not exist (the run wrote no {table} rows)")
    data = read_bytes(path, ARGUMENT).removeprefix(b"\xef\xbb\xbf")
    try:
        text = {c: str for c in TEXT.get(table, ())}
        df = pd.read_csv(io.BytesIO(data), index_col=False, dtype=text)
    except (UnicodeDecodeError, ValueError) as e:  # pandas' parse errors are ValueErrors
        raise fail(f"{path} is corrupt: {_first_line(e)}") from None
    cut = cut_short(data)
    if cut:  # its last row's last fields would read as empty cells: a step not measured
        raise fail(f"{path} is corrupt: {cut}")
    missing = [col for col in COLUMNS[table] if col not in df.columns]
    if missing:
        raise fail(f"{path} is corrupt: no column {', '.join(missing)}")
    if df.empty:
        raise fail(f"{path} is corrupt: no rows")
    for col in COLUMNS[table]:
        df[col] = _numbers(df[col], path, col) if col in NUMERIC else _words(df[col])
    for col in SPREAD:  # the ranges conclusions carry; older results have none
        if col in df.columns and table in ("phases", "sweep"):
            df[col] = _numbers(df[col], path, col)
    return df


# Each step's spread, read where a table has it (a conclusion's range, compare.conclusions).
SPREAD = ("step_ms_p10", "step_ms_p90")

# Every number compare reads (times, rates, counts, fractions) is positive and far below this.
MAX_VALUE = 1e15


def _numbers(column: pd.Series, path: Path, col: str) -> pd.Series:
    """A column of numbers in [0, MAX_VALUE], an empty cell NaN (a row not measured)."""
    numbers = numeric(column)
    if (numbers.isna() & column.notna()).any():
        raise fail(f"{path} is corrupt: column {col} holds something other than numbers")
    allowed = numbers.between(0, MAX_VALUE)
    if col in UNBOUNDED:  # inf: the 'max' point, everything queued at once
        allowed |= numbers == math.inf
    if (~allowed & numbers.notna()).any():
        raise fail(f"{path} is corrupt: column {col} holds a number outside [0, {MAX_VALUE:g}]")
    return numbers


def _words(column: pd.Series) -> pd.Series:
    """A column of names (label, status, policy): text, an empty cell ''."""
    return column.map(lambda v: "" if isinstance(v, float) and math.isnan(v) else str(v))


def _first_line(e: Exception) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def load(folder: Path, label: str) -> RunData:
    if folder.suffix.lower() in (".json", ".jsonl") and not folder.is_dir():
        return load_peer(folder, label)
    meta = read_metadata(folder)
    kind = meta["command"]
    required, optional = KINDS[kind]
    if meta.get("status") != "complete":  # cut short: the tables it wrote, however few
        tables = {t: read_table(folder, t) for t in (*required, *optional) if _rows_in(folder, t)}
        if not tables:
            raise fail(f"{folder} holds no rows to compare (the run was {meta.get('status')} "
                       "before its first)")  # fmt: skip
        return RunData(label, folder, kind, meta, tables)
    tables = {t: read_table(folder, t) for t in required}
    tables |= {t: read_table(folder, t) for t in optional if (folder / f"{t}.csv").exists()}
    return RunData(label, folder, kind, meta, tables)


def _rows_in(folder: Path, table: str) -> bool:
    """The table's CSV is there with a row past its header (an unfinished run's may not)."""
    try:
        with (folder / f"{table}.csv").open("rb") as f:
            return sum(1 for line in f if line.strip()) > 1
    except OSError:
        return False


def load_peer(path: Path, label: str) -> RunData:
    """A serving benchmark's saved result as a serve-sweep run: vLLM bench serve's
    --save-result (--save-detailed) JSON or GuideLLM's JSON report, every metric
    recomputed from its per-request times with benchbatch's code (core/peers/); the
    recomputation beside the peer's own aggregates is the run's peer_check table."""
    from benchbatch.core import peers

    rows, checked = peers.read_all([path], "RUN_DIR")
    serve = pd.DataFrame(rows).rename(columns={"run": "peer_run"})
    sources = ", ".join(sorted({str(s) for s in serve.get("source", [])})) or "peer"
    meta = {
        "command": "serve-sweep",
        "status": "complete",
        "environment": {"device_name": f"{sources} ({path.name})", "dtype": "-"},
        "config": {"name": "the peer's model"},
        "peer": {"file": str(path), "disagreements": len(peers.disagreements(checked))},
    }
    tables = {"serve": serve, "peer_check": pd.DataFrame(checked)}
    return RunData(label, path, "serve-sweep", meta, tables)


def _same(folder: Path) -> Path:
    try:
        return folder.resolve()
    except (OSError, RuntimeError):  # a symlink loop: its own text, then
        return folder.absolute()


def check_out(out: Path | None, folders: list[Path]) -> None:
    """compare --out is never one of the folders it reads, nor inside one (a result folder
    keeps the files its run wrote, and a later compare would find a stranger there): their
    files stay as they were."""
    if out is None:
        return
    target = _same(out)
    for folder in folders:
        if target == _same(folder):
            raise UserError("--out", f"{out} is one of the folders compared: choose another")
        if _same(folder) in target.parents:
            raise UserError("--out", f"{out} is inside {folder}, one of the folders compared: "
                            "choose a folder outside it")  # fmt: skip


def labels(folders: list[Path], given: str | None) -> list[str]:
    """--label's names, else each folder's name (with its parent when two names clash)."""
    if given is not None:
        names = [name.strip() for name in given.split(",")]
        if len(names) != len(folders) or not all(names):
            raise UserError(
                "--label",
                f"give {len(folders)} non-empty labels, one per folder; got {given[:80]!r}",
            )
    else:
        names = [_same(f).name or str(f) for f in folders]
        if len(set(names)) < len(names):
            names = [f"{_same(f).parent.name}/{_same(f).name}" for f in folders]
    if len(set(names)) < len(names):
        raise UserError("--label", f"labels must differ: {', '.join(names)}")
    return names


def load_all(folders: list[Path], given_labels: str | None = None) -> list[RunData]:
    """Every folder loaded and checked to be of one kind."""
    if len(folders) < 2:
        raise fail("give at least two result folders to compare")
    seen: dict[Path, Path] = {}
    for folder in folders:
        first = seen.setdefault(_same(folder), folder)
        if first is not folder and given_labels is None:
            raise fail(
                f"the same folder was given twice ({first} and {folder}): give two different "
                "runs, or --label to compare a run with itself"
            )
    names = labels(folders, given_labels)
    runs = [load(folder, name) for folder, name in zip(folders, names, strict=True)]
    kinds = {r.kind for r in runs}
    if len(kinds) > 1:
        which = ", ".join(f"{r.folder} is {r.kind}" for r in runs)
        raise fail(f"folders of different kinds ({which}): compare runs of one command")
    return runs


def merge(runs: list[RunData]) -> dict[str, pd.DataFrame]:
    """One DataFrame per table any run has, rows of every run, `run` the first column."""
    out = {}
    for table in TABLE_ORDER:
        frames = [r.tables[table].assign(run=r.label) for r in runs if table in r.tables]
        if frames:
            df = pd.concat(frames, ignore_index=True)
            out[table] = df[["run", *(c for c in df.columns if c != "run")]]
    return out


def first_seed(occupancy: pd.DataFrame) -> pd.DataFrame:
    """occupancy rows of each run's first seed (an occupancy run may simulate several)."""
    if "seed" not in occupancy.columns:
        return occupancy
    keep = []
    for _, rows in occupancy.groupby("run", sort=False):
        seeds = rows["seed"].dropna()
        keep.append(rows if seeds.empty else rows[rows["seed"] == seeds.iloc[0]])
    return pd.concat(keep)


def pivot(
    df: pd.DataFrame, index: list[str], value: str, runs: list[str], missing: str | None = None
) -> pd.DataFrame:
    """value per index (rows, in first-seen order) and run (columns, in the given order).
    missing: the text of a row whose value is empty (the SLO table's "none": a run that has
    the row but never met the SLO), kept apart from a row the run does not have (NaN);
    None: an empty value is no value."""
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    if missing is not None:
        ok = ok.assign(**{value: ok[value].astype(object).where(ok[value].notna(), missing)})
    table = ok.pivot_table(index=index, columns="run", values=value, aggfunc="first", sort=False)
    return table.reindex(columns=[r for r in runs if r in table.columns])


def phases_steps(df: pd.DataFrame) -> pd.DataFrame:
    """phases rows with a `step` column naming what was measured: the label, and for a
    decode step its context where the runs decoded at more than one (decode b=1 at 32
    and at 64 are different steps: never one row, one bar or one ratio). A table without
    contexts (an older run's) keeps its labels."""
    if "context" not in df.columns:
        return df.assign(step=df["label"])
    decode = df["phase"] == "decode"
    contexts = numeric(df.loc[decode, "context"]).dropna().unique()
    if len(contexts) <= 1:
        return df.assign(step=df["label"])
    named = df["label"] + ", context " + numeric(df["context"]).map(
        lambda c: f"{int(c):,}" if c == c else "?")  # fmt: skip
    return df.assign(step=named.where(decode, df["label"]))


def ratio(a: float, b: float) -> float:
    """b over a, NaN when either is missing (or not a number: "none") or a is zero."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
    if not numbers or not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return math.nan
    return b / a
