"""How well the simulation predicted a measurement: one table wherever a simulation stands
beside a measured run of the same requests (serve-sweep's real points, ablation and
occupancy with --engine real, reproduce), and its verdict in one line.

A pair is one metric of one point (a policy at a rate, a scheme, ...): simulated and
measured. The ratio is measured over simulated; the target is the band it must fall in
(issue 27's goal: 0.9-1.1 for the p50s of TTFT, TPOT and E2E, 0.8-1.25 for their p99s).
Pure Python and numpy: no torch, no pandas.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

P50_TARGET = (0.9, 1.1)
P99_TARGET = (0.8, 1.25)
TARGETS: dict[str, tuple[float, float]] = {
    "ttft_p50_s": P50_TARGET,
    "tpot_p50_s": P50_TARGET,
    "e2e_p50_s": P50_TARGET,
    "ttft_p99_s": P99_TARGET,
    "tpot_p99_s": P99_TARGET,
    "e2e_p99_s": P99_TARGET,
}
METRICS = tuple(TARGETS)  # serve-sweep's
# The same bands for what other experiments compare: the time between tokens (ablation's
# TBT, each gap), and a whole run's time (ablation's total, occupancy's wall time).
TARGETS |= {"tbt_p50_s": P50_TARGET, "tbt_p99_s": P99_TARGET, "total_s": P50_TARGET,
            "wall_s": P50_TARGET}  # fmt: skip
NAMES = {
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "TTFT p99",
    "tpot_p50_s": "TPOT p50",
    "tpot_p99_s": "TPOT p99",
    "e2e_p50_s": "E2E p50",
    "e2e_p99_s": "E2E p99",
    "tbt_p50_s": "TBT p50",
    "tbt_p99_s": "TBT p99",
    "total_s": "total time",
    "wall_s": "wall time",
}
# Each serving metric as a percentile of one per-request value (requests.csv's columns).
PER_REQUEST = {"ttft_p50_s": ("ttft_s", 50), "ttft_p99_s": ("ttft_s", 99),
               "tpot_p50_s": ("tpot_s", 50), "tpot_p99_s": ("tpot_s", 99),
               "e2e_p50_s": ("e2e_s", 50), "e2e_p99_s": ("e2e_s", 99)}  # fmt: skip
# How far a prediction moves when every step costs more or less than the model says, by
# as much as the p50 band allows: each point simulated again with every step scaled by
# SPREAD_POINTS factors from 1 - STEP_COST_SPREAD to 1 + STEP_COST_SPREAD (serve-sweep's
# points; its SLO knees take the two ends).
STEP_COST_SPREAD = 0.1
SPREAD_POINTS = 9
# A point whose predictions over those factors span more than AMPLIFIED times the factors'
# own width (in log terms) is near a capacity or a group's edge: a step-cost error of a few
# percent there reads as a latency error several times larger.
AMPLIFIED = 2.0
INTERVAL_LEVEL = 0.9  # the central share of the resampled ratios an interval holds
DRAWS = 1000
COLUMNS = ("point", "metric", "simulated", "measured", "ratio", "target_low", "target_high",
           "within")  # fmt: skip


def ratio(simulated: float, measured: float) -> float:
    """measured / simulated; NaN where either is unknown or the simulation says 0."""
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (simulated, measured))
    return measured / simulated if ok and simulated > 0 else math.nan


def prediction_rows(
    pairs: Iterable[Mapping], targets: Mapping[str, tuple[float, float]] = TARGETS
) -> list[dict]:
    """prediction.csv: each pair (point, metric, simulated, measured, any other keys kept)
    with its ratio, its target band and whether the ratio falls in it (None: no target for
    the metric, or no ratio)."""
    out = []
    for pair in pairs:
        r = ratio(pair["simulated"], pair["measured"])
        lo, hi = targets.get(pair["metric"], (math.nan, math.nan))
        within = None if math.isnan(r) or math.isnan(lo) else bool(lo <= r <= hi)
        out.append({**pair, "ratio": r, "target_low": lo, "target_high": hi, "within": within})
    return out


def pairs_of(point: str, simulated: Mapping, measured: Mapping,
             metrics: Sequence[str] = METRICS, **extra) -> list[dict]:  # fmt: skip
    """The pairs of one point from two rows holding the same metrics (missing ones skipped)."""
    return [
        {"point": point, "metric": m, "simulated": simulated[m], "measured": measured[m], **extra}
        for m in metrics
        if m in simulated and m in measured
    ]


def spread_factors(spread: float = STEP_COST_SPREAD, n: int = SPREAD_POINTS) -> tuple:
    """The step-cost factors a point is simulated again at, 1 - spread to 1 + spread."""
    return tuple(float(f) for f in np.linspace(1 - spread, 1 + spread, n))


def band_median(at_price: Mapping, spread: Sequence[Mapping], keys: Iterable[str]) -> dict:
    """A point's prediction: at_price (its simulation at the calibration's price) with each
    of `keys` replaced by the median of that metric over it and `spread` (the same requests
    simulated again at the other spread_factors()); NaN and missing values left out, and
    at_price's own kept where no other is known. A metric that grows (or shrinks) with the
    step costs keeps its value at the price: the factors are symmetric about 1 and odd in
    number, so the middle one is the price's. One that jumps within a few percent of speed
    (a request that catches or misses a static group, whose TTFT moves by a whole group's
    time) reads the middle of its values over the band, not whichever side of an edge the
    price happened to fall on: the device's speed is not known to that precision (its steps
    run a few percent off their price from run to run; prediction.csv's steps_over_price)."""
    out = dict(at_price)
    for key in keys:
        known = [v for v in (at_price.get(key), *(s.get(key) for s in spread)) if _finite(v)]
        if known:
            out[key] = float(statistics.median(known))
    return out


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def step_cost_band(values: Iterable[float]) -> tuple[float, float]:
    """The lowest and highest of a metric over a point's simulations at spread_factors()
    (NaN, NaN where none is known)."""
    known = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return (min(known), max(known)) if known else (math.nan, math.nan)


def amplified(rows: Sequence[dict], spread: float = STEP_COST_SPREAD) -> str | None:
    """One line on the rows' step-cost bands (simulated_low and simulated_high: the
    prediction with every step up to `spread` faster or slower): the points where the band
    spans more than AMPLIFIED times the steps' own change, the widest first, and how many
    of the values outside their target lie inside their band (a step-cost error of at
    most `spread` accounts for them). None without bands."""
    banded = [r for r in rows if r.get("simulated_low", 0) > 0 and r.get("simulated_high")
              == r.get("simulated_high")]  # fmt: skip (NaN: no band)
    if not banded:
        return None
    steps = math.log((1 + spread) / (1 - spread))
    width = lambda r: math.log(r["simulated_high"] / r["simulated_low"]) / steps  # noqa: E731
    wide = sorted((r for r in banded if width(r) > AMPLIFIED), key=lambda r: -width(r))
    parts = []
    if wide:
        points = list(dict.fromkeys(r["point"] for r in wide))
        shown = ", ".join(f"{NAMES.get(r['metric'], r['metric'])} at {r['point']} "
                          f"x{r['simulated_low'] / r['simulated']:.2f}-"
                          f"x{r['simulated_high'] / r['simulated']:.2f}"
                          for r in wide[:3])  # fmt: skip
        more = f" and {len(wide) - 3} more values" if len(wide) > 3 else ""
        parts.append(f"{len(wide)} value{'s' if len(wide) > 1 else ''} at {len(points)} "
                     f"point{'s' if len(points) > 1 else ''} move by more than {AMPLIFIED:g} "
                     f"times as much ({shown}{more}): where a small step-cost error is a large "
                     "latency error (near a capacity, a static group's edge, or a p99 that "
                     "rests on a few requests)")  # fmt: skip
    missed = [r for r in banded if r.get("within") is False]
    if missed:
        inside = sum(r["simulated_low"] <= r["measured"] <= r["simulated_high"] for r in missed)
        parts.append(f"of the values outside their target, {inside} of {len(missed)} lie "
                     "within their band (a step-cost error of at most that much accounts for "
                     "them)")
    if not parts:
        parts.append(f"no point moves by more than {AMPLIFIED:g} times as much")
    return (f"with every step up to {spread:.0%} slower or faster (prediction.csv's "
            "simulated_low and simulated_high), " + "; ".join(parts))


def _outside(value: float, within: tuple[float, float]) -> str:
    """A speed outside the band, said with the digits that show it outside (x1.104 read
    "x1.10" under "outside x0.9-x1.1")."""
    for digits in (2, 3, 4, 6):
        text = f"{value:.{digits}f}"
        if not within[0] <= float(text) <= within[1]:
            return text
    return f"{value:.6f}"


def at_speed(rows: Sequence[dict], within: tuple[float, float] = P50_TARGET) -> str | None:
    """One line on the rows priced again at the speed each point's steps ran (serve-sweep's
    real points, occupancy's runs: steps_over_price, the steps' time over the calibration's
    price of them; ratio_at_speed, measured over that simulation): the points' speeds
    (serving points are said as below saturation, a run without arrivals as a run), those
    outside
    `within`, and how many judged values fall within their target so, beside how many as
    calibrated. Known only after the run, so no prediction: it tells the device's speed
    moving since the calibration (what comes within at the point's own speed) from the rest
    (the scheduling, a queue or a static group's edge, single steps priced off: what stays
    outside). None without it."""
    judged = [r for r in rows if r["within"] is not None
              and r.get("ratio_at_speed", math.nan) == r.get("ratio_at_speed")]  # fmt: skip
    if not judged:
        return None
    speeds = {r["point"]: r["steps_over_price"] for r in judged}
    hit = sum(r["target_low"] <= r["ratio_at_speed"] <= r["target_high"] for r in judged)
    before = sum(r["within"] for r in judged)
    moved = {p: v for p, v in speeds.items() if not within[0] <= v <= within[1]}
    shown = ", ".join(f"{p} x{_outside(v, within)}" for p, v in sorted(
        moved.items(), key=lambda kv: -abs(math.log(kv[1])))[:3])  # fmt: skip
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    serving = any("below_saturation" in r for r in judged)
    unit, who = ("points", "the points below saturation") if serving else ("runs", "the runs")
    where = (f"; outside x{within[0]:g}-x{within[1]:g} at {len(moved)} of {len(speeds)} "
             f"{unit} ({shown}{more})") if moved else ""  # fmt: skip
    low, high = min(speeds.values()), max(speeds.values())
    low_said, high_said = (_outside(v, within) if v in moved.values() else f"{v:.2f}"
                           for v in (low, high))  # fmt: skip
    span = f"x{low_said}" if low == high else f"x{low_said}-x{high_said}"
    return (f"{who} ran their steps at {span} of the calibration's price{where}; each "
            f"priced at its own speed (prediction.csv's ratio_at_speed, known only after the "
            f"run) {hit} of {len(judged)} values are within their target, against {before} "
            f"as predicted: what stays outside is not the device's speed over the {unit[:-1]} "
            "but the scheduling, a queue or single steps' prices")


def ratio_interval(measured: Sequence[float], simulated: Sequence[float], q: float,
                   draws: int = DRAWS, level: float = INTERVAL_LEVEL,
                   seed: int = 0) -> tuple[float, float]:  # fmt: skip
    """How sure one point's ratio is, given which requests it had: the paired bootstrap
    (measured[i] and simulated[i] are request i's, drawn together with replacement), each
    draw's q-th percentile measured over simulated, and the central `level` of those
    ratios. (NaN, NaN) with fewer than two requests having both values."""
    m, s = np.asarray(measured, float), np.asarray(simulated, float)
    keep = np.isfinite(m) & np.isfinite(s)
    m, s = m[keep], s[keep]
    if m.size < 2:
        return math.nan, math.nan
    draw = np.random.default_rng(seed).integers(0, m.size, size=(draws, m.size))
    top, bottom = np.percentile(m[draw], q, axis=1), np.percentile(s[draw], q, axis=1)
    ratios = top[bottom > 0] / bottom[bottom > 0]
    if not ratios.size:
        return math.nan, math.nan
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def with_intervals(pairs: Iterable[Mapping], requests: Mapping) -> list[dict]:
    """Each pair with ratio_low and ratio_high (ratio_interval over the point's requests,
    requests[(point, source)]: {request id: requests.csv row}, source "measured" or
    "simulated": the simulation at the price); NaN where a metric is no per-request
    percentile or the point's requests are not there. A pair predicted by band_median
    (simulated_at_price beside it) has the interval of the ratio over the simulation at the
    price carried to its prediction: scaled by simulated_at_price / simulated."""
    out = []
    for pair in pairs:
        column, q = PER_REQUEST.get(pair["metric"], (None, None))
        real = requests.get((pair["point"], "measured"), {})
        sim = requests.get((pair["point"], "simulated"), {})
        ids = sorted(set(real) & set(sim))
        lo = hi = math.nan
        if column is not None and ids:
            lo, hi = ratio_interval([real[i][column] for i in ids],
                                    [sim[i][column] for i in ids], q)  # fmt: skip
            if "simulated_at_price" in pair:
                shift = ratio(pair["simulated"], pair["simulated_at_price"])
                lo, hi = (lo * shift, hi * shift) if shift == shift else (lo, hi)
        out.append({**pair, "ratio_low": lo, "ratio_high": hi})
    return out


def how_sure(rows: Sequence[dict]) -> str | None:
    """One line on the rows' intervals: per metric, the median point's interval and at how
    many points the interval reaches the target band. None without intervals. An interval
    from 0 (a server that sent a request's tokens at once: its TPOT 0) has no width: left
    out."""
    parts = []
    for metric in dict.fromkeys(r["metric"] for r in rows):
        judged = [r for r in rows if r["metric"] == metric and r["within"] is not None
                  and r.get("ratio_low", math.nan) > 0]  # fmt: skip (NaN: none; 0: no width)
        if not judged:
            continue
        widths = [r["ratio_high"] / r["ratio_low"] for r in judged]
        reach = sum(r["ratio_low"] <= r["target_high"] and r["ratio_high"] >= r["target_low"]
                    for r in judged)  # fmt: skip
        parts.append(f"{NAMES.get(metric, metric)} x{statistics.median(widths):.2f} wide, "
                     f"reaching its band at {reach} of {len(judged)}")  # fmt: skip
    if not parts:
        return None
    return (f"how sure each point's ratio is, given its requests ({INTERVAL_LEVEL:.0%} "
            "interval of a paired bootstrap, prediction.csv's ratio_low and ratio_high; the "
            "median point's): " + "; ".join(parts))


def verdict(rows: Sequence[dict]) -> str | None:
    """One line: per metric with a target, at how many points the simulation predicts it
    within its band, and the range of measured over simulated. None without judged rows."""
    parts = []
    for metric in dict.fromkeys(r["metric"] for r in rows):
        judged = [r for r in rows if r["metric"] == metric and r["within"] is not None]
        if not judged:
            continue
        lo, hi = judged[0]["target_low"], judged[0]["target_high"]
        ratios = [r["ratio"] for r in judged]
        hit = sum(r["within"] for r in judged)
        spread = f"x{min(ratios):.2f}" if len(ratios) == 1 else (
            f"x{min(ratios):.2f}-x{max(ratios):.2f}")  # fmt: skip
        parts.append(
            f"{NAMES.get(metric, metric)} {_band(lo, hi)} at {hit} of {len(judged)} "
            f"point{'s' if len(judged) > 1 else ''} ({spread})"
        )
    if not parts:
        return None
    return "the simulation predicts " + ", ".join(parts) + " (measured over simulated)"


def _band(lo: float, hi: float) -> str:
    """'within 10%' for a symmetric-looking band, else 'within x0.8-x1.25'."""
    if math.isclose(1 - lo, hi - 1, rel_tol=1e-9):
        return f"within {hi - 1:.0%}"
    return f"within x{lo:g}-x{hi:g}"


def summary(rows: Sequence[dict]) -> dict:
    """result.json's prediction: points judged and within target, and the verdict."""
    judged = [r for r in rows if r["within"] is not None]
    return {
        "pairs": len(rows),
        "judged": len(judged),
        "within_target": sum(r["within"] for r in judged),
        "verdict": verdict(rows),
    }


def below_saturation(real: dict, span_s: float) -> bool:
    """The point kept up with its arrivals: its requests served over their arrivals' span
    (span_s) plus one median request's E2E at 90% of the offered rate (requests over
    span_s) or more, i.e. E2E p50 at most a ninth of the span. The drain after the last
    arrival counts as a typical request's latency, not as the last request's own: with 40
    requests a point, a last request of long output (0.76 s at 5.3 req/s, 2-core CPU) was
    11% of a 6.8-s span where the second half's TTFT p50 stayed within 15% of the first
    half's, and the last token's time made the point look saturated. A growing queue
    raises the median E2E with the span, so a saturated point still fails."""
    if not span_s > 0 or not math.isfinite(span_s):
        return False
    return span_s / (span_s + real["e2e_p50_s"]) >= 0.9
