"""How well the simulation predicted a measurement: one table wherever a simulation stands
beside a measured run of the same requests (serve-sweep's real points, ablation and
occupancy with --engine real, reproduce), and its verdict in one line.

A pair is one metric of one point (a policy at a rate, a scheme, ...): simulated and
measured. The ratio is measured over simulated; the target is the band it must fall in
(issue 27's goal: 0.9-1.1 for the p50s of TTFT, TPOT and E2E, 0.8-1.25 for their p99s).
Pure Python: no torch, no pandas.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

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
