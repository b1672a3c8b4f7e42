"""How sure a timed point is, drawn the same way on every figure: error bars from the 10th to
the 90th percentile of its repeats, and a red ring around a noisy one (repeats spread by more
than the noise threshold, benchbatch/core/noise.py). Rows are as the probes yield them (or as
their CSV reads back)."""

from __future__ import annotations

import math

from benchbatch.core.noise import DEFAULT_CV_THRESHOLD

NOISY_LABEL = f"noisy (repeats' CV over {DEFAULT_CV_THRESHOLD:.0%}, or one repeat)"
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


def plain(value: float) -> str:
    """A number as people write it, three significant digits and no exponent: 9,230,
    47.4, 0.0123 (never 9.23e+03)."""
    v = float(value)
    if not math.isfinite(v):
        return ""
    if v == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(v))))
    rounded = round(v, digits)
    return f"{rounded:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{rounded:,.0f}"


def plain_log_axis(axis) -> None:
    """A log axis ticked at 1, 2 and 5 of each decade and labelled in plain numbers (100,
    not 10^2): with three ticks a decade, even a narrow range has two labels."""
    from matplotlib import ticker

    axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: plain(v)))
    axis.set_minor_formatter(ticker.NullFormatter())


PREFIXES = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def seconds_text(seconds: float) -> str:
    """A duration in the unit that keeps it between 1 and 1,000: 239 µs, 9.23 ms, 1.5 s."""
    v = float(seconds)
    if not math.isfinite(v):
        return ""
    for scale, unit in PREFIXES:
        if abs(v) >= scale or scale == PREFIXES[-1][0]:
            return f"{plain(v / scale)} {unit}"
    return f"{plain(v)} s"


def seconds_log_axis(axis) -> None:
    """A log axis of seconds ticked at 1, 2 and 5 of each decade, labelled 200 µs, 1 ms."""
    from matplotlib import ticker

    axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: seconds_text(v)))
    axis.set_minor_formatter(ticker.NullFormatter())
