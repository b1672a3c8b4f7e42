"""What the benchmark scripts share, torch-free so `--help` and bad arguments stay quick:
argument types that give one clear error line (argparse's exit 2, never a traceback),
results never overwritten silently (a non-empty --out refused without --force), the
machine, threads and load average for each JSON line, and a child command whose failure
says why (its own last error line) instead of a bare CalledProcessError.

Imported by scripts/*.py as `script_common` (a script's own folder is on sys.path)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from benchbatch.core.machine import cpu_model, load_average


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number above 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a number above 0, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1 (`1,32,128`)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"comma-separated whole numbers of at least 1, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"comma-separated whole numbers of at least 1, got {text!r}"
        )
    return values


def fresh_folder(parser: argparse.ArgumentParser, path: Path, force: bool, flag: str = "--out"
                 ) -> Path:  # fmt: skip
    """path, refused (parser.error) where it is a file or a folder with something in it,
    unless force: an earlier run's results are never overwritten silently."""
    if path.exists() and not path.is_dir():
        parser.error(f"{flag}: {path} is a file; choose a folder")
    if path.is_dir() and any(path.iterdir()) and not force:
        parser.error(f"{flag}: {path} is not empty; choose another folder or pass --force")
    return path


def new_name(path: Path) -> Path:
    """path where nothing is there yet, else the first free `stem-2.suffix`, `stem-3...`."""
    n = 2
    found = path
    while found.exists():
        found = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return found


def machine(threads: int | None = None) -> dict:
    """The machine a measurement ran on: CPU, logical CPUs, the threads the measurement
    used (None: not one setting) and the 1, 5 and 15-minute load average now."""
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "threads": threads,
            "load": load_average()}  # fmt: skip


def load_now() -> float:
    """The 1-minute load average (NaN where the system has none)."""
    load = load_average()
    return load[0] if load else float("nan")


def load_line(before: float) -> str:
    """'load 1.23 before, 1.37 after': the 1-minute load average before a run and now."""
    return f"load {before:.2f} before, {load_now():.2f} after"


def run_child(cmd: list[str], what: str, stdout=subprocess.DEVNULL, **kwargs
              ) -> subprocess.CompletedProcess:  # fmt: skip
    """Run cmd; where it fails, stop with one line saying what failed and the child's own
    last line on stderr (e.g. serve-sweep's "--out: ... is not empty")."""
    done = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, **kwargs)
    if done.returncode != 0:
        lines = [s for s in (done.stderr or "").splitlines() if s.strip()]
        why = lines[-1].strip() if lines else "no message"
        raise SystemExit(f"{Path(sys.argv[0]).name}: {what} failed (exit {done.returncode}): "
                         f"{why}")  # fmt: skip
    return done
