"""Run folders and the files in them: never overwritten silently, always written whole.

Every file is written to a temporary name and renamed into place, so a run stopped at any
moment leaves either the previous complete file or the new complete one.
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

from benchbatch.errors import UserError

SCHEMA_VERSION = 1
DEFAULT_ROOT = Path("results")


def utc_stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%SZ")


def run_dir(out: Path | None, command: str, force: bool = False) -> Path:
    """The folder a run writes to: --out, or a new results/<UTC time>-<command>/."""
    if out is None:
        out = _claim_fresh(DEFAULT_ROOT / f"{utc_stamp()}-{command}")
    elif out.exists() and not out.is_dir():
        raise UserError("--out", f"{out} exists and is not a folder")
    elif out.is_dir() and any(out.iterdir()) and not force:
        raise UserError("--out", f"{out} is not empty; choose another folder or pass --force")
    _make_writable(out)
    return out


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
        except OSError:
            return candidate  # _make_writable names the problem


def _make_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise UserError("--out", f"cannot write to {path}: {e.strerror or e}") from None


def atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_temporary(path: Path) -> bool:
    """A file this module or the plots write before renaming it into place."""
    name = path.name
    return name.startswith(".") and (".tmp" in name or name.startswith(".write-test-"))


def remove_temporaries(folder: Path) -> list[str]:
    """Delete what a write stopped halfway (by Ctrl-C, say) left behind; return the names."""
    removed = []
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.is_file() and is_temporary(path):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


SIGNIFICANT_DIGITS = 6  # a measured time is good to a few percent: 6 digits keep every one


def write_csv(path: Path, rows) -> None:
    """Rows (a list of dicts) or a pandas DataFrame, written whole under a temporary name."""
    atomic_write_text(path, csv_text(rows))


def csv_text(rows) -> str:
    """The CSV text of rows: real numbers to SIGNIFICANT_DIGITS significant digits, and
    integers as integers, also in a column that pandas holds as floats because some rows
    have none (a skipped row's count): 1024, never 1024.0 or 1.024e+03."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    counts = {c: "Int64" for c in frame.columns if _whole_numbers(frame[c])}
    if counts:
        frame = frame.astype(counts)
    return frame.to_csv(index=False, float_format=f"%.{SIGNIFICANT_DIGITS}g")


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
    atomic_write_text(path, json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n")


def json_safe(obj):
    """JSON has no NaN or infinity: write null, as pandas reads it back."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


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
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
