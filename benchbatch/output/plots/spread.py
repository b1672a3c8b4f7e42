"""How sure a timed point is, drawn the same way on every figure: error bars from the 10th to
the 90th percentile of its repeats, and a red ring around a noisy one (repeats spread by more
than the noise threshold, benchbatch/core/noise.py). Rows are as the probes yield them (or as
their CSV reads back)."""

from __future__ import annotations

import math

from benchbatch.core.noise import DEFAULT_CV_THRESHOLD

NOISY_LABEL = f"noisy (repeats' CV over {DEFAULT_CV_THRESHOLD:.0%})"
BARS_LABEL = "bars: 10th to 90th percentile of the repeats"


def number(value) -> float | None:
    """A finite float, or None (NaN, text, a missing cell)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def time_bounds(row: dict, key: str = "step_ms") -> tuple[float, float] | None:
    """(p10, p90) of the repeats in the units of `key` (ms), or None when unknown."""
    lo, hi = number(row.get(f"{key}_p10")), number(row.get(f"{key}_p90"))
    if lo is None or hi is None:
        return None
    return lo, hi


def rate_bounds(row: dict, rate: float, key: str = "step_ms") -> tuple[float, float] | None:
    """(low, high) of a rate (tokens/s, FLOP/s) that goes as 1 / step time: the rate at the
    slow (p90) and at the fast (p10) repeats."""
    bounds, median = time_bounds(row, key), number(row.get(key))
    if bounds is None or not median or bounds[0] <= 0:
        return None
    return rate * median / bounds[1], rate * median / bounds[0]


def time_scaled_bounds(row: dict, value: float | None) -> tuple[float, float] | None:
    """(low, high) of a quantity that goes as the step time (us per token, ms)."""
    bounds, median = time_bounds(row), number(row.get("step_ms"))
    if value is None or bounds is None or not median:
        return None
    return value * bounds[0] / median, value * bounds[1] / median


def yerr(values: list[float], bounds: list[tuple[float, float] | None]) -> list[list[float]]:
    """matplotlib's [[below], [above]] from each value and its (low, high) bounds."""
    below, above = [], []
    for v, b in zip(values, bounds, strict=True):
        known = b is not None and math.isfinite(v)
        below.append(max(0.0, v - b[0]) if known else 0.0)
        above.append(max(0.0, b[1] - v) if known else 0.0)
    return [below, above]


def noisy(row: dict) -> bool:
    value = row.get("noisy")
    return value is True or str(value).lower() == "true"


def ring(ax, xs, ys, label: str | None = NOISY_LABEL, **kwargs) -> None:
    """A red ring around each noisy point."""
    if len(xs):
        ax.scatter(xs, ys, s=150, facecolors="none", edgecolors="tab:red", linewidths=1.3,
                   zorder=6, label=label, **kwargs)  # fmt: skip


def noise_note(rows: list[dict]) -> str:
    """For a title: how many of the timed rows were noisy."""
    timed = [r for r in rows if str(r.get("status", "ok")) == "ok"]
    bad = sum(noisy(r) for r in timed)
    if not timed:
        return "nothing timed"
    return f"noisy: {bad} of {len(timed)} steps (ringed)" if bad else "no noisy step"
