"""The rates serve-sweep measures: the default sweep from the simulated capacity, and the
rates the real engine serves within its time (the SLO knees, then each policy's last point
below saturation with its steps dearer, then the cheapest others)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from benchbatch.core.prediction import below_saturation
from benchbatch.experiments.serve.probe import MATCHED, SIM

# Default rates: these fractions of the simulated capacity (GuideLLM sweeps between its
# synchronous and its maximum-throughput rates the same way).
AUTO_FRACTIONS = tuple(round(0.1 * k, 1) for k in range(1, 12))


def capacity(rows: Sequence[dict]) -> float:
    """Requests per second the best policy served with everything queued (the max point)."""
    served = [r["request_throughput_rps"] for r in rows if math.isinf(r["rate_rps"])]
    return max(served)


def auto_rates(capacity_rps: float) -> tuple[float, ...]:
    """The default sweep: AUTO_FRACTIONS of the capacity, to two significant digits, and max."""
    rates = {float(f"{f * capacity_rps:.2g}") for f in AUTO_FRACTIONS}
    return (*sorted(r for r in rates if r > 0), math.inf)


def knee_rates(rows: Sequence[dict], source: str = SIM, key: str = "rate_rps") -> list:
    """Per policy, the last rate within the SLO and the first one not (the lowest rate if even
    it misses): where a policy leaves the SLO. key="max_concurrency": a concurrency sweep's
    caps, the same way."""
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = sorted(
            (r for r in rows if r["policy"] == policy and r["source"] == source),
            key=lambda r: r[key],
        )
        miss = next((i for i, r in enumerate(mine) if not r["within_slo"]), None)
        if miss is not None:
            out += [mine[i][key] for i in (miss - 1, miss) if i >= 0]
    return list(dict.fromkeys(out))


def choose_real_caps(rows: Sequence[dict], cost_s: dict[tuple, float], budget_s: float):
    """A concurrency sweep's caps the real engine serves within budget_s seconds. rows: the
    simulations of its own requests at every cap (MATCHED, with max_concurrency); cost_s:
    each (rate, cap) spot's simulated duration, all policies. Where each policy leaves the
    SLO first (its last cap within and its first outside), then the cheapest others (a
    small cap is the dearest: it serves the requests fewest at a time). Returns the chosen
    spots by cap, and their estimated seconds."""
    by_cap = {cap: spot for spot in cost_s for cap in (spot[1],)}
    knees = [by_cap[c] for c in knee_rates(rows, MATCHED, "max_concurrency") if c in by_cap]
    rest = sorted((s for s in cost_s if s not in knees), key=lambda s: cost_s[s])
    order = [*knees, *rest]
    chosen, spent = within_budget(order, cost_s, budget_s)
    return sorted(chosen, key=lambda s: s[1]), spent


def within_budget(order: Sequence, cost_s: dict, budget_s: float) -> tuple[list, float]:
    """The candidates, in order of preference, that fit budget_s seconds together: each
    taken where it still fits beside those taken before it (cost_s: each one's seconds);
    and their seconds in all."""
    chosen, spent = [], 0.0
    for key in order:
        if spent + cost_s[key] <= budget_s:
            chosen.append(key)
            spent += cost_s[key]
    return chosen, spent


def choose_real_rates(rows: Sequence[dict], cost_s: dict[float, float], budget_s: float,
                      dear: Sequence[dict] | None = None):  # fmt: skip
    """The rates the real engine serves within budget_s seconds. rows: the simulations of
    the real engine's own requests at every rate (MATCHED; fewer requests than the sweep
    build shorter queues, so their knees lie further right); cost_s: each rate's simulated
    duration, all policies; dear: the same simulations with every step STEP_COST_SPREAD
    dearer (rows where not given). The knees first (where each policy leaves the SLO, then
    the highest rate each keeps up with even with its steps that much dearer: its last point
    below saturation, so every policy has one in the prediction's verdict, and not one on
    the edge where a few percent of step cost decide whether it keeps up), then the cheapest
    others."""
    knees = [r for r in knee_rates(rows, MATCHED) if r in cost_s]
    # A policy none of whose rates keeps up when dearer: its last one as priced.
    kept = saturation_by_policy(rows, MATCHED) | saturation_by_policy(dear or (), MATCHED)
    knees += [r for r in dict.fromkeys(kept.values()) if r in cost_s and r not in knees]
    rest = sorted((r for r in cost_s if r not in knees), key=lambda r: cost_s[r])
    chosen, spent = within_budget([*knees, *rest], cost_s, budget_s)
    return sorted(chosen), spent


def saturation_rates(rows: Sequence[dict], source: str = SIM) -> list[float]:
    """Per policy, the highest finite rate whose point is below saturation (below_saturation,
    its arrivals' span taken as its requests over the rate), if any."""
    return list(dict.fromkeys(saturation_by_policy(rows, source).values()))


def saturation_by_policy(rows: Sequence[dict], source: str = SIM) -> dict[str, float]:
    """saturation_rates by policy: {policy: its highest rate below saturation}, policies
    with none left out."""
    out = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        kept = [r["rate_rps"] for r in rows if r["policy"] == policy and r["source"] == source
                and math.isfinite(r["rate_rps"]) and "e2e_p50_s" in r
                and below_saturation(r, r["requests"] / r["rate_rps"])]  # fmt: skip
        if kept:
            out[policy] = max(kept)
    return out
