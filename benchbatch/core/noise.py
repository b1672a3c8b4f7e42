"""The one noise rule: when a timing is too spread to trust (no torch here).

Every table flags its rows by these thresholds, and every warning and verdict quotes them.
"""

from __future__ import annotations

import math

from benchbatch.core.units import figure

# Repeats of one step: a coefficient of variation (stdev / mean) above 10% makes the median
# hard to trust.
DEFAULT_CV_THRESHOLD = 0.10

# A run's steps of one kind barely differ: p90 over twice the median means another process
# took the device meanwhile (the real engine's steps, against their median or a cost model).
NOISY_P90_OVER_MEDIAN = 2.0

REPEATS_HINT = "try more --repeats or --min-time"


def same_work(static: dict, continuous: dict) -> bool:
    """Two policies' real runs that did the same work (as many steps, at the same occupancy:
    one request, or every slot filled alike): their wall times differ by the device's speed
    while each ran, not by batching."""
    try:
        steps = (float(static["total_steps"]), float(continuous["total_steps"]))
        used = (float(static["occupancy"]), float(continuous["occupancy"]))
    except (KeyError, TypeError, ValueError):
        return False
    return steps[0] == steps[1] and abs(used[0] - used[1]) <= 0.005


def noisy_hint(load: float | None, cores: int, threads: int | None = None) -> str:
    """What to try about noisy rows. On a machine whose load says other processes compete
    (the likely cause: issue 28 measured 2-10x slower steps at two threads under load),
    fewer threads and less other work first; more repeats only average the noise."""
    from benchbatch.core.machine import load_class

    if load_class(load, cores, own_threads=1) != "busy":
        if threads is not None and threads > 1:
            return f"{REPEATS_HINT}, or --threads 1 (one pinned thread measures best when shared)"
        return REPEATS_HINT
    if threads == 1:  # the run already measures as well as a shared machine allows
        return (
            f"the load average is {load:.1f} on {cores} physical cores, so other processes "
            "compete: close other work (this run already computes on one thread, "
            f"what measures best on a shared machine), then {REPEATS_HINT}"
        )
    return (
        f"the load average is {load:.1f} on {cores} physical cores, so other processes "
        "compete: close other work and run with --threads 1 (one pinned thread measures "
        f"best on a shared machine), then {REPEATS_HINT}"
    )


def time_ratio_range(ratio: float, over: dict, under: dict) -> tuple[float, float]:
    """The range of a ratio proportional to `over`'s step time over `under`'s (both timed
    rows: step_ms the median, step_ms_p10/_p90 their repeats' spread), with each row
    anywhere in its p10-p90: the ratio a conclusion states, with the noise its steps carry.
    NaN where a row has no spread."""
    try:
        up = over["step_ms_p90"] / over["step_ms"], under["step_ms"] / under["step_ms_p10"]
        down = over["step_ms_p10"] / over["step_ms"], under["step_ms"] / under["step_ms_p90"]
    except (KeyError, TypeError, ZeroDivisionError):
        return math.nan, math.nan
    low, high = ratio * down[0] * down[1], ratio * up[0] * up[1]
    if not (math.isfinite(low) and math.isfinite(high)):
        return math.nan, math.nan
    return low, high


def span_text(low: float, high: float) -> str:
    """'x4.12-x9.2', or '' without a range."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""

    def x(v: float) -> str:
        return f"x{figure(v)}"

    return f"{x(low)}-{x(high)}"


def range_text(low: float, high: float) -> str:
    """' (x4.12-x9.2 across the steps' p10-p90)', or '' without a range."""
    span = span_text(low, high)
    return f" ({span} across the steps' p10-p90)" if span else ""


def summary_range(summary: dict, key: str) -> str:
    """range_text of a summary's ratio `key` from its `key`_low/_high (none in older results)."""
    return range_text(summary.get(f"{key}_low", math.nan), summary.get(f"{key}_high", math.nan))


def summary_span(summary: dict, key: str) -> str:
    """span_text of a summary's ratio `key` (for verdict cells)."""
    return span_text(summary.get(f"{key}_low", math.nan), summary.get(f"{key}_high", math.nan))
