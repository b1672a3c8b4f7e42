"""Serving metrics and arrivals in seconds: the metric definitions against hand-computed
examples, goodput, the seconds-based simulation against a brute-force reference, and
continuous batching never worse than static on the same arrivals."""

from __future__ import annotations

import math
from collections import Counter, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.core.arrivals import ArrivalFeed, at_rate, to_unit_rate, unit_poisson
from benchbatch.core.metrics import RequestMetrics, RunMetrics
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.serving import (
    ServingSLO,
    goodput_count,
    latency_columns,
    scheduler_columns,
    stats,
    throughput_columns,
    timed_run_metrics,
    tpot,
)
from benchbatch.core.simulate import simulate, simulate_timed
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.workload import Request

# --- the metric definitions, by hand -----------------------------------------------------------


def two_requests() -> RunMetrics:
    """Request 0 arrives at 0 and gets tokens at 1, 2, 3, 4, 5 (even gaps of 1 s); request 1
    arrives at 1 and gets tokens at 2, 2.5, 3, 6 (uneven gaps .5, .5, 3)."""
    steps = {0: [0, 1, 2, 3, 4], 1: [5, 6, 7, 8]}
    ends = [1.0, 2.0, 3.0, 4.0, 5.0, 2.0, 2.5, 3.0, 6.0]  # a step per token (not in order)
    return timed_run_metrics(steps, ends, {0: 0.0, 1: 1.0})


def test_ttft_tpot_itl_e2e_by_hand():
    run = two_requests()
    a, b = run.requests
    assert (a.ttft, b.ttft) == (1.0, 1.0)
    assert (a.e2e, b.e2e) == (5.0, 5.0)
    # TPOT: (e2e - ttft) / (tokens - 1): (5 - 1) / 4 for a, (5 - 1) / 3 for b (4 tokens).
    assert tpot(a) == 1.0
    assert tpot(b) == pytest.approx(4.0 / 3.0)
    cols = latency_columns(run)
    # ITL pools every gap: 1, 1, 1, 1 and .5, .5, 3: the tail is b's 3 s stall.
    gaps = sorted([1.0] * 4 + [0.5, 0.5, 3.0])
    assert cols["itl_mean_s"] == pytest.approx(sum(gaps) / 7)
    assert cols["itl_p50_s"] == 1.0
    # p99 of 7 gaps: rank 0.99 x 6 = 5.94, between 1 and 3: 1 + 0.94 x 2.
    assert cols["itl_p99_s"] == pytest.approx(2.88) == np.percentile(gaps, 99)
    assert cols["itl_p99_s"] > 2.5  # the stall shows in ITL...
    assert cols["tpot_p99_s"] < 1.34  # ...and is averaged away in TPOT
    assert cols["tpot_mean_s"] == pytest.approx((1 + 4 / 3) / 2)
    assert cols["ttft_p90_s"] == 1.0 and cols["e2e_p50_s"] == 5.0


def test_tpot_and_itl_differ_on_uneven_gaps():
    """Same first and last token, so the same TPOT; uneven gaps give a larger ITL p99."""
    even = timed_run_metrics({0: [0, 1, 2, 3]}, [1.0, 2.0, 3.0, 4.0], {0: 0.0})
    uneven = timed_run_metrics({0: [0, 1, 2, 3]}, [1.0, 1.1, 1.2, 4.0], {0: 0.0})
    assert tpot(even.requests[0]) == pytest.approx(tpot(uneven.requests[0])) == 1.0
    assert latency_columns(even)["itl_p99_s"] == pytest.approx(1.0)
    assert latency_columns(uneven)["itl_p99_s"] == pytest.approx(np.percentile([0.1, 0.1, 2.8], 99))


def test_a_single_token_request_has_no_tpot():
    run = timed_run_metrics({0: [0]}, [2.0], {0: 0.5})
    m = run.requests[0]
    assert tpot(m) is None and m.ttft == 1.5 and m.e2e == 1.5
    cols = latency_columns(run)
    assert math.isnan(cols["tpot_p50_s"]) and math.isnan(cols["itl_p99_s"])
    assert ServingSLO(2.0, 0.0).met(m)  # its TPOT counts as 0 (vLLM)


def test_stats_are_mean_and_linear_percentiles():
    s = stats([1.0, 2.0, 3.0, 4.0, 10.0])
    assert s == {"mean": 4.0, "p50": 3.0, "p90": pytest.approx(7.6), "p99": pytest.approx(9.76)}


def test_throughput_duration_and_concurrency_by_hand():
    run = two_requests()
    cols = throughput_columns(run, {0: 10, 1: 20}, ServingSLO(1.0, 1.0))
    assert cols["duration_s"] == 6.0  # first arrival 0, last token 6
    assert cols["request_throughput_rps"] == pytest.approx(2 / 6)
    assert cols["output_throughput_tps"] == pytest.approx(9 / 6)
    assert cols["total_token_throughput_tps"] == pytest.approx(39 / 6)
    assert cols["mean_concurrency"] == pytest.approx(10 / 6)  # e2e 5 + 5 over 6 s
    assert cols["tokens_per_s_per_user"] == pytest.approx(9 / 10)
    # Request 0 meets TTFT <= 1 and TPOT <= 1; request 1's TPOT 4/3 does not.
    assert cols["slo_met"] == 1 and cols["goodput_rps"] == pytest.approx(1 / 6)
    assert cols["p99_uncertain"]


def metrics(ttft: float, tpot_s: float, tokens: int = 5) -> RequestMetrics:
    finish = ttft + tpot_s * (tokens - 1)
    return RequestMetrics(0, 0.0, ttft, finish, tokens, tpot_s, tpot_s, tpot_s)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]),
            st.sampled_from([0.05, 0.1, 0.125, 0.2]),
            st.integers(1, 4),
        ),
        max_size=30,
    )
)
def test_goodput_counts_exactly_the_requests_meeting_both_limits(cases):
    slo = ServingSLO(ttft_s=1.5, tpot_s=0.125)
    ms = [metrics(ttft, tp, n) for ttft, tp, n in cases]
    expected = sum(
        ttft <= 1.5 and (n == 1 or tp <= 0.125 + 1e-12) for ttft, tp, n in cases
    )  # limits are inclusive; TPOT from (e2e - ttft) / (n - 1) may round by an ulp
    ok = [slo.met(m) for m in ms]
    assert goodput_count(ms, slo) == sum(ok) == expected
    # Meeting one limit is not enough: each miss of either limit is a request lost.
    for m, good in zip(ms, ok, strict=True):
        assert good == (m.ttft <= 1.5 and (tpot(m) or 0.0) <= 0.125)


def test_slo_limits_are_inclusive_and_both_needed():
    slo = ServingSLO(1.0, 0.125)  # binary fractions: the sums are exact
    assert slo.met(metrics(1.0, 0.125, tokens=3))
    assert not slo.met(metrics(1.0000001, 0.0625))
    assert not slo.met(metrics(0.25, 0.126))


def test_scheduler_columns_by_hand():
    # Two steps: [0, 1) with 2 active of 4 slots, [3, 4) with 4 active; the run lasts 5 s.
    cols = scheduler_columns([0.0, 3.0], [1.0, 4.0], [2, 4], slots=4, duration=5.0)
    assert cols == {"steps": 2, "mean_batch": 3.0, "busy_fraction": 0.4, "slot_occupancy": 0.3}


# --- arrivals -----------------------------------------------------------------------------------


def test_poisson_arrivals_scale_with_the_rate():
    unit = unit_poisson(20_000, seed=4)
    assert unit[0] == 0.0 and (np.diff(unit) >= 0).all()
    assert np.mean(np.diff(unit)) == pytest.approx(1.0, rel=0.03)
    assert np.array_equal(at_rate(unit, 4.0), unit / 4.0)
    assert not at_rate(unit, math.inf).any()  # 'max': every request queued at 0
    assert np.array_equal(unit_poisson(50, 4), unit[:50])  # a prefix: the same draws


def test_a_trace_is_scaled_to_one_request_per_second():
    unit = to_unit_rate(np.array([10.0, 10.0, 12.0, 18.0]))
    assert unit.tolist() == [0.0, 0.0, 0.75, 3.0]  # 3 gaps over 8 s: rate 3/8


class _Queue:
    def __init__(self):
        self.step, self.added = 3, []

    def add_requests(self, requests):
        self.added += list(requests)


def test_the_feed_releases_arrived_requests_in_order_of_arrival():
    reqs = [Request(i, 4, 2) for i in range(4)]
    feed = ArrivalFeed(reqs, [2.0, 0.5, 2.0, 1.0])
    q = _Queue()
    assert feed.release(q, 0.4) == 0 and feed.next_arrival == 0.5
    assert feed.release(q, 2.0) == 4 and feed.empty  # at or after: 2.0 is in
    assert [r.id for r in q.added] == [1, 3, 0, 2]  # by time, ties in the given order
    assert {r.arrival_step for r in q.added} == {3}


# --- the seconds-based simulation against a brute-force reference ----------------------------


def reference(requests, arrivals, slots, policy, cost):
    """Token times of every request, by the rule stated plainly: a step starts when the last
    ended (or, idle, at the next arrival); it first queues every request arrived by its start
    (first come, first served), decodes every running request, and admits waiting requests
    (continuous: into free slots; static: a group of up to `slots` once every request of the
    last group has finished), whose whole prompt it prefills for their first token. A
    static group's finished members still decode padding while the group runs, priced as
    decoding sequences (the real engine computes them)."""
    order = deque(sorted(range(len(requests)), key=lambda i: (arrivals[i], i)))
    waiting, running, times, t, steps = deque(), {}, {}, 0.0, 0
    group = 0  # static: the running group's size
    while order or waiting or running:
        while order and arrivals[order[0]] <= t:
            waiting.append(order.popleft())
        if not waiting and not running:
            t = max(t, arrivals[order[0]])
            continue
        decodes = list(running)
        room = slots - len(running) if policy == "continuous" else (0 if running else slots)
        admitted = [waiting.popleft() for _ in range(min(room, len(waiting)))]
        padded = group - len(decodes) if policy == "static" and decodes else 0
        if policy == "static" and admitted:
            group = len(admitted)
        context = sum(requests[i].prompt_tokens + running[i] - 1 for i in decodes)
        prefill = sum(requests[i].prompt_tokens for i in admitted)
        t += (
            cost.base_s
            + cost.per_decode_token_s * (len(decodes) + padded)
            + cost.per_prefill_token_s * prefill
            + cost.per_context_token_s * context
        )
        steps += 1
        for i in decodes + admitted:
            running[i] = running.get(i, 0) + 1
            times.setdefault(i, []).append(t)
            if running[i] == requests[i].output_tokens:
                del running[i]
    return times, steps


workloads = st.integers(1, 10).flatmap(
    lambda n: st.tuples(
        st.lists(st.tuples(st.integers(1, 40), st.integers(1, 8)), min_size=n, max_size=n),
        st.lists(
            st.one_of(st.just(0.0), st.floats(0, 6, allow_nan=False), st.sampled_from([0.5, 1.0])),
            min_size=n,
            max_size=n,
        ),
    )
)
costs = st.builds(
    StepCostModel,
    st.floats(0.01, 1.0),
    st.floats(0.0, 0.5),
    st.floats(0.0, 0.05),
    st.floats(0.0, 0.01),
)


@settings(max_examples=200, deadline=None)
@given(workloads, st.integers(1, 4), st.sampled_from(["static", "continuous"]), costs)
def test_timed_simulation_matches_the_brute_force_reference(work, slots, policy, cost):
    lengths, arrivals = work
    requests = [Request(i, p, o) for i, (p, o) in enumerate(lengths)]
    result = simulate_timed(requests, arrivals, make_scheduler(policy, slots), cost)
    times, steps = reference(requests, arrivals, slots, policy, cost)
    assert result.total_steps == steps
    by_id = {m.request_id: m for m in result.metrics.requests}
    assert set(by_id) == set(range(len(requests)))
    gaps = Counter()
    for i, r in enumerate(requests):
        m, mine = by_id[i], times[i]
        assert m.arrival == arrivals[i]
        assert m.num_tokens == r.output_tokens == len(mine)
        assert m.first_token == pytest.approx(mine[0], rel=1e-12, abs=1e-12)
        assert m.finish == pytest.approx(mine[-1], rel=1e-12, abs=1e-12)
        assert m.first_token > m.arrival  # seen by a step starting at or after it
        gaps.update(round(b - a, 9) for a, b in zip(mine, mine[1:], strict=False))
    pooled = Counter()
    for g, c in result.metrics.tbt_counts.items():
        pooled[round(g, 9)] += c
    assert pooled == gaps
    starts, ends = result.step_start_times, result.step_end_times
    assert all(s < e for s, e in zip(starts, ends, strict=True))
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))  # idle gaps allowed


def test_everything_queued_at_zero_is_the_step_based_simulation():
    requests = [Request(i, 10 + i, 1 + (7 * i) % 9) for i in range(20)]
    cost = StepCostModel(0.02, 0.003, 0.0004, 1e-6)
    for policy in ("static", "continuous"):
        steps = simulate(requests, make_scheduler(policy, 4), cost)
        timed = simulate_timed(requests, [0.0] * 20, make_scheduler(policy, 4), cost)
        assert timed.step_end_times == steps.step_end_times
        assert timed.metrics.requests == steps.metrics.requests
        assert timed.metrics.tbt_counts == steps.metrics.tbt_counts


def test_an_idle_simulation_waits_for_the_next_arrival():
    cost = StepCostModel(0.1, 0.0, 0.0)
    result = simulate_timed([Request(0, 4, 2), Request(1, 4, 1)], [0.0, 5.0],
                            make_scheduler("continuous", 2), cost)  # fmt: skip
    assert result.step_start_times == [0.0, 0.1, 5.0]  # no step between 0.2 and 5
    first = {m.request_id: m.first_token for m in result.metrics.requests}
    assert first == {0: 0.1, 1: pytest.approx(5.1)}


# --- continuous never worse than static ---------------------------------------------------------


on_the_step_grid = workloads.map(lambda w: (w[0], [float(int(a)) for a in w[1]]))


@settings(max_examples=200, deadline=None)
@given(on_the_step_grid, st.integers(1, 4))
def test_continuous_never_serves_a_request_later_than_static(work, slots):
    """Steps of equal cost (1 s) and arrivals on their boundaries: every request's first and
    last token come no later with continuous batching, and the run takes no more steps.
    (Off the grid a request can come later: see the next test.)"""
    lengths, arrivals = work
    requests = [Request(i, p, o) for i, (p, o) in enumerate(lengths)]
    runs = {
        p: simulate_timed(requests, arrivals, make_scheduler(p, slots), lambda plan: 1.0)
        for p in ("static", "continuous")
    }
    static = {m.request_id: m for m in runs["static"].metrics.requests}
    for m in runs["continuous"].metrics.requests:
        assert m.first_token <= static[m.request_id].first_token
        assert m.finish <= static[m.request_id].finish
    assert runs["continuous"].total_steps <= runs["static"].total_steps


def test_a_request_arriving_mid_step_waits_for_the_step_to_end():
    """Why the property above keeps arrivals on the step grid (a case hypothesis found): the
    last request arrives at 6.0, while continuous is half-way through a step it started at
    5.5 and static, idle since its group ended at 6.0, starts a group at once."""
    lengths = [(1, 2), (1, 1), (1, 3), (1, 3), (1, 1)]
    arrivals = [4.5, 0.0, 0.0, 0.0, 6.0]
    requests = [Request(i, p, o) for i, (p, o) in enumerate(lengths)]
    first = {
        p: {
            m.request_id: m.first_token
            for m in simulate_timed(
                requests, arrivals, make_scheduler(p, 2), lambda plan: 1.0
            ).metrics.requests
        }
        for p in ("static", "continuous")
    }
    assert (first["static"][4], first["continuous"][4]) == (7.0, 7.5)
    assert first["continuous"][0] < first["static"][0]  # the one that waited for a group


queued_at_once = workloads.map(lambda w: (w[0], [0.0] * len(w[0])))


@settings(max_examples=300, deadline=None)
@given(queued_at_once, st.integers(1, 4), costs)
def test_continuous_never_finishes_later_than_static_under_a_cost_model(work, slots, cost):
    """Every request queued at once (the article's setting) and steps priced by a cost model
    (static's padded slots priced as the decodes they compute): continuous batching ends the
    run no later, so its throughput is never lower. (Single requests can come later: a
    prompt admitted beside a decode makes that step longer; the whole run never does. With
    arrivals over time it can: see the next test.)"""
    lengths, arrivals = work
    requests = [Request(i, p, o) for i, (p, o) in enumerate(lengths)]

    def priced(plan) -> float:
        return cost(plan) + cost.per_decode_token_s * len(plan.padded_slots)

    ends = {
        p: simulate_timed(requests, arrivals, make_scheduler(p, slots), priced).total_time
        for p in ("static", "continuous")
    }
    assert ends["continuous"] <= ends["static"] + 1e-9


def test_a_late_arrival_can_end_continuous_later_than_static():
    """Why the property above queues every request at once (a case hypothesis found): 4 slots,
    every step 0.375 s. Continuous serves request 5 (arrived at 4.0) at once, in steps from
    4.0 to 5.5; request 1 arrives at 5.25, mid-step, waits for 5.5 and ends at 7.0 alone.
    Static is still busy with its second group until 5.25, then takes 5 and 1 together and
    ends at 6.75: the wait happened to line the two up."""
    lengths = [(1, 1), (1, 4), (1, 1), (1, 1), (1, 7), (1, 4), (1, 1), (1, 1), (1, 7)]
    arrivals = [0.0, 5.25, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0]
    requests = [Request(i, p, o) for i, (p, o) in enumerate(lengths)]
    runs = {
        p: simulate_timed(requests, arrivals, make_scheduler(p, 4), lambda plan: 0.375)
        for p in ("static", "continuous")
    }
    assert runs["static"].total_time == pytest.approx(6.75)
    assert runs["continuous"].total_time == pytest.approx(7.0)
    first = {p: {m.request_id: m.first_token for m in r.metrics.requests} for p, r in runs.items()}
    assert first["continuous"][5] == pytest.approx(4.375)
    assert first["static"][5] == pytest.approx(5.625)
    assert first["continuous"][1] == pytest.approx(5.875)
    assert first["static"][1] == pytest.approx(5.625)


# --- burstiness (vLLM's bench serve --burstiness) ---------------------------------------------


def test_burstiness_one_is_the_poisson_process_drawn_as_before():
    unit = unit_poisson(500, seed=4)
    assert np.array_equal(unit_poisson(500, 4, 1.0), unit)
    gaps = np.random.default_rng([4, 17]).exponential(1.0, 500)  # the stream it always drew
    assert np.allclose(np.diff(unit), gaps[:-1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 4.0])
def test_burstiness_draws_gamma_gaps_of_mean_one_and_vllms_spread(burstiness):
    """vLLM's bench serve draws gaps np.random.gamma(shape=burstiness, scale=1 / (rate *
    burstiness)); at any rate ours are the same distribution: mean 1/rate, coefficient of
    variation 1/sqrt(burstiness), and the gamma law itself (Kolmogorov-Smirnov against
    scipy's gamma, which draws nothing here)."""
    stats = pytest.importorskip("scipy.stats")
    rate = 3.0
    times = at_rate(unit_poisson(40_001, seed=7, burstiness=burstiness), rate)
    gaps = np.diff(times)
    assert times[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness**-0.5, rel=0.03)
    law = stats.gamma(a=burstiness, scale=1 / (rate * burstiness))
    assert stats.kstest(gaps, law.cdf).pvalue > 1e-3
    other = stats.gamma(a=burstiness * 1.2, scale=1 / (rate * burstiness * 1.2))
    assert stats.kstest(gaps, other.cdf).pvalue < 1e-6  # the test can tell a wrong shape
