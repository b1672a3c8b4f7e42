"""Run folders and the files in them: never overwritten silently, always written whole.

Every file is written to a temporary name and renamed into place, so a run stopped at any
moment leaves either the previous complete file or the new complete one. Under torchrun only
rank 0 writes (distributed.is_writer): the other ranks run the same code and write nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchbatch.core.ranks import is_writer
from benchbatch.errors import UserError, WriteFailed

SCHEMA_VERSION = 1
DEFAULT_ROOT = Path("results")


def utc_stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%SZ")


def run_dir(out: Path | None, command: str, force: bool = False, keep=()) -> Path:
    """The folder a run writes to: --out, or a new results/<UTC time>-<command>/. With
    --force, a previous run of the same command in --out is replaced (the files its
    metadata.json lists removed, never one of `keep`, this run's own input files), a run of
    another command refused: a folder never holds two runs' files, and nothing else in it
    is touched. Made and checked by rank 0 alone (the others learn its name from it)."""
    if not is_writer():
        return out if out is not None else DEFAULT_ROOT / f"{utc_stamp()}-{command}"
    if out is None:
        return _claim_fresh(DEFAULT_ROOT / f"{utc_stamp()}-{command}")
    check_out(out, command, force)
    _WRITTEN.pop(_resolved(out), None)  # a new run: the files it writes are its own
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError("--out", f"cannot write to {out}: {e.strerror or e}") from None
    if force:
        clear_previous_run(out, keep)
    return out


def check_out(out: Path, command: str, force: bool) -> None:
    """--out may be written to: not a file, empty unless --force, and with --force holding
    nothing but a previous run of the same command (or no run at all)."""
    from benchbatch.core.inputs import check_path

    check_path(out, "--out")
    try:
        if out.exists() and not out.is_dir():
            raise UserError("--out", f"{out} exists and is not a folder")
        empty = not out.is_dir() or not any(out.iterdir())
    except OSError as e:
        raise UserError("--out", f"cannot read {out}: {e.strerror or e}") from None
    if empty:
        return
    if not force:
        raise UserError("--out", f"{out} is not empty; choose another folder or pass --force")
    previous = previous_command(out)
    if previous is not None and previous != command:
        raise UserError(
            "--force",
            f"{out} holds a {previous} run; --force replaces only a previous {command} run, so "
            "that one command's files never sit beside another's: choose another folder",
        )


def previous_command(folder: Path) -> str | None:
    """The command of the run a folder holds (its metadata.json), None if it holds none."""
    meta = folder / "metadata.json"
    if not meta.exists():
        return None
    from benchbatch.core.inputs import read_json

    try:
        value = read_json(meta, "--out")
    except UserError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("command"), str):
        raise UserError("--force", f"{meta} was not written by benchbatch: choose another folder")
    files = value.get("written_files")
    if not (isinstance(files, list) and all(isinstance(f, str) for f in files)):
        raise UserError(
            "--force",
            f"{meta} does not list the files its run wrote (an older benchbatch's run): remove "
            "them yourself or choose another folder",
        )
    return value["command"]


def previous_files(folder: Path) -> list[str]:
    """The files the run a folder holds wrote, as its metadata.json lists them (check_out
    has checked the list), plain names in this folder only."""
    from benchbatch.core.inputs import read_json

    listed = read_json(folder / "metadata.json", "--out")["written_files"]
    return [n for n in listed if n == Path(n).name and n not in ("", ".", "..")]


def clear_previous_run(folder: Path, keep=()) -> list[str]:
    """Remove the files the run a folder holds wrote (same command: check_out said so), its
    metadata.json and what its writes left halfway; never a file in `keep` (this run's
    inputs, a --trace written by the last run, say), and nothing else in the folder."""
    if previous_command(folder) is None:
        return remove_temporaries(folder)
    kept = {_resolved(Path(p)) for p in keep}
    removed = []
    for name in [*previous_files(folder), "metadata.json"]:
        path = folder / name
        if path.is_file() and not path.is_symlink() and _resolved(path) not in kept:
            path.unlink(missing_ok=True)
            removed.append(name)
    return removed + remove_temporaries(folder)


def _resolved(path: Path) -> str:
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # a loop of links, a name too long: compared as given
        return str(path.absolute())


# The files written into each run folder by this process (atomic_write_bytes notes them):
# a run's metadata.json lists its own, so --force later removes exactly those.
_WRITTEN: dict[str, set[str]] = {}


def written_in(folder: Path) -> list[str]:
    return sorted(_WRITTEN.get(_resolved(folder), ()))


def _claim_fresh(path: Path) -> Path:
    """Create the first of path, path-2, path-3, ... that does not exist yet. mkdir either
    creates a folder or fails, so two runs started in the same second never share one."""
    candidate, n = path, 2
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            candidate, n = path.with_name(f"{path.name}-{n}"), n + 1
        except OSError as e:
            raise UserError("--out", f"cannot write to {candidate}: {e.strerror or e}") from None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write under a temporary name, then rename into place: a reader sees the old file or
    the new one, never half of one. The file gets the usual permissions (0666 less the
    umask, as open() gives, not mkstemp's 0600). A write that fails (a full disk, a file
    size limit, a folder gone read-only) removes the temporary file and raises WriteFailed,
    which names the file and the bytes it needed. Under torchrun rank 0 alone writes."""
    if not is_writer():
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise WriteFailed(path, len(data), e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
        os.replace(tmp, path)
        _WRITTEN.setdefault(_resolved(path.parent), set()).add(path.name)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise WriteFailed(path, len(data), e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def is_temporary(path: Path) -> bool:
    """A file this module or the plots write before renaming it into place."""
    name = path.name
    return name.startswith(".") and (".tmp" in name or name.startswith(".write-test-"))


def remove_temporaries(folder: Path) -> list[str]:
    """Delete what a write stopped halfway (by Ctrl-C, say) left behind; return the names."""
    removed = []
    if not is_writer():  # another rank's temporary files may be the writer's, mid-write
        return removed
    try:
        paths = list(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        return removed
    for path in paths:
        try:
            if path.is_file() and is_temporary(path):
                path.unlink(missing_ok=True)
                removed.append(path.name)
        except OSError:
            pass
    return removed


def write_csv(path: Path, rows) -> None:
    """Rows (a list of dicts) or a pandas DataFrame, written whole under a temporary name."""
    atomic_write_text(path, csv_text(rows))


def csv_text(rows) -> str:
    """The CSV text of rows: real numbers at full precision (the shortest text that reads
    back as the same float: raw times are data, rounded only for display; 6 digits lost
    1e-4 s of an arrival at t = 50 s), and integers as integers, also in a column that
    pandas holds as floats because some rows have none (a skipped row's count): 1024, never
    1024.0 or 1.024e+03."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    counts = {c: "Int64" for c in frame.columns if _whole_numbers(frame[c])}
    if counts:
        frame = frame.astype(counts)
    return frame.to_csv(index=False, float_format=None)


def _whole_numbers(column) -> bool:
    """A float column whose values (NaN aside) are all integers a float holds exactly."""
    import numpy as np

    if column.dtype.kind != "f":
        return False
    values = column.to_numpy()
    finite = values[np.isfinite(values)]
    if len(finite) < len(values) - int(np.isnan(values).sum()):  # an infinity
        return False
    return bool(len(finite)) and bool((np.abs(finite) < 2**53).all() and (finite % 1 == 0).all())


def write_json(path: Path, obj) -> None:
    """obj as JSON (json_text), written whole."""
    atomic_write_text(path, json_text(obj) + "\n")


def json_text(obj) -> str:
    """obj as JSON, as result.json and --json both write it: NaN and infinity as null, a
    number numpy made (an int64, a bool_) as Python's."""
    return json.dumps(json_safe(obj), indent=2, sort_keys=False, default=_plain_json)


def json_safe(obj):
    """JSON has no NaN or infinity: write null, as pandas reads it back."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


RESULT_FILE = "result.json"


def result_document(meta: dict, metrics: dict | None, error: str | None, files) -> dict:
    """result.json's content (as vLLM's --save-result): what ran (command, options), when,
    on what machine and device, whether it completed, the headline metrics (the command's
    --json document) and the files of the run."""
    env = meta.get("environment") if isinstance(meta.get("environment"), dict) else {}
    status = meta.get("status")
    doc = {
        "schema_version": meta.get("schema_version", SCHEMA_VERSION),
        "command": meta.get("command"),
        "command_line": meta.get("command_line"),
        "complete": status == "complete",
        "status": status,
        "started_utc": meta.get("started_utc"),
        "finished_utc": meta.get("finished_utc"),
        "benchbatch_version": env.get("benchbatch_version"),
        "git_commit": env.get("git_commit"),
        "machine": {
            k: env.get(k) for k in ("platform", "python", "torch_version", "cpu", "load_average")
        },  # fmt: skip
        "load_average_after": meta.get("load_average_after"),
        "device": {k: env.get(k) for k in ("device", "device_name", "dtype", "torch_cuda")},
        "model": meta.get("config"),
        "options": meta.get("options"),
        "metrics": metrics,
        "files": sorted(files),
    }
    if meta.get("warnings"):  # every warning the run said (output/recorder.py)
        doc["warnings"] = list(meta["warnings"])
    if error is not None:
        doc["metrics_error"] = error  # the run ended before its metrics could be made
    if meta.get("error"):
        doc["error"] = meta["error"]
    return doc


def write_result(folder: Path, meta: dict, metrics: dict | None, error: str | None = None):
    """result.json in the run's folder, written whole (atomic), listing itself among the
    run's files: metadata.json's next write lists it too, so --force later replaces it and
    a plain --out never overwrites it."""
    files = {*written_in(folder), "metadata.json", RESULT_FILE}
    write_json(folder / RESULT_FILE, result_document(meta, metrics, error, files))


def _plain_json(value):
    """A number numpy made (an int64, a bool_) as Python's; anything else as its text."""
    if hasattr(value, "item"):
        return json_safe(value.item())
    if isinstance(value, Path):
        return str(value)
    return str(value)


def git_commit() -> str | None:
    """The checkout's commit when benchbatch runs from one (with a + if it has changes)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def command_line() -> str:
    """The command as typed: `python -m benchbatch` (argv[0] its __main__.py) said as
    benchbatch, the name the installed script has."""
    name = Path(sys.argv[0]).name
    return " ".join(["benchbatch" if name == "__main__.py" else name, *sys.argv[1:]])


def write_trace(path: str | Path, requests) -> None:
    """The requests as a CSV trace (core/workload.py's trace_text), written whole or not at
    all, for `occupancy --trace` to replay."""
    from benchbatch.core.trace import trace_text

    atomic_write_text(Path(path), trace_text(requests))
