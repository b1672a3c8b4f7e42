"""The core's wake: a step that starts after the engine waited idle for a request costs more
than the same step right after another, and the longer the wait, the more (the core comes
back from idle slow: on the 2-core Intel VM the tiny checkpoint's 42 ms lone prefill took
7 ms more after 0.03-0.1 s idle, 10 after 0.1-0.3 s, 15 after 0.3-1 s and 28 after more;
the step after it under 1 ms more, the one after that nothing). The engine's calibration
runs a lone prefill after waits of a few lengths (runtime/calibrate.py's wake runs); those
steps are left out of the step-cost fit and priced here: what each took over the fit's
price of it, least squares in wake_s x wait^power (power the one of WAKE_POWERS that fits
best). StepCostModel.woken_s prices it; the timed simulation charges it to the first step
after each wait (core/simulate.py). Pure numpy: no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from benchbatch.core.step_model import wake_shape

WAKE_POWERS = (0.25, 0.5, 0.75, 1.0)
# Fewer woken steps than this fit no wake (wake_s 0): one or two say nothing of its shape.
MIN_WOKEN = 4


def idle_s(row: dict) -> float:
    """How long the engine waited idle before a step (its record's idle_ms), in seconds; 0.0
    where it did not (no such column, NaN, or 0)."""
    value = row.get("idle_ms", 0.0)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return 0.0
    return float(value) / 1e3


def split(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(the steps that did not follow an idle wait, those that did)."""
    steady, woken = [], []
    for r in rows:
        (woken if idle_s(r) > 0 else steady).append(r)
    return steady, woken


def fit_wake(woken: Sequence[dict], priced_ms: Sequence[float], gap_ms: float = 0.0) -> dict:
    """The wake's price from the steps that followed an idle wait: each one's time (step_ms,
    plus the loop's gap the fit charges every step) over the steady fit's price of it
    (priced_ms), least squares in wake_s x wake_shape(wait, power) (wait^power, capped, in
    proportion below the shortest wait measured), wake_s >= 0, at each of WAKE_POWERS, the
    least squared error kept. Returns {"wake_s", "wake_power",
    "wake_std_error_s", "woken_steps", "idle_s": [shortest, longest wait]}; wake_s 0 with
    fewer than MIN_WOKEN steps."""
    waits = np.array([idle_s(r) for r in woken])
    extra = np.array([(r["step_ms"] + gap_ms - p) / 1e3
                      for r, p in zip(woken, priced_ms, strict=True)])  # fmt: skip
    out = {"wake_s": 0.0, "wake_power": 0.5, "wake_std_error_s": math.nan,
           "woken_steps": len(woken),
           "idle_s": [float(waits.min()), float(waits.max())] if len(waits) else []}  # fmt: skip
    if len(woken) < MIN_WOKEN:
        return out
    best = None
    for power in WAKE_POWERS:
        f = np.array([wake_shape(w, power) for w in waits])
        wake = max(0.0, float(f @ extra / (f @ f)))
        squared = float(np.sum((extra - wake * f) ** 2))
        if best is None or squared < best[0]:
            best = (squared, power, wake, f)
    squared, power, wake, f = best
    error = math.sqrt(squared / (len(woken) - 1) / float(f @ f))
    return out | {"wake_s": wake, "wake_power": power, "wake_std_error_s": error}
