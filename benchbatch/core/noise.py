"""The one noise rule: when a timing is too spread to trust (no torch here).

Every table flags its rows by these thresholds, and every warning and verdict quotes them.
"""

from __future__ import annotations

# Repeats of one step: a coefficient of variation (stdev / mean) above 10% makes the median
# hard to trust.
DEFAULT_CV_THRESHOLD = 0.10

# A run's steps of one kind barely differ: p90 over twice the median means another process
# took the device meanwhile (the real engine's steps, against their median or a cost model).
NOISY_P90_OVER_MEDIAN = 2.0

REPEATS_HINT = "try more --repeats or --min-time"


def noisy_hint(load: float | None, cores: int, threads: int | None = None) -> str:
    """What to try about noisy rows. On a machine whose load says other processes compete
    (the likely cause: issue 28 measured 2-10x slower steps at two threads under load),
    fewer threads and less other work first; more repeats only average the noise."""
    from benchbatch.core.machine import load_class

    if load_class(load, cores, own_threads=1) != "busy":
        if threads is not None and threads > 1:
            return f"{REPEATS_HINT}, or --threads 1 (one pinned thread measures best when shared)"
        return REPEATS_HINT
    return (
        f"the load average is {load:.1f} on {cores} physical cores, so other processes "
        "compete: close other work and run with --threads 1 (one pinned thread measures "
        f"best on a shared machine), then {REPEATS_HINT}"
    )
