"""A calibration on the engine thread's CPU clock beside its wall clock: the steps' work
whatever the load (other processes' turns on the core do not stretch it), and the share of
the time the engine held its core."""

from __future__ import annotations

import math
from collections.abc import Sequence

from benchbatch.core.calibration import fit, step_kind


def on_cpu_clock(rows: Sequence[dict]) -> list[dict] | None:
    """The steps on the engine thread's CPU clock: cpu_ms as step_ms and gap_cpu_ms as
    gap_ms (runtime/engine.py records both with one compute thread), the work a core did
    for each step and the loop between steps, which other processes' turns on the core do
    not stretch. None where a step has no CPU time (an endpoint's, an older calibration's)."""
    out = []
    for r in rows:
        cpu = r.get("cpu_ms", math.nan)
        if not isinstance(cpu, (int, float)) or not cpu == cpu:
            return None
        out.append({**r, "step_ms": cpu, "gap_ms": r.get("gap_cpu_ms", math.nan)})
    return out or None


def core_share(rows: Sequence[dict]) -> float:
    """The share of their wall time the steps (and the gaps between them) held a core: their
    CPU time over their wall time; 1 on a quiet machine. NaN without CPU times."""
    cpu = wall = 0.0
    for r in rows:
        c, w = r.get("cpu_ms", math.nan), r["step_ms"]
        if not c == c:
            return math.nan
        gap, gap_cpu = r.get("gap_ms", math.nan), r.get("gap_cpu_ms", math.nan)
        both = gap == gap and gap_cpu == gap_cpu
        cpu += c + (gap_cpu if both else 0.0)
        wall += w + (gap if both else 0.0)
    return min(1.0, cpu / wall) if wall > 0 else math.nan


def with_cpu_clock(out: dict, rows: Sequence[dict], option: str = "--step-costs") -> dict:
    """A fit (fit's result) with the same steps fitted again on the CPU clock: "cpu_model",
    and the summary's "cpu_clock" (its coefficients, errors, kinds, host gap, and the core
    share the steps had). The wall-clock fit prices the engine as it ran, the machine's load
    included; the CPU clock's, the device's own steps. Unchanged without CPU times."""
    steps = [r for r in rows if r["step_ms"] > 0 and step_kind(r) != "idle"]
    cpu_rows = on_cpu_clock(steps)
    if cpu_rows is None:
        return out
    cpu = fit(cpu_rows, option)
    keep = ("coefficients_s", "std_errors_s", "kinds", "host_gap_ms", "median_abs_error",
            "p90_abs_error", "row_block", "wake_ms", "wake_power")  # fmt: skip
    clock = {k: cpu["summary"][k] for k in keep} | {"core_share": core_share(steps)}
    if "wake" in cpu["summary"]:  # its fit of the steps after an idle wait (core/wake.py)
        clock["wake"] = cpu["summary"]["wake"]
    return out | {"cpu_model": cpu["model"], "summary": out["summary"] | {"cpu_clock": clock}}


def at_share(cost, cpu_cost, share: float):
    """The step costs of a simulation beside a real run: the calibration's CPU-clock step
    costs over the share of the core the engine held while it ran (its steps' CPU time over
    their wall time): the device's work at the load the run had, which another process's
    turns on the core change from run to run. `cost` (the wall-clock fit, the calibration's
    load) where the calibration has no CPU clock or the run no core share (a GPU, several
    threads)."""
    if cpu_cost is None or not (share == share and share > 0):
        return cost
    return cpu_cost.scaled(1.0 / share)
