"""Requests that end early at an end-of-sequence token, and the lengths they leave behind.

A request that stops after s of its n forced tokens must schedule exactly as a request that
was given s tokens to begin with; the engine must produce each request's tokens alone, cut
at the first stop token; the observed lengths must replay through a trace.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.core.config import preset
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import simulate
from benchbatch.core.trace import read_trace, trace_rows
from benchbatch.core.workload import Request, lognormal_workload, with_prompts
from benchbatch.errors import UserError
from benchbatch.output.results import write_trace
from benchbatch.runtime.engine import Engine, run_alone
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.records import observed_requests

SETTINGS = [
    {},
    {"max_num_batched_tokens": 12, "chunked_prefill": True, "chunk_size": 5},
    {"max_num_batched_tokens": 16, "chunked_prefill": True, "mixed": False},
]


def drive(sched, requests, stop_at: dict[int, int] | None = None) -> list:
    """Run to completion; request r stops (early) at its stop_at[r]-th token."""
    sched.add_requests(requests)
    got, plans = Counter(), []
    while not sched.done:
        assert len(plans) < 10_000, "no progress"
        plan = sched.schedule()
        produced = [d.request_id for d in plan.decodes]
        produced += [c.request_id for c in plan.prefills if c.completes_prompt]
        got.update(produced)
        stopped = [r for r in produced if stop_at and got[r] == stop_at[r]]
        sched.update(plan, stopped)
        plans.append(plan)
    return plans


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(1, 20), st.integers(0, 6)),
        min_size=1,
        max_size=12,
    ),
    policy=st.sampled_from(["static", "continuous"]),
    setting=st.sampled_from(range(len(SETTINGS))),
)
def test_a_stopped_request_schedules_as_if_it_were_that_short(data, policy, setting):
    forced = [Request(i, p, max(n, s), a) for i, (n, s, p, a) in enumerate(data)]
    stop_at = {i: min(n, s) for i, (n, s, _, _) in enumerate(data)}
    short = [Request(r.id, r.prompt_tokens, stop_at[r.id], r.arrival_step) for r in forced]
    stopped = make_scheduler(policy, 3, **SETTINGS[setting])
    plain = make_scheduler(policy, 3, **SETTINGS[setting])
    assert drive(stopped, forced, stop_at) == drive(plain, short)
    assert stopped.recorder.token_steps == plain.recorder.token_steps


def test_a_request_cannot_stop_without_a_token():
    sched = make_scheduler("continuous", 2)
    sched.add_requests([Request(0, 4, 5), Request(1, 4, 5, arrival_step=3)])
    plan = sched.schedule()
    with pytest.raises(AssertionError, match="stopped without a token"):
        sched.update(plan, [1])


# --- the engine ----------------------------------------------------------------------------

SLOTS = 3


@pytest.fixture(scope="module")
def model():
    return Transformer(preset("tiny"), seed=5)


@pytest.fixture(scope="module")
def requests():
    base = lognormal_workload(10, median=12, sigma=0.5, max_output=24, prompt_len=5, seed=4)
    return [Request(r.id, 5 + (r.id % 2) * 4, r.output_tokens, r.id // 3) for r in base]


@pytest.fixture(scope="module")
def alone(model, requests):
    return {r.id: run_alone(model, r, seed=2) for r in requests}


@pytest.fixture(scope="module")
def stop(alone):
    """A token the model really generates mid-sequence: the tiny model's 'end-of-sequence'."""
    counts = Counter(t for out in alone.values() for t in out[1:-1])
    token = counts.most_common(1)[0][0]
    assert sum(token in out[:-1] for out in alone.values()) >= 3  # several requests end early
    return token


def cut(tokens: list[int], stop: int) -> list[int]:
    return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens


def test_the_reference_stops_too(model, requests, alone, stop):
    for r in requests[:4]:
        assert run_alone(model, r, seed=2, stop_tokens={stop}) == cut(alone[r.id], stop)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_engine_stops_each_request_at_its_first_stop_token(model, requests, alone, stop, policy):
    result = Engine(model, policy, SLOTS, seed=2, stop_tokens={stop}).run(requests)
    for r in requests:
        assert result.tokens[r.id] == cut(alone[r.id], stop), f"request {r.id}"
    observed = observed_requests(requests, result)
    assert [r.output_tokens for r in observed] == [len(result.tokens[r.id]) for r in requests]
    assert sum(r.output_tokens for r in observed) < sum(r.output_tokens for r in requests)
    # The simulator replays the lengths that came out step for step.
    sim = simulate(observed, make_scheduler(policy, SLOTS))
    assert result.total_steps == sim.total_steps
    assert [s.active for s in result.steps] == sim.timeline.active_slots


def test_observed_lengths_round_trip_through_a_trace(model, requests, stop, tmp_path):
    result = Engine(model, "continuous", SLOTS, seed=2, stop_tokens={stop}).run(requests)
    observed = observed_requests(requests, result)
    path = tmp_path / "trace.csv"
    write_trace(path, observed)
    assert path.read_text().splitlines()[0] == "prompt_tokens,output_tokens,arrival_step"
    assert read_trace(path) == observed
    assert trace_rows(observed)[3] == {
        "prompt_tokens": observed[3].prompt_tokens,
        "output_tokens": observed[3].output_tokens,
        "arrival_step": observed[3].arrival_step,
    }


def test_real_prompt_ids_are_what_the_model_reads(model, requests):
    prompts = [[1, 2, 3], [200, 17, 9, 9, 4, 250], [7]]
    real = with_prompts(requests[:5], prompts, output_tokens=6)
    assert [r.prompt_tokens for r in real] == [3, 6, 1, 3, 6]
    assert real[3].prompt_ids == (1, 2, 3) and all(r.output_tokens == 6 for r in real)
    result = Engine(model, "continuous", SLOTS, seed=2).run(real)
    for r in real:
        assert result.tokens[r.id] == run_alone(model, r, seed=2)
    # The same prompt gives the same tokens, whatever the request's id and seed.
    assert result.tokens[0] == result.tokens[3] == run_alone(model, real[0], seed=9)


def test_prompt_ids_outside_the_vocabulary(model):
    bad = with_prompts([Request(0, 1, 2)], [[3, 256]])
    with pytest.raises(UserError, match="token id 256, outside the model's vocabulary of 256"):
        Engine(model, "continuous", SLOTS).run(bad)


def test_without_stop_tokens_nothing_changes(model, requests, alone):
    forced = Engine(model, "continuous", SLOTS, seed=2).run(requests)
    assert forced.output_lengths == {r.id: r.output_tokens for r in requests}
    assert dict(forced.tokens) == alone
