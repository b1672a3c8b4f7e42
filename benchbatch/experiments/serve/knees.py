"""The knee of the serving curve: the largest request rate a policy serves within the SLO,
found by bisecting simulated points, and found again with every step 10% slower and faster
(how far the conclusion moves when the step costs are off by the simulator's target)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from benchbatch.core.prediction import STEP_COST_SPREAD
from benchbatch.core.step_model import StepCostModel
from benchbatch.experiments.serve.probe import SIM, Setup, point_row, simulate_point, sustained
from benchbatch.experiments.serve.workloads import ServeWorkload

# A simulated knee (the largest rate within the SLO) is bisected to this width (relative),
# then found again with every step STEP_COST_SPREAD slower and faster: how far the
# conclusion moves when the step costs are off by as much as the simulator's target allows
# (the prediction's p50 band, 0.9-1.1). KNEE_STEPS: the simulations one knee may take.
KNEE_WIDTH = 0.02
KNEE_STEPS = 10


def knee(within, lo: float, hi: float, known: bool = False, width: float = KNEE_WIDTH,
         steps: int = KNEE_STEPS) -> float:  # fmt: skip
    """The largest rate within the SLO to `width`: within(rate) says whether a rate is;
    [lo, hi] a guess of where it lies (known: within(lo) and not within(hi) already seen).
    The bracket is moved by its own width until lo is within and hi is not, then bisected
    in log space. NaN where `steps` calls of within do not bracket it; where they run out
    while bisecting, the last rate seen within (a lower bound, coarser than `width`)."""
    left = steps

    def ask(rate: float) -> bool | None:
        nonlocal left
        if left <= 0:
            return None
        left -= 1
        return within(rate)

    if not known:
        while (ok := ask(lo)) is False:  # lo misses: the knee lies lower
            lo, hi = lo / (hi / lo), lo
        if ok is None:
            return math.nan
        while (ok := ask(hi)) is True:  # hi is within: the knee lies higher
            lo, hi = hi, hi * (hi / lo)
        if ok is None:
            return math.nan
    while hi / lo - 1 > width:
        mid = math.sqrt(lo * hi)
        ok = ask(mid)
        if ok is None:
            break
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def knee_calls(ratio: float, known: bool = False, width: float = KNEE_WIDTH) -> int:
    """The simulations knee() takes on a bracket hi/lo = ratio that holds the knee: its
    bisection's halvings, and the two rates asked first when the bracket is a guess (a
    guess that misses costs more: an estimate, for the progress bar)."""
    if ratio <= 1 + width:  # already as narrow as asked (a knee at the capacity)
        return 0 if known else 2
    halvings = max(0, math.ceil(math.log2(math.log(ratio) / math.log1p(width))))
    return min(KNEE_STEPS, halvings + (0 if known else 2))


def expected_knee_calls(brackets: Sequence[tuple]) -> int:
    """knees()'s simulations for knee_brackets(): each knee, then the same with steps
    slower and faster from a guess STEP_COST_SPREAD wide."""
    side = knee_calls((1 + STEP_COST_SPREAD / 2) ** 2)
    return sum(knee_calls(hi / lo, known=True) + 2 * side for _, lo, hi, _ in brackets)


def with_knees(slo: Sequence[dict], found: Sequence[dict]) -> list[dict]:
    """slo.csv's simulated rows with their knees (knee_rps, knee_rps_slow, knee_rps_fast)."""
    by = {k["policy"]: k for k in found}
    return [r | {k: v for k, v in by[r["policy"]].items() if k != "policy"}
            if r["source"] == SIM and r["policy"] in by else r
            for r in slo]  # fmt: skip


def knee_brackets(rows: Sequence[dict]) -> list[tuple[str, float, float, float]]:
    """Per simulated policy with a knee to find: (policy, lo, hi, capacity), lo a rate
    within the SLO and hi one outside. capacity: the policy's request throughput at the max
    point (everything queued at once; inf without one). A rate above it only seems within
    the SLO because a finite run ends before its queue grows, so the knee is sought below
    it: hi is at most capacity x (1 + KNEE_WIDTH), and a policy within the SLO at every
    finite rate but not at max has its knee between its largest rate and its capacity. A
    policy within the SLO at a swept rate past its capacity has its knee at the capacity
    (lo = hi = capacity: saturation, not latency, bounds it; steps 10% slower and faster
    move it by that factor). None where it never met the SLO or met it at max too."""
    top = {r["policy"]: r["request_throughput_rps"] for r in rows
           if r["source"] == SIM and math.isinf(r["rate_rps"])}  # fmt: skip
    out = []
    for row in sustained(rows):
        if row["source"] != SIM or not row["sustained_rate"] or not row["leaves_slo_at"]:
            continue
        cap = top.get(row["policy"], math.inf)
        lo, hi = row["sustained_rps"], min(row["leaves_slo_rps"], cap * (1 + KNEE_WIDTH))
        if math.isfinite(hi) and lo < min(hi, cap):
            out.append((row["policy"], lo, hi, cap))
        elif math.isfinite(cap) and lo >= cap:  # within past its capacity: the knee is it
            out.append((row["policy"], cap, cap, cap))
    return out


def knees(w: ServeWorkload, rows: Sequence[dict], setup: Setup, cost: StepCostModel,
          advance=lambda: None) -> list[dict]:  # fmt: skip
    """Per policy with a knee to find (knee_brackets): the largest rate within the SLO and
    at most the policy's capacity, bisected to KNEE_WIDTH (knee_rps), and again with every
    step STEP_COST_SPREAD slower (knee_rps_slow) and faster (knee_rps_fast), whose
    capacities are the policy's over that factor (a scaled cost is the same run in scaled
    time). advance() after each simulation."""
    out = []
    for policy, lo, hi, cap in knee_brackets(rows):

        def within(rate: float, model: StepCostModel, factor: float, policy=policy, cap=cap):
            if rate > cap / factor:  # past the capacity: the queue grows without bound
                return False
            advance()
            point = simulate_point(w, policy, rate, setup, model)
            return setup.slo.within(point_row(point, setup))

        found = {"policy": policy,
                 "knee_rps": knee(lambda r: within(r, cost, 1.0), lo, hi, known=True)}  # fmt: skip
        spread = 1 + STEP_COST_SPREAD / 2
        for name, factor in (("slow", 1 + STEP_COST_SPREAD), ("fast", 1 - STEP_COST_SPREAD)):
            model, guess = cost.scaled(factor), found["knee_rps"] / factor
            found[f"knee_rps_{name}"] = knee(lambda r, m=model, f=factor: within(r, m, f),
                                             guess / spread, guess * spread)  # fmt: skip
        out.append(found)
    return out
