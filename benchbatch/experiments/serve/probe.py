"""The serving curve: request rate against latency and throughput for static batching,
continuous batching and continuous batching with chunked prefill.

Requests arrive in seconds (a seeded Poisson process, or a trace's own shape) at each rate
of a sweep, plus a 'max' point with everything queued at once. Each (policy, rate) is
simulated with the step-cost model fitted on this device (a step lasts what the model says,
so a request arriving at t is first seen by the first step starting at or after t), and
the rates that fit the time are served by the real engine on the model, arrivals on the
wall clock. Every point is measured with the serving benchmarks' metrics (core/serving):
TTFT, TPOT, ITL and E2E percentiles, throughput, goodput under the SLO; and with what the
scheduler did (slot occupancy, mean batch), which explains where the curve bends.

Everything here returns rows or plain results; nothing prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from benchbatch.core.arrivals import mean_rate
from benchbatch.core.kvblocks import KVBudget
from benchbatch.core.metrics import RunMetrics
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.scheduler_config import SchedulerConfig
from benchbatch.core.serving import (
    ServingSLO,
    cap_label,
    concurrency_sweep,
    latency_columns,
    scheduler_columns,
    throughput_columns,
    tpot,
)
from benchbatch.core.simulate import simulate_timed
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.workload import Request
from benchbatch.experiments.serve.options import SERVE_POLICIES as POLICIES
from benchbatch.experiments.serve.options import ServeOptions as Options
from benchbatch.experiments.serve.rates import rate_label
from benchbatch.experiments.serve.workloads import ServeWorkload

__all__ = ["Options", "POLICIES", "Setup", "simulate_point", "point_row", "sustained"]

LABELS = {
    "static": "static",
    "continuous": "continuous",
    "chunked": "continuous + chunked prefill",
    "endpoint": "a running server (--endpoint)",
}
# Sources of a point: the sweep's simulation, the real engine, the simulation of exactly
# the requests and arrival times the real engine (or a server) served (its like-for-like
# twin), and a running server measured over HTTP (--endpoint).
SIM, REAL, MATCHED, ENDPOINT = "sim", "real", "sim-matched", "endpoint"
SOURCES = (SIM, REAL, MATCHED, ENDPOINT)
# What the sim-vs-real table sets side by side.
COMPARED = (
    "duration_s",
    "output_throughput_tps",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "itl_p99_s",
    "e2e_p50_s",
    "slot_occupancy",
    "mean_batch",
)


@dataclass(frozen=True)
class Setup:
    """What every point shares: the slots, the chunked policy's budgets, the SLO."""

    slots: int
    budget: int
    chunk: int
    slo: ServingSLO
    kv: KVBudget | None = None  # a server's KV pool (--predict); None: a row per slot
    # the client's cap on requests in flight (--max-concurrency; a concurrency sweep's is
    # each point's, at_cap): simulated as the client holds them, latencies from the
    # sending; None: every request sent on arrival
    client_limit: int | None = None


def at_cap(setup: Setup, cap: int | None) -> Setup:
    """setup with the client's cap of one point (a concurrency sweep's: each its own)."""
    return setup if cap == setup.client_limit else replace(setup, client_limit=cap)


def cap_columns(cap: int | None) -> dict:
    """The max_concurrency column of a point's rows where its client had a cap: {} without
    one (a run without --max-concurrency writes no such column)."""
    return {} if cap is None else {"max_concurrency": cap}


def settings(policy: str, setup: Setup) -> tuple[str, dict]:
    """The scheduler policy and its settings (SchedulerConfig's fields) of a serving policy."""
    kv = {} if setup.kv is None else {"kv": setup.kv}
    if policy == "chunked":
        return "continuous", {
            "chunked_prefill": True,
            "max_num_batched_tokens": setup.budget,
            "chunk_size": setup.chunk,
            "mixed": True,
        } | kv
    return policy, kv


def check_setup(policies: Sequence[str], setup: Setup) -> None:
    """A UserError naming the option for budgets the chunked policy would refuse."""
    if "chunked" in policies:
        SchedulerConfig(setup.slots, **settings("chunked", setup)[1])


# --- points ---------------------------------------------------------------------------------------


@dataclass
class Point:
    """One policy served at one rate: per-request metrics and what each step did."""

    policy: str
    rate: float
    source: str
    requests: list[Request]
    arrivals: np.ndarray
    metrics: RunMetrics
    step_starts: list[float]
    step_ends: list[float]
    active: list[int]
    preemptions: int | None = None  # with a KV pool (simulated) or a server that counts them
    span_s: float | None = None  # the rates' span, failed requests' too (a measured server's)


def simulate_point(
    w: ServeWorkload,
    policy: str,
    rate: float,
    setup: Setup,
    cost: StepCostModel,
    n: int | None = None,
    source: str = SIM,
) -> Point:
    requests, arrivals = w.at(rate, n)
    name, config = settings(policy, setup)
    sched = make_scheduler(name, setup.slots, **config)
    # A server's latency outside its steps (an endpoint's calibration; 0 for the engine's).
    r = simulate_timed(requests, arrivals, sched, cost, delay_s=cost.request_overhead_s,
                       client_limit=setup.client_limit)  # fmt: skip
    active = r.timeline.active_slots
    return Point(
        policy,
        rate,
        source,
        requests,
        arrivals,
        r.metrics,
        r.step_start_times,
        r.step_end_times,
        active,
        None if setup.kv is None else sched.preemptions,
    )


def real_point(result, policy: str, rate: float, requests, arrivals) -> Point:
    """A real engine run (EngineResult with arrivals in seconds) as a Point."""
    steps = result.steps
    return Point(
        policy,
        rate,
        REAL,
        list(requests),
        np.asarray(arrivals),
        result.metrics,
        [s.start_s for s in steps],
        [s.end_s for s in steps],
        [s.active for s in steps],
    )


def point_row(p: Point, setup: Setup, prompts: dict[int, int] | None = None) -> dict:
    """serve.csv's row: every metric of one (policy, rate, source). prompts: each request's
    prompt tokens as counted for the total-token throughput (default: the workload's; a
    measured server's own count where it gave one, as vLLM's client takes it)."""
    prompts = prompts or {r.id: r.prompt_tokens for r in p.requests}
    row = {
        "policy": p.policy,
        "label": LABELS[p.policy],
        "source": p.source,
        "rate": rate_label(p.rate),
        "rate_rps": p.rate,
        # what the point's requests offered: (n - 1) gaps over their arrivals' span (a
        # draw of the process at rate_rps: within a few percent of it for Poisson arrivals
        # of a few hundred requests, further off in bursts)
        "arrival_rate_rps": mean_rate(np.asarray(p.arrivals)),
        **throughput_columns(p.metrics, prompts, setup.slo, p.span_s),
    }
    row |= latency_columns(p.metrics)
    row |= scheduler_columns(p.step_starts, p.step_ends, p.active, setup.slots, row["duration_s"])
    row["slots"] = setup.slots
    row["within_slo"] = setup.slo.within(row)
    if p.preemptions is not None:
        row["preemptions"] = p.preemptions
    return row


def request_rows(p: Point, slo: ServingSLO, cap: int | None = None) -> list[dict]:
    """requests.csv: every request's latencies at one (policy, rate, source). Behind a
    client's cap (--max-concurrency) each row says when the request arrived (arrival_s),
    when the client sent it (sent_s, the time its latencies count from), the wait between
    (queued_s), and the cap, as --endpoint's rows do."""
    by_id = {r.id: r for r in p.requests}
    offered = {r.id: float(t) for r, t in zip(p.requests, p.arrivals, strict=True)}
    rows = []
    for m in p.metrics.requests:
        r = by_id[m.request_id]
        per = tpot(m)
        held = {} if cap is None else {
            "arrival_s": offered[m.request_id], "sent_s": m.arrival,
            "queued_s": m.arrival - offered[m.request_id], "max_concurrency": cap}  # fmt: skip
        rows.append(
            {
                "policy": p.policy,
                "source": p.source,
                "rate": rate_label(p.rate),
                "request_id": m.request_id,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": m.num_tokens,
                "arrival_s": m.arrival,
                "ttft_s": m.ttft,
                "tpot_s": math.nan if per is None else per,
                "itl_max_s": m.tbt_max,
                "e2e_s": m.e2e,
                "slo_met": slo.met(m),
            }
            | held
        )
    return rows


def sim_vs_real(real: dict, matched: dict) -> list[dict]:
    """sim_vs_real.csv: each compared metric of a real point beside its simulation (the same
    requests at the same arrival times) and measured over simulated."""
    out = []
    for key in COMPARED:
        sim, meas = matched[key], real[key]
        ratio = meas / sim if sim and math.isfinite(sim) and math.isfinite(meas) else math.nan
        out.append(
            {
                "policy": real["policy"],
                "rate": real["rate"],
                "metric": key,
                "simulated": sim,
                "measured": meas,
                "measured_over_simulated": ratio,
            }
        )
    return out


# --- within the SLO ----------------------------------------------------------------------------


def sustained(rows: Sequence[dict]) -> list[dict]:
    """slo.csv: per policy and source, the largest rate it sustains within the SLO (every
    rate up to it within) and the first rate where it leaves it; in a concurrency sweep
    (several --max-concurrency caps at one rate), the largest cap (sustained_concurrency)
    and the first it leaves at (leaves_slo_at_concurrency)."""
    out = []
    for source in SOURCES:
        for policy in (*POLICIES, ENDPOINT):
            mine = sorted(
                (r for r in rows if r["policy"] == policy and r["source"] == source),
                key=lambda r: (r["rate_rps"], r.get("max_concurrency") or 0),
            )
            if mine:
                out.append(sustained_row(policy, source, mine))
    return out


def sustained_row(policy: str, source: str, mine: list[dict]) -> dict:
    miss = next((i for i, r in enumerate(mine) if not r["within_slo"]), len(mine))
    last = mine[miss - 1] if miss > 0 else None
    left = mine[miss] if miss < len(mine) else None
    return {
        "policy": policy,
        "label": LABELS[policy],
        "source": source,
        "rates": len(mine),
        "sustained_rate": last["rate"] if last else None,
        "sustained_rps": last["rate_rps"] if last else math.nan,
        "goodput_rps": last["goodput_rps"] if last else math.nan,
        "output_throughput_tps": last["output_throughput_tps"] if last else math.nan,
        "leaves_slo_at": left["rate"] if left else None,
        "leaves_slo_rps": left["rate_rps"] if left else math.nan,
    } | ({
        "sustained_concurrency": last["max_concurrency"] if last else None,
        "leaves_slo_at_concurrency": left["max_concurrency"] if left else None,
    } if concurrency_sweep(mine) else {})  # fmt: skip


# --- the real engine ------------------------------------------------------------------------------


def engine_runs(
    w: ServeWorkload,
    spots: Sequence[tuple[float, int | None]],
    policies: Sequence[str],
    setup: Setup,
    n: int,
    matched: dict,
) -> list:
    """The real engine's runs, one per (rate, cap) spot and policy: EngineRun specs over the
    first n requests at that rate, behind that client cap (None: none; matched: their
    simulations by (policy, spot), for the progress total)."""
    from benchbatch.runtime.runs import EngineRun

    runs = []
    for rate, cap in spots:
        _, arrivals = w.at(rate, n)
        for policy in policies:
            name, config = settings(policy, setup)
            runs.append(
                EngineRun(
                    policy,
                    setup.slots,
                    name,
                    config,
                    sim_steps=len(matched[(policy, (rate, cap))].step_ends),
                    arrivals_s=arrivals.tolist(),
                    columns={"rate": rate_label(rate)} | cap_columns(cap),
                    client_limit=cap,
                )
            )
    return runs


def spread_rows(w: ServeWorkload, policy: str, rate: float, setup: Setup, cost: StepCostModel,
                n: int | None = None) -> list[dict]:  # fmt: skip
    """A point's requests simulated again with every step scaled by each of
    core/prediction.spread_factors() (up to STEP_COST_SPREAD slower and faster than
    `cost`), their serve.csv rows: how far its prediction moves when the step costs are off
    by as much as the p50 band allows."""
    from benchbatch.core.prediction import spread_factors

    return [point_row(simulate_point(w, policy, rate, setup, cost.scaled(f), n, MATCHED), setup)
            for f in spread_factors() if f != 1.0]  # fmt: skip


def prediction_pairs(real: dict, matched: dict, span_s: float, spread: Sequence[dict] = (),
                     at_speed: dict | None = None) -> list[dict]:  # fmt: skip
    """prediction.csv's pairs of one real point and its simulation (sim_vs_real's pair),
    each marked below saturation or not (below_saturation). With spread_rows' rows the
    prediction is core/prediction.band_median's (simulated: the median over the matched
    simulation and them; simulated_at_price: the matched one's), with each metric's lowest
    and highest (simulated_low, simulated_high). A point whose client kept at most as many
    requests in flight as the server has slots (--max-concurrency, real's max_concurrency)
    is below saturation however its arrivals came: the client sends as fast as the server
    serves, and the server queues none of them. With at_speed (the point simulated again at
    the speed its steps ran, real's steps_over_price), each pair's steps_over_price,
    simulated_at_speed and ratio_at_speed (the error left once the device's speed is known),
    and priced_speed (the speed the prediction was priced at: real.say_priced)."""
    from benchbatch.core import prediction as pr

    cap = real.get("max_concurrency")
    label = f"{real['policy']} @ {rate_label(real['rate_rps'])} req/s{cap_label(cap)}"
    held = cap is not None and cap <= matched.get("slots", 0)
    extra = {} if cap is None else {"max_concurrency": cap}
    pairs = pr.pairs_of(label, pr.band_median(matched, spread, pr.METRICS), real,
                        policy=real["policy"], rate=real["rate"], **extra,
                        below_saturation=held or pr.below_saturation(real, span_s))  # fmt: skip
    for pair in pairs if spread else ():
        values = [matched[pair["metric"]], *(r[pair["metric"]] for r in spread)]
        low, high = pr.step_cost_band(values)
        pair |= {"simulated_at_price": values[0], "simulated_low": low, "simulated_high": high}
    if at_speed is not None:
        for pair in pairs:
            again = at_speed[pair["metric"]]
            pair |= {"steps_over_price": real["steps_over_price"], "simulated_at_speed": again,
                     "ratio_at_speed": pr.ratio(again, pair["measured"]),
                     "priced_speed": real.get("priced_speed", math.nan)}  # fmt: skip
    return pairs


def point_requests(rows: Sequence[dict]) -> dict:
    """requests.csv's rows of the real points and their twins by point (prediction.csv's
    label) and side: {(point, "measured" or "simulated"): {request id: row}}, what
    core/prediction.with_intervals resamples."""
    side = {REAL: "measured", MATCHED: "simulated"}
    out: dict = {}
    for r in rows:
        if r["source"] in side:
            point = f"{r['policy']} @ {r['rate']} req/s{cap_label(r.get('max_concurrency'))}"
            out.setdefault((point, side[r["source"]]), {})[r["request_id"]] = r
    return out
