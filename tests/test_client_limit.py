"""The simulation behind a client that keeps at most N requests in flight (serve-sweep
--endpoint --max-concurrency, vLLM's bench serve --max-concurrency): checked against what
such a client must do, request by request, on random workloads (hypothesis): at most N
in flight at any moment; the k-th request sent at the later of its arrival and the
(k-N)-th finish of the run (a FIFO client); latencies from the sending; and a limit no run
reaches leaves the simulation as it was without one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import simulate_timed
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.workload import Request

MODEL = StepCostModel(base_s=0.002, per_decode_token_s=0.001, per_prefill_token_s=0.0001,
                      per_context_token_s=0.0)  # fmt: skip

workloads = st.lists(
    st.tuples(st.integers(1, 64), st.integers(1, 12), st.floats(0, 0.2)), min_size=1, max_size=25
)


def run(jobs, limit, policy="continuous", slots=4, delay=0.0):
    requests = [Request(i, p, n) for i, (p, n, _) in enumerate(jobs)]
    gaps = [g for _, _, g in jobs]
    arrivals = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    sched = make_scheduler(policy, slots)
    r = simulate_timed(requests, arrivals, sched, MODEL, delay_s=delay, client_limit=limit)
    return requests, arrivals, r


@settings(max_examples=60, deadline=None)
@given(workloads, st.integers(1, 6), st.sampled_from(["static", "continuous"]),
       st.sampled_from([0.0, 0.003]))  # fmt: skip
def test_a_fifo_client_of_n_slots_sends_and_times_as_it_must(jobs, limit, policy, delay):
    requests, arrivals, r = run(jobs, limit, policy, delay=delay)
    m = {x.request_id: x for x in r.metrics.requests}
    assert sorted(m) == [q.id for q in requests]  # every request served
    sent = {i: m[i].arrival for i in m}  # latencies count from the sending
    finish = {i: m[i].finish for i in m}
    order = sorted(m, key=lambda i: (arrivals[i], i))  # the client sends in arrival order
    finishes = sorted(finish.values())
    for k, i in enumerate(order):
        expected = arrivals[i] if k < limit else max(arrivals[i], finishes[k - limit])
        assert sent[i] == pytest.approx(expected, abs=1e-12), (k, i)
        assert m[i].first_token >= sent[i] + delay - 1e-12
    for i in m:  # at no sending are more than `limit` requests out
        out = sum(1 for j in m if sent[j] <= sent[i] < finish[j] or j == i)
        assert out <= limit


@settings(max_examples=30, deadline=None)
@given(workloads, st.sampled_from(["static", "continuous"]))
def test_a_limit_never_reached_changes_nothing(jobs, policy):
    _, _, free = run(jobs, None, policy)
    _, _, capped = run(jobs, len(jobs), policy)
    assert capped.step_end_times == free.step_end_times
    a = {x.request_id: (x.arrival, x.first_token, x.finish) for x in free.metrics.requests}
    b = {x.request_id: (x.arrival, x.first_token, x.finish) for x in capped.metrics.requests}
    assert a == b


def test_one_slot_serves_one_request_at_a_time():
    jobs = [(8, 3, 0.0), (8, 3, 0.0), (8, 3, 0.0)]  # three at once
    _, _, r = run(jobs, 1)
    m = sorted(r.metrics.requests, key=lambda x: x.request_id)
    assert m[1].arrival == m[0].finish and m[2].arrival == m[1].finish
    ttfts = {round(x.ttft, 12) for x in m}
    assert len(ttfts) == 1  # each alone: the same prefill, from its own sending
    assert max(r.timeline.active_slots) == 1
