"""The latest measured ceilings of each device, kept between runs (no torch here).

Every command that places steps on the roofline needs the device's ceilings. Measured anew
by each command, they differ from run to run on a shared machine (another process during
the probe), and the same step comes out compute-bound in one command and memory-bound in
the next. So the probe rows of the latest measurement of a device in a dtype, with the torch
build that ran them (a new torch brings new kernels), are kept in the user's cache folder
and reused while recent: one set of ceilings for every command run on that machine that
day, stated in the output with its age. `--reprobe` measures again; `benchbatch probe` and
`reproduce` always measure, and their probe becomes the latest.

Only a probe worth reusing is kept: one measured whole (not interrupted) with no noisy row
(core/noise.py's rule), since a bad probe reused for a day misplaces every later row (issue
28: an interrupted probe with three noisy rows of four made decode "compute"-bound). The key
holds what changes the ceilings: the device, the dtype, the torch build, the benchbatch
version, the host (a fingerprint of its name), the compute threads, the load level (quiet,
busy or saturated: core/machine.py's load_level) and, on a CPU, the clock its steps were
timed on: a probe from another load, version, host, thread count or clock is measured again.

A cache that cannot be read or written is no cache: the command measures, as without one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.units import duration

MAX_AGE_S = 24 * 3600  # a probe older than a day is measured again
FILE = "ceilings.json"
ENV = "BENCHBATCH_CACHE_DIR"


def folder() -> Path:
    """$BENCHBATCH_CACHE_DIR, else $XDG_CACHE_HOME/benchbatch, else ~/.cache/benchbatch."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "benchbatch"


def key(device_name: str, dtype: str, torch_version: str | None, threads: int | None = None,
        load: str = "unknown", clock: str | None = None, benchbatch: str | None = None,
        host: str | None = None) -> str:  # fmt: skip
    """The cache's key: a probe is reused only under every one of these alike (load: the
    load level, quiet, busy, saturated or unknown; clock: a CPU probe's, "cpu" or "wall":
    runtime/backend.py's HostTimer; benchbatch: its version, whose probe may measure
    otherwise; host: saved_calibration.host_id's fingerprint, as another machine of the
    same device has other ceilings). A key without a field another holds never matches
    it: entries kept before benchbatch and host were in the key are never reused."""
    tail = "" if clock is None else f" | clock {clock}"
    head = f"{device_name} | {dtype} | torch {torch_version}"
    if benchbatch is not None:
        head += f" | benchbatch {benchbatch}"
    if host is not None:
        head += f" | host {host}"
    return f"{head} | threads {threads} | load {load}{tail}"


def noisy_rows(rows: list[dict]) -> list[str]:
    """The measured rows too spread to trust (noisy, or a CV over core/noise.py's threshold),
    or whose spread is unknown (one repeat: its CV of 0 measures nothing)."""
    from benchbatch.core.noise import DEFAULT_CV_THRESHOLD

    def noisy(r: dict) -> bool:
        cv = _number(r.get("cv"))
        return r.get("noisy") in (True, "True", "true") or _single(r) or (
            cv is not None and cv > DEFAULT_CV_THRESHOLD
        )

    return [str(r.get("label")) for r in rows if r.get("status", "ok") == "ok" and noisy(r)]


def _single(row: dict) -> bool:
    """A row timed once (repeats under 2): no spread was measured."""
    repeats = _number(row.get("repeats"))
    return repeats is not None and repeats < 2


def noise(rows: list[dict]) -> float | None:
    """The largest coefficient of variation among the measured rows (None when none has one;
    a row timed once has none)."""
    cvs = [_number(r.get("cv")) for r in rows if r.get("status", "ok") == "ok" and not _single(r)]
    cvs = [cv for cv in cvs if cv is not None]
    return max(cvs) if cvs else None


def noise_text(rows: list[dict]) -> str:
    value = noise(rows)
    return "noise unknown" if value is None else f"noise {100 * value:.1f}%"


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if x == x and abs(x) != float("inf") else None


@dataclass(frozen=True)
class Cached:
    """A device's latest probe: its rows (as probe.csv holds them) and where it came from."""

    rows: list[dict]
    measured_utc: str
    age_s: float
    run: str  # the run folder that measured them
    path: Path  # the cache file

    def describe(self) -> str:
        return f"measured {duration(self.age_s)} ago by {self.run}, {noise_text(self.rows)}"

    def source(self) -> str:
        """Where the run's ceilings came from, as its table, plot and metadata name it."""
        return (
            f"cached from {self.run}, {self.measured_utc} ({duration(self.age_s)} ago), "
            f"{noise_text(self.rows)}"
        )


def load(name: str, max_age_s: float = MAX_AGE_S, now: dt.datetime | None = None):
    """The latest probe stored under `name` when younger than max_age_s, else None (and
    None for one with a noisy row: kept before noisy probes were refused)."""
    path = folder() / FILE
    entry = _read(path).get(name)
    if not isinstance(entry, dict) or not isinstance(entry.get("rows"), list):
        return None
    if not all(isinstance(r, dict) for r in entry["rows"]) or noisy_rows(entry["rows"]):
        return None
    try:
        when = dt.datetime.fromisoformat(entry["measured_utc"])
    except (KeyError, TypeError, ValueError):
        return None
    age = ((now or _now()) - when).total_seconds()
    if not 0 <= age <= max_age_s:
        return None
    return Cached(entry["rows"], entry["measured_utc"], age, str(entry.get("run")), path)


def save(name: str, rows: list[dict], run: Path | str, now: dt.datetime | None = None,
         complete: bool = True):  # fmt: skip
    """Keep `rows` as the latest probe under `name`; the cache file's path, or None when it
    is not kept: an incomplete probe (interrupted: complete False), one with a noisy row
    (the cache keeps what it held), or a cache that cannot be written (the run goes on:
    the rows are in its probe.csv anyway)."""
    from benchbatch.output.results import atomic_write_text, json_safe

    if not complete or not rows or noisy_rows(rows):
        return None
    path = folder() / FILE
    entries = _read(path)
    measured = (now or _now()).isoformat(timespec="seconds")
    entries[name] = {"measured_utc": measured, "run": str(run), "rows": json_safe(rows)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(entries, indent=1) + "\n")
    except OSError:
        return None
    return path


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)
