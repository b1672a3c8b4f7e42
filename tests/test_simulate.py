"""The simulator against brute-force references, the article's numbers, the chunked-prefill
stall, per-request metrics and the step-cost model."""

from __future__ import annotations

import random
from collections import Counter, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.core.metrics import (
    ColumnarRunMetrics,
    TokenRecorder,
    counts_percentile,
    percentile,
    summarize,
)
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import occupancy_table, run_policies, simulate, timeline_rows
from benchbatch.core.step_model import StepCostModel, fit_step_cost
from benchbatch.core.workload import Request, Workload, lognormal_columns, lognormal_workload

# --- brute-force references, written independently of the scheduler -------------------------


def reference_steps(requests: list[Request], slots: int, policy: str) -> int:
    """The article's rule, one step at a time over every slot: a slot holding a request
    with n tokens left produces one token per step; free slots take arrived requests in
    order (static: only once every slot of the group is free)."""
    queue = deque(sorted(requests, key=lambda r: r.arrival_step))
    left = [0] * slots
    step = 0
    while queue or any(left):
        group_over = not any(left)
        for k in range(slots):
            arrived = queue and queue[0].arrival_step <= step
            if left[k] == 0 and arrived and (policy == "continuous" or group_over):
                left[k] = queue.popleft().output_tokens
        left = [max(0, n - 1) for n in left]
        step += 1
    return step


def static_group_steps(outputs: list[int], slots: int) -> int:
    """All queued at step 0: groups of `slots` in order, each lasting its longest request."""
    return sum(max(outputs[i : i + slots]) for i in range(0, len(outputs), slots))


def make_requests(outputs: list[int], arrivals: list[int] | None = None, prompt: int = 16):
    arrivals = arrivals or [0] * len(outputs)
    return [
        Request(i, prompt, n, a) for i, (n, a) in enumerate(zip(outputs, arrivals, strict=True))
    ]


outputs_st = st.lists(st.integers(1, 60), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(outputs_st, st.integers(1, 8))
def test_static_equals_group_formula(outputs, slots):
    requests = make_requests(outputs)
    expected = static_group_steps(outputs, slots)
    for fast in (True, False):
        result = simulate(requests, make_scheduler("static", slots), fast=fast)
        assert result.total_steps == expected


@settings(max_examples=150, deadline=None)
@given(outputs_st, st.integers(1, 8), st.booleans(), st.randoms(use_true_random=False))
def test_both_policies_equal_step_reference_with_arrivals(outputs, slots, arrive, rng):
    arrivals = [rng.randint(0, 80) for _ in outputs] if arrive else None
    requests = make_requests(outputs, arrivals)
    for policy in ("static", "continuous"):
        expected = reference_steps(requests, slots, policy)
        for fast in (True, False):
            result = simulate(requests, make_scheduler(policy, slots), fast=fast)
            assert result.total_steps == expected, (policy, fast)


def test_seeded_lognormal_traces_equal_the_reference():
    for seed in range(20):
        rng = random.Random(seed)
        requests = lognormal_workload(
            rng.randint(1, 300), seed=seed, arrival_rate=rng.choice([None, 0.2, 2.0])
        )
        slots = rng.randint(1, 40)
        for policy in ("static", "continuous"):
            got = simulate(requests, make_scheduler(policy, slots)).total_steps
            assert got == reference_steps(requests, slots, policy)


@settings(max_examples=150, deadline=None)
@given(outputs_st, st.integers(1, 8))
def test_continuous_occupancy_at_least_static_and_occupancy_formula(outputs, slots):
    results = run_policies(make_requests(outputs), slots)
    static, continuous = results["static"], results["continuous"]
    assert continuous.occupancy >= static.occupancy
    assert continuous.total_steps <= static.total_steps
    for r in results.values():
        assert r.useful_slot_steps == sum(outputs)
        assert r.occupancy == sum(outputs) / (r.total_steps * slots)
        assert r.idle_slot_steps == r.total_steps * slots - sum(outputs)
        assert sum(r.timeline.active_slots) == sum(outputs)  # n tokens hold a slot n steps
        assert len(r.timeline.active_slots) == r.total_steps


@settings(max_examples=100, deadline=None)
@given(outputs_st, st.integers(1, 8), st.randoms(use_true_random=False))
def test_fast_path_equals_generic_scheduler(outputs, slots, rng):
    arrivals = [rng.randint(0, 50) for _ in outputs]
    requests = [
        Request(i, rng.randint(1, 30), n, a)
        for i, (n, a) in enumerate(zip(outputs, arrivals, strict=True))
    ]
    for policy in ("static", "continuous"):
        fast = simulate(requests, make_scheduler(policy, slots))
        slow = simulate(requests, make_scheduler(policy, slots), fast=False)
        assert fast == slow, policy  # steps, timeline (active, decode, prefill), metrics


def reference_run(requests: list[Request], slots: int, policy: str):
    """reference_steps() keeping what it saw: each request's admission step (by id) and the
    active slots of every step."""
    queue = deque(sorted(requests, key=lambda r: r.arrival_step))
    left, starts, active = [0] * slots, {}, []
    while queue or any(left):
        group_over = not any(left)
        for k in range(slots):
            arrived = queue and queue[0].arrival_step <= len(active)
            if left[k] == 0 and arrived and (policy == "continuous" or group_over):
                r = queue.popleft()
                left[k], starts[r.id] = r.output_tokens, len(active)
        active.append(sum(n > 0 for n in left))
        left = [max(0, n - 1) for n in left]
    return starts, active


def random_trace(rng: random.Random, size: int, spread: int) -> list[Request]:
    """size requests with long-tailed outputs; arrivals uniform over [0, spread] steps."""
    return [
        Request(i, rng.randint(1, 9), min(300, int(rng.lognormvariate(2.5, 1.0)) + 1), a)
        for i, a in enumerate(rng.randint(0, spread) if spread else 0 for _ in range(size))
    ]


@pytest.mark.parametrize("size", [1, 7, 64, 257, 1000, 3000])
def test_columns_fast_path_equals_references_at_many_sizes(size):
    rng = random.Random(size)
    for spread in (0, size // 4, size * 3):
        requests = random_trace(rng, size, spread)
        slots = rng.choice([1, 3, 16, 64, 256])
        for policy in ("static", "continuous"):
            starts, active = reference_run(requests, slots, policy)
            fast = simulate(Workload.of(requests), make_scheduler(policy, slots))
            assert fast.total_steps == len(active), (policy, spread)
            assert fast.timeline.run_lengths().expand().tolist() == active
            columns = fast.metrics.columns
            assert (columns.first_token - 1).tolist() == [starts[r.id] for r in requests]
            if size <= 1000:  # the step-by-step scheduler: everything, bit for bit
                slow = simulate(requests, make_scheduler(policy, slots), fast=False)
                assert fast == slow and slow == fast
                assert fast.metrics.summary() == slow.metrics.summary()


@settings(max_examples=100, deadline=None)
@given(outputs_st, st.integers(1, 8), st.randoms(use_true_random=False))
def test_columnar_metrics_equal_the_recorders(outputs, slots, rng):
    requests = make_requests(outputs, [rng.randint(0, 40) for _ in outputs])
    for policy in ("static", "continuous"):
        fast = simulate(requests, make_scheduler(policy, slots)).metrics
        slow = simulate(requests, make_scheduler(policy, slots), fast=False).metrics
        assert isinstance(fast, ColumnarRunMetrics)
        assert fast.requests == slow.requests and fast.tbt_counts == slow.tbt_counts
        assert fast.summary() == slow.summary()  # identical floats, nan where both are nan


def test_workload_columns_and_request_lists_simulate_alike():
    columns = lognormal_columns(2000, seed=4, arrival_rate=3.0)
    listed = lognormal_workload(2000, seed=4, arrival_rate=3.0)
    assert columns == Workload.of(listed) and columns.to_requests() == listed
    assert run_policies(columns, 32) == run_policies(listed, 32)
    assert [row["total_steps"] for row in occupancy_table(lognormal_columns(600, seed=3), 32)] == [
        10089,
        2576,
    ]


# --- the article's experiment C --------------------------------------------------------------


def test_article_reproduction_over_seeds():
    rows = {seed: occupancy_table(lognormal_workload(600, seed=seed), 32) for seed in range(5)}
    for seed_rows in rows.values():
        static, continuous = seed_rows
        assert 0.17 <= static["occupancy"] <= 0.27
        assert 0.70 <= continuous["occupancy"] <= 0.97
        assert 3.3 <= continuous["speedup_vs_static"] <= 5.0
        assert static["speedup_vs_static"] == 1.0
    # The seed shared/reference.md quotes: 10,089 vs 2,576 steps, 20.4% vs 79.9%, 3.92x.
    static, continuous = rows[3]
    assert (static["total_steps"], continuous["total_steps"]) == (10089, 2576)
    assert round(static["occupancy"], 3) == 0.204 and round(continuous["occupancy"], 3) == 0.799


def test_occupancy_table_rows_and_timeline_rows():
    requests = make_requests([3, 1, 1, 1])
    rows = occupancy_table(requests, 2)
    assert rows == [
        {
            "policy": "static",
            "requests": 4,
            "slots": 2,
            "total_steps": 4,
            "useful_slot_steps": 6,
            "idle_slot_steps": 2,
            "occupancy": 0.75,
            "speedup_vs_static": 1.0,
        },
        {
            "policy": "continuous",
            "requests": 4,
            "slots": 2,
            "total_steps": 3,
            "useful_slot_steps": 6,
            "idle_slot_steps": 0,
            "occupancy": 1.0,
            "speedup_vs_static": 4 / 3,
        },
    ]
    timeline = timeline_rows(run_policies(requests, 2))
    assert [(r["policy"], r["step"], r["active_slots"]) for r in timeline] == [
        ("static", 0, 2),
        ("static", 1, 1),
        ("static", 2, 1),
        ("static", 3, 2),
        ("continuous", 0, 2),
        ("continuous", 1, 2),
        ("continuous", 2, 2),
    ]


def test_same_seed_same_simulation():
    def run():
        requests = lognormal_workload(300, seed=11, arrival_rate=1.5)
        return run_policies(requests, 16)

    assert run() == run()


# --- chunked prefill: the generation stall ----------------------------------------------------

COST = StepCostModel(base_s=0.005, per_decode_token_s=0.0002, per_prefill_token_s=0.00005)


def stall_trace() -> list[Request]:
    """Four chats decoding when a 4,096-token prompt arrives at step 10."""
    chats = [Request(i, 16, 50) for i in range(4)]
    return [*chats, Request(4, 4096, 5, arrival_step=10)]


def test_long_prefill_stalls_decodes_without_chunking_and_chunks_shrink_the_stall():
    plain = simulate(stall_trace(), make_scheduler("continuous", 8), COST)
    chunked = simulate(
        stall_trace(),
        make_scheduler(
            "continuous", 8, chunked_prefill=True, chunk_size=256, max_num_batched_tokens=512
        ),
        COST,
    )
    stall = plain.metrics.summary()["tbt_max"]
    # The step holding the whole prompt: 5 ms + 4 decodes + 4,096 prefill tokens.
    assert stall == pytest.approx(0.005 + 4 * 0.0002 + 4096 * 0.00005)
    assert chunked.metrics.summary()["tbt_max"] == pytest.approx(0.005 + 4 * 0.0002 + 256 * 0.00005)
    assert chunked.metrics.summary()["tbt_max"] < 0.1 * stall
    # The price: the long request waits for 16 chunks before its first token.
    ttft = {m.request_id: m.ttft for m in chunked.metrics.requests}
    ttft_plain = {m.request_id: m.ttft for m in plain.metrics.requests}
    assert ttft[4] > ttft_plain[4]
    assert max(chunked.timeline.prefill_tokens) == 256


SCHEMES = {  # the Sarathi-Serve ablation; chunked schemes get a 512-token budget per step
    "mixed, no chunks": {"mixed": True, "chunked_prefill": False},
    "chunks, no mixing": {"mixed": False, "chunked_prefill": True, "chunk_size": 256},
    "both": {"mixed": True, "chunked_prefill": True, "chunk_size": 256},
}


def ablation(seed: int) -> dict[str, dict[str, float]]:
    """A loaded server: one request per 10 steps, a fifth of them with 2,048-token prompts."""
    requests = lognormal_workload(
        300, seed=seed, arrival_rate=0.1, long_prompt_fraction=0.2, long_prompt_len=2048
    )
    summaries = {}
    for name, scheme in SCHEMES.items():
        budget = 512 if scheme["chunked_prefill"] else None
        sched = make_scheduler("continuous", 16, max_num_batched_tokens=budget, **scheme)
        summaries[name] = simulate(requests, sched, COST).metrics.summary()
    return summaries


@pytest.mark.parametrize("seed", [5, 6])
def test_sarathi_ablation_ordering_in_simulation(seed):
    s = ablation(seed)
    mixed, chunks_only, both = s["mixed, no chunks"], s["chunks, no mixing"], s["both"]
    # Paper (Yi-34B): P99 TBT both < chunks only < mixed; P50 TTFT mixed < both < chunks only.
    assert both["tbt_p99"] < chunks_only["tbt_p99"] < mixed["tbt_p99"]
    assert mixed["ttft_p50"] < both["ttft_p50"] < chunks_only["ttft_p50"]
    # The stall of a whole 2,048-token prefill is what dominates the mixed scheme's tail.
    assert mixed["tbt_max"] >= 2048 * COST.per_prefill_token_s


# --- metrics -----------------------------------------------------------------------------------


def test_percentiles_match_numpy():
    rng = random.Random(3)
    for n in (1, 2, 5, 100):
        values = [rng.choice([0.5, 1.0, 2.0, rng.random()]) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))
            assert counts_percentile(Counter(values), q) == pytest.approx(np.percentile(values, q))
    assert summarize([1.0, 2.0, 3.0, 10.0]) == {
        "mean": 4.0,
        "p50": 2.5,
        "p99": pytest.approx(9.79),
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 10**6) | st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=80),
    st.sampled_from([0, 1, 12.5, 50, 90, 99, 99.9, 100]),
)
def test_array_percentiles_are_the_counts_definition_bit_for_bit(values, q):
    expected = counts_percentile(Counter(values), q)
    assert percentile(values, q) == expected
    assert percentile(np.array(values, dtype=np.float64), q) == expected
    assert summarize(np.array(values)) == summarize(values)
    ints = [int(v) for v in values]
    # An integer array (the fast path's steps) sums exactly: the same mean as the list's.
    assert summarize(np.array(ints, dtype=np.int64)) == summarize([float(v) for v in ints])


def test_recorder_converts_steps_to_seconds():
    recorder = TokenRecorder()
    recorder.add(7, arrival_step=1)
    for step in (2, 3, 5):
        recorder.record(7, step)
    in_steps = recorder.metrics().requests[0]
    assert (in_steps.ttft, in_steps.e2e, in_steps.tbt_max) == (2.0, 5.0, 2.0)
    run = recorder.metrics(step_end_times=[1.0, 2.0, 4.0, 5.0, 7.0, 8.0])
    m = run.requests[0]
    assert run.unit == "s"
    assert (m.arrival, m.first_token, m.finish) == (1.0, 4.0, 8.0)
    assert (m.ttft, m.e2e, m.num_tokens) == (3.0, 7.0, 3)
    assert (m.tbt_p50, m.tbt_max) == (2.0, 3.0) and run.tbt_counts == Counter({1.0: 1, 3.0: 1})


def test_simulation_with_cost_model_reports_seconds():
    requests = make_requests([2, 1, 3], arrivals=[0, 0, 1], prompt=10)
    result = simulate(requests, make_scheduler("continuous", 2), COST)
    # Step 0: two prefills (20 tokens); step 1: one decode + prefill 10; then one decode each.
    costs = [0.005 + 20 * 0.00005, 0.005 + 0.0002 + 10 * 0.00005] + [0.005 + 0.0002] * 2
    assert result.step_end_times == pytest.approx(list(np.cumsum(costs)))
    assert result.total_time == pytest.approx(sum(costs)) and result.total_steps == 4
    m = {x.request_id: x for x in result.metrics.requests}
    assert m[2].ttft == pytest.approx(costs[1]) and m[0].e2e == pytest.approx(sum(costs[:2]))


# --- step-cost model ----------------------------------------------------------------------------


def test_fit_step_cost_recovers_a_linear_model():
    truth = StepCostModel(0.002, 0.0001, 0.00002, 0.000001)
    rng = random.Random(0)
    samples = []
    for _ in range(30):
        d, p, c = rng.randint(0, 64), rng.randint(0, 2048), rng.randint(0, 50_000)
        seconds = truth.base_s + truth.per_decode_token_s * d + truth.per_prefill_token_s * p
        samples.append((d, p, c, seconds + truth.per_context_token_s * c))
    fitted = fit_step_cost(samples)
    for name in ("base_s", "per_decode_token_s", "per_prefill_token_s", "per_context_token_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6)


def test_fit_step_cost_without_a_feature_and_with_too_few_samples():
    decode_only = [(b, 0, 0, 0.001 + 0.0003 * b) for b in (1, 8, 32)]
    fitted = fit_step_cost(decode_only)
    assert fitted.per_prefill_token_s == 0.0 and fitted.per_context_token_s == 0.0
    assert fitted.per_decode_token_s == pytest.approx(0.0003)
    with pytest.raises(ValueError):
        fit_step_cost([(4, 0, 0, 0.002)])


def test_a_step_after_its_batch_changed_pays_the_settle_term_and_its_decay():
    """settle_s at the step whose requests changed, settle_decay times as much each step on;
    scaling the model scales the cost, never the decay (a ratio)."""
    from benchbatch.core.plans import DecodeEntry, StepPlan

    model = StepCostModel(0.004, 0.001, 0.0, settle_s=0.002, settle_decay=0.5)
    decode = (DecodeEntry(0, 0, 10),)
    costs = [model(StepPlan(k, decode, since_change=k)) for k in range(4)]
    assert costs == pytest.approx([0.007, 0.006, 0.0055, 0.00525])
    twice = model.scaled(2.0)
    assert twice.settle_s == 0.004 and twice.settle_decay == 0.5
    assert twice(StepPlan(1, decode, since_change=1)) == pytest.approx(2 * costs[1])
    # Without the term (every fit but an endpoint's) a plan is priced as before.
    assert StepCostModel(0.004, 0.001, 0.0)(StepPlan(0, decode, since_change=0)) == 0.005
