"""Chunked prefill and the budgets on the real engine (tiny model, CPU, fp32): chunks change
no token, every executed step stays within its budgets, and the engine runs exactly the
scheduler's (simulated) steps under each of the ablation's schemes."""

from __future__ import annotations

import pytest

from benchbatch.core.config import preset
from benchbatch.core.simulate import simulate
from benchbatch.core.workload import Request
from benchbatch.experiments.ablation import probe as ablation
from benchbatch.runtime.engine import Engine, run_alone
from benchbatch.runtime.model import Transformer

SEQS, BUDGET = 3, 12
SCHEME_SETTINGS = {  # chunk 5 divides no prompt below: every prompt ends in a short chunk
    s: ablation.scheme_settings(s, ablation.Budgets(SEQS, BUDGET, 5)) for s in ablation.SCHEMES
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return Transformer(preset("tiny"), seed=3)


@pytest.fixture(scope="module")
def requests():
    """Short chats and two long prompts (longer than the budget), arriving over time."""
    prompts = [6, 23, 4, 9, 31, 7, 5]
    outputs = [7, 4, 9, 3, 5, 8, 6]
    arrivals = [0, 0, 1, 2, 2, 5, 9]
    return [Request(i, *x) for i, x in enumerate(zip(prompts, outputs, arrivals, strict=True))]


@pytest.fixture(scope="module")
def alone(model, requests):
    return {r.id: run_alone(model, r, seed=4) for r in requests}


@pytest.fixture(scope="module", params=list(SCHEME_SETTINGS))
def scheme_run(request, model, requests):
    settings = SCHEME_SETTINGS[request.param]
    result = Engine(model, "continuous", SEQS, seed=4, **settings).run(requests)
    return request.param, settings, result


def test_chunked_tokens_equal_unchunked_and_each_request_alone(scheme_run, alone, requests):
    scheme, _, result = scheme_run
    for r in requests:
        assert result.tokens[r.id] == alone[r.id], f"{scheme}: request {r.id}"


def test_every_executed_step_stays_within_the_budgets(scheme_run, requests):
    scheme, settings, result = scheme_run
    budget = settings.get("max_num_batched_tokens")
    for s in result.steps:
        assert s.active <= SEQS
        if budget is not None:
            assert s.decode_tokens + s.prefill_tokens <= budget, (scheme, s)
        if not settings["mixed"]:
            assert not (s.decode_tokens and s.prefill_tokens), f"{scheme} mixed a step: {s}"
    assert sum(s.prefill_tokens for s in result.steps) == sum(r.prompt_tokens for r in requests)
    if settings["chunked_prefill"]:  # the long prompts really were split
        assert max(s.prefill_tokens for s in result.steps) <= BUDGET


def test_the_engine_takes_the_simulated_steps(scheme_run, requests):
    scheme, _, result = scheme_run
    sim = simulate(requests, ablation.make(scheme, ablation.Budgets(SEQS, BUDGET, 5)))
    assert result.total_steps == sim.total_steps
    assert [s.decode_tokens for s in result.steps] == sim.timeline.decode_tokens
    assert [s.prefill_tokens for s in result.steps] == sim.timeline.prefill_tokens


def test_chunk_sizes_change_no_token(model, requests, alone):
    for chunk in (1, 2, 7, 31):
        eng = Engine(model, "continuous", 2, seed=4, chunked_prefill=True, chunk_size=chunk)
        result = eng.run(requests)
        assert {r.id: result.tokens[r.id] for r in requests} == alone, f"chunk {chunk}"
