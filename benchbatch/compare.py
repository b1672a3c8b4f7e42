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

from benchbatch.errors import UserError
from benchbatch.results import SCHEMA_VERSION

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
TABLE_ORDER = ("probe", "phases", "sweep", "occupancy", "engine", "serve", "slo")


@dataclass
class RunData:
    label: str
    folder: Path
    kind: str
    meta: dict
    tables: dict[str, pd.DataFrame]

    def describe(self) -> dict:
        """Who is who in a comparison: label, kind, device, dtype, model, status."""
        env = self.meta.get("environment") or {}
        cfg = self.meta.get("config") or {}
        model = cfg.get("name", "-")
        if cfg.get("hidden"):
            model += f" ({cfg['hidden']} x {cfg.get('layers', '?')})"
        options = self.meta.get("options") or {}
        return {
            "run": self.label,
            "kind": self.kind,
            "device": env.get("device_name", "-"),
            "dtype": env.get("dtype", "-"),
            "model": model,
            "cuda_graphs": options.get("cuda_graphs"),
            "status": self.meta.get("status", "-"),
            "folder": str(self.folder),
        }


def fail(message: str) -> UserError:
    return UserError(ARGUMENT, message)


def read_metadata(folder: Path) -> dict:
    """A run folder's metadata.json, checked: a dict with a command and a known schema."""
    if not folder.exists():
        raise fail(f"{folder} does not exist")
    if not folder.is_dir():
        raise fail(f"{folder} is not a folder")
    path = folder / "metadata.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise fail(f"{path} does not exist: not a benchbatch result folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise fail(f"{path} is corrupt: {_first_line(e)}") from None
    if not isinstance(meta, dict) or "command" not in meta:
        raise fail(f"{path} is corrupt: no 'command' (not written by benchbatch)")
    version = meta.get("schema_version")
    if version not in KNOWN_SCHEMAS:
        known = ", ".join(str(v) for v in sorted(KNOWN_SCHEMAS))
        raise fail(f"{path} has schema_version {version!r}; this benchbatch reads {known}")
    if meta["command"] not in KINDS:
        raise fail(f"{path}: a {meta['command']!r} run; compare reads {', '.join(KINDS)} folders")
    return meta


def read_table(folder: Path, table: str) -> pd.DataFrame:
    """One CSV of a run folder, with the columns compare needs, numbers where numbers go."""
    path = folder / f"{table}.csv"
    try:
        df = pd.read_csv(path, dtype={c: str for c in TEXT.get(table, ())})
    except FileNotFoundError:
        raise fail(f"{path} does not exist (the run wrote no {table} rows)") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise fail(f"{path} is corrupt: {_first_line(e)}") from None
    missing = [col for col in COLUMNS[table] if col not in df.columns]
    if missing:
        raise fail(f"{path} is corrupt: no column {', '.join(missing)}")
    if df.empty:
        raise fail(f"{path} is corrupt: no rows")
    for col in (c for c in COLUMNS[table] if c in NUMERIC):
        numbers = pd.to_numeric(df[col], errors="coerce")
        if (numbers.isna() & df[col].notna()).any():
            raise fail(f"{path} is corrupt: column {col} holds something other than numbers")
        df[col] = numbers
    return df


def _first_line(e: Exception) -> str:
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


def load(folder: Path, label: str) -> RunData:
    meta = read_metadata(folder)
    kind = meta["command"]
    required, optional = KINDS[kind]
    tables = {t: read_table(folder, t) for t in required}
    tables |= {t: read_table(folder, t) for t in optional if (folder / f"{t}.csv").exists()}
    return RunData(label, folder, kind, meta, tables)


def labels(folders: list[Path], given: str | None) -> list[str]:
    """--label's names, else each folder's name (with its parent when two names clash)."""
    if given is not None:
        names = [name.strip() for name in given.split(",")]
        if len(names) != len(folders) or not all(names):
            raise UserError(
                "--label", f"give {len(folders)} non-empty labels, one per folder; got {given!r}"
            )
    else:
        names = [f.resolve().name or str(f) for f in folders]
        if len(set(names)) < len(names):
            names = [f"{f.resolve().parent.name}/{f.resolve().name}" for f in folders]
    if len(set(names)) < len(names):
        raise UserError("--label", f"labels must differ: {', '.join(names)}")
    return names


def load_all(folders: list[Path], given_labels: str | None = None) -> list[RunData]:
    """Every folder loaded and checked to be of one kind."""
    if len(folders) < 2:
        raise fail("give at least two result folders to compare")
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


def pivot(df: pd.DataFrame, index: list[str], value: str, runs: list[str]) -> pd.DataFrame:
    """value per index (rows, in first-seen order) and run (columns, in the given order)."""
    ok = df[df["status"] == "ok"] if "status" in df.columns else df
    table = ok.pivot_table(index=index, columns="run", values=value, aggfunc="first", sort=False)
    return table.reindex(columns=[r for r in runs if r in table.columns])


def ratio(a: float, b: float) -> float:
    """b over a, NaN when either is missing or a is zero."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return math.nan
    return b / a
