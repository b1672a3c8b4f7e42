"""The real engine on a tiny model: batching changes no token, and it takes the simulated steps."""

from __future__ import annotations

import pytest
import torch

from benchbatch.core.config import preset
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import simulate
from benchbatch.core.workload import Request, lognormal_workload
from benchbatch.errors import UserError
from benchbatch.runtime.engine import Engine, run_alone
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.run_state import prompt_ids

SLOTS = 4


@pytest.fixture(scope="module")
def model():
    return Transformer(preset("tiny"), seed=5)


@pytest.fixture(scope="module")
def requests():
    # Mixed prompt lengths: admitted together, unequal prompts take separate prefill calls.
    base = lognormal_workload(14, median=8, sigma=0.8, max_output=30, prompt_len=6, seed=1)
    return [Request(r.id, 6 + (r.id % 3) * 5, r.output_tokens) for r in base]


@pytest.fixture(scope="module")
def alone(model, requests):
    return {r.id: run_alone(model, r, seed=2) for r in requests}


@pytest.fixture(scope="module", params=["static", "continuous"])
def result(request, model, requests):
    return Engine(model, request.param, SLOTS, seed=2).run(requests)


def test_batched_tokens_equal_each_request_alone(result, alone, requests):
    for r in requests:
        assert result.tokens[r.id] == alone[r.id], f"{result.policy}: request {r.id}"


def test_every_request_gets_exactly_its_output_tokens(result, requests):
    assert {rid: len(t) for rid, t in result.tokens.items()} == {
        r.id: r.output_tokens for r in requests
    }
    assert (
        result.generated_tokens
        == result.useful_slot_steps
        == sum(r.output_tokens for r in requests)
    )


def test_real_run_takes_the_simulated_steps(result, requests):
    sim = simulate(requests, make_scheduler(result.policy, SLOTS))
    assert result.total_steps == sim.total_steps
    assert [s.active for s in result.steps] == sim.timeline.active_slots
    assert [s.prefill_tokens for s in result.steps] == sim.timeline.prefill_tokens
    assert result.occupancy == pytest.approx(sim.occupancy)


def test_static_computes_padding_and_continuous_does_not(result, requests):
    """Static: a group's finished slots decode padding until its longest request ends."""
    padded = sum(s.padded for s in result.steps)
    if result.policy == "continuous":
        assert padded == 0
        return
    outputs = [r.output_tokens for r in requests]
    groups = [outputs[i : i + SLOTS] for i in range(0, len(outputs), SLOTS)]
    assert padded == sum(len(g) * max(g) - sum(g) for g in groups)


@pytest.fixture
def fed(monkeypatch):
    """The shapes of the token tensors each forward was fed: one list of (rows, tokens) per
    step, one pair per part."""
    steps = []
    real = Transformer.mixed_step

    def spy(self, cache, parts):
        steps.append([tuple(tokens.shape) for tokens, _, _ in parts])
        return real(self, cache, parts)

    monkeypatch.setattr(Transformer, "mixed_step", spy)
    return steps


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_step_records_count_what_the_model_was_fed(model, requests, fed, policy):
    result = Engine(model, policy, SLOTS, seed=2).run(requests)
    assert len(fed) == result.total_steps  # every request is queued at step 0: no idle step
    for parts, s in zip(fed, result.steps, strict=True):
        assert sum(rows for rows, _ in parts) == s.active + s.padded, s
        assert sum(rows * t for rows, t in parts) == s.prefill_tokens + s.decode_tokens + s.padded


def test_static_decode_batch_is_the_active_plus_the_padded_slots(model, requests, fed):
    """Static, all queued: groups of SLOTS requests in order, each lasting its longest
    request; every step of a group feeds all its slots, finished ones with padding."""
    expected = []  # (active, decode tokens, prefill tokens, padded) per step, by hand
    for i in range(0, len(requests), SLOTS):
        group = requests[i : i + SLOTS]
        outputs = [r.output_tokens for r in group]
        expected.append((len(group), 0, sum(r.prompt_tokens for r in group), 0))
        for k in range(1, max(outputs)):  # token k + 1 of each request still running
            running = sum(n > k for n in outputs)
            expected.append((running, running, 0, len(group) - running))
    result = Engine(model, "static", SLOTS, seed=2).run(requests)
    got = [(s.active, s.decode_tokens, s.prefill_tokens, s.padded) for s in result.steps]
    assert got == expected
    groups = [min(SLOTS, len(requests) - i) for i in range(0, len(requests), SLOTS)]
    rows_fed = [sum(rows for rows, _ in parts) for parts in fed]
    assert rows_fed == [a + p for a, _, _, p in expected]
    assert set(rows_fed) == set(groups)
    assert sum(p for *_, p in expected) > 0  # the workload does pad


def test_times_and_metrics_are_in_seconds(result, requests):
    assert all(s.step_s >= s.model_s > 0 for s in result.steps)
    assert 0 <= result.overhead < 1
    m = result.metrics
    assert m.unit == "s" and len(m.requests) == len(requests)
    ends = result.step_end_times()
    assert max(r.finish for r in m.requests) == pytest.approx(ends[-1])
    assert all(0 < r.ttft <= r.e2e for r in m.requests)


def test_continuous_occupancy_at_least_static(model, requests):
    occ = {p: Engine(model, p, SLOTS).run(requests).occupancy for p in ("static", "continuous")}
    assert occ["continuous"] >= occ["static"]


def test_prompts_depend_on_request_and_seed_only():
    r = Request(7, 12, 3)
    assert torch.equal(prompt_ids(r, 256, 1), prompt_ids(Request(7, 12, 9, 4), 256, 1))
    assert not torch.equal(prompt_ids(r, 256, 1), prompt_ids(Request(8, 12, 3), 256, 1))
    assert not torch.equal(prompt_ids(r, 256, 1), prompt_ids(r, 256, 2))


def test_chunked_prefill_plans_run_and_change_no_token(model):
    """Prefill chunks with start > 0 (issue 6's scheduler settings) run through the model."""
    reqs = [Request(i, 9 + 4 * i, 5 + i) for i in range(5)]
    engine = Engine(model, "continuous", 3, max_num_batched_tokens=8, chunked_prefill=True)
    result = engine.run(reqs)
    for r in reqs:
        assert result.tokens[r.id] == run_alone(model, r)
    sim = simulate(
        reqs, make_scheduler("continuous", 3, max_num_batched_tokens=8, chunked_prefill=True)
    )
    assert result.total_steps == sim.total_steps


def test_interrupted_run_keeps_its_steps(model, requests):
    engine, seen = Engine(model, "continuous", SLOTS), []

    def stop(record):
        seen.append(record)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run(requests, on_step=stop)
    assert engine.result.steps == seen and not engine.result.complete


def test_workload_longer_than_the_model_context_is_a_user_error(model):
    with pytest.raises(UserError) as e:
        Engine(model, "continuous", 2).run([Request(0, 4000, 100)])
    assert e.value.option == "max_output"


def test_a_runs_time_holds_the_host_gaps_between_its_steps():
    """wall_s and the steps' end times (the requests' latencies without arrivals) count
    the host's gaps between steps, which the calibrated price holds in its base: the steps
    alone left 1-2% of a CPU run out, measured over simulated biased low."""
    from benchbatch.runtime.records import EngineResult, StepRecord

    def step(i, step_s, model_s, gap_s):
        return StepRecord("continuous", i, 1, 1, 0, 0, step_s, model_s, gap_s=gap_s)

    result = EngineResult("continuous", 1, 1, [step(0, 0.010, 0.009, None),
                                              step(1, 0.020, 0.018, 0.002),
                                              step(2, 0.030, 0.027, 0.003)])  # fmt: skip
    assert result.wall_s == pytest.approx(0.065)
    assert result.step_end_times() == pytest.approx([0.010, 0.032, 0.065])
    assert result.overhead == pytest.approx((0.065 - 0.054) / 0.065)
