"""The paged KV cache: the same logits and tokens as the contiguous one, through block tables
in any order, and preempted requests (freed, recomputed) finish with the tokens they would
have had without preemption. Tiny model, fp32, CPU."""

from __future__ import annotations

import pytest
import torch

from benchbatch.core.kvblocks import PAGED, RESERVE, KVBudget
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import simulate
from benchbatch.core.workload import Request, lognormal_workload
from benchbatch.runtime.engine import Engine, run_alone
from benchbatch.runtime.kvcache import KVCache, PagedKVCache

pytestmark = pytest.mark.usefixtures("one_thread")


def both_caches(model, slots: int, max_len: int, block_size: int):
    contiguous = model.new_cache(slots, max_len)
    paged = model.new_cache(slots, max_len, "paged", block_size)
    assert isinstance(contiguous, KVCache) and isinstance(paged, PagedKVCache)
    return contiguous, paged


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_logits_equal_contiguous_through_prefill_decode_and_mixed_steps(
    tiny_model, block_size
):
    torch.manual_seed(0)
    vocab = tiny_model.cfg.vocab
    prompts = torch.randint(0, vocab, (4, 11))
    out = {}
    with torch.no_grad():
        for cache in both_caches(tiny_model, 4, 40, block_size):
            logits = [tiny_model.step(prompts, cache, slice(0, 4))]
            token = logits[-1][:, -1].argmax(-1)[:, None]
            for _ in range(5):  # decodes over every slot, then a gathered subset
                logits.append(tiny_model.step(token, cache, torch.tensor([0, 1, 2, 3])))
                token = logits[-1][:, -1].argmax(-1)[:, None]
            logits.append(tiny_model.step(token[[3, 1]], cache, torch.tensor([3, 1])))
            parts = [(token[[0]], torch.tensor([0]), None), (prompts[2:, :4], slice(2, 4), None)]
            logits += tiny_model.mixed_step(cache, parts)  # a decode and chunks together
            out[type(cache).__name__] = logits
    for a, b in zip(out["KVCache"], out["PagedKVCache"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_cached_paged_decode_equals_the_full_forward(tiny_model):
    tokens = torch.randint(0, tiny_model.cfg.vocab, (2, 9))
    with torch.no_grad():
        cache = tiny_model.new_cache(2, 16, "paged", 4)
        tiny_model.step(tokens[:, :8], cache, slice(0, 2))
        last = tiny_model.step(tokens[:, 8:], cache, slice(0, 2))
        full = tiny_model.forward(tokens)
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)


def test_blocks_land_where_the_block_table_says(tiny_model):
    cfg = tiny_model.cfg
    cache = PagedKVCache(cfg, 2, 8, num_blocks=4, block_size=4, device="cpu", dtype=torch.float32)
    cache.assign(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]), torch.tensor([3, 1, 0]))
    k = torch.arange(2 * 6 * cfg.kv_heads * cfg.head_dim, dtype=torch.float32)
    k = k.view(2, 6, cfg.kv_heads, cfg.head_dim)
    positions = torch.arange(6).expand(2, 6)
    cache.write(0, torch.tensor([0, 1]), positions, k, -k)
    # Slot 0's positions 4..5 sit in block 1 at offsets 0..1; slot 1's 4..5 in the scratch.
    assert torch.equal(cache.k[0][:, 1, :2], k[0, 4:6].transpose(0, 1))
    assert torch.equal(cache.k[0][:, 3], k[0, :4].transpose(0, 1))
    keys, values = cache.read(0, torch.tensor([0]), 6)
    assert torch.equal(keys[0], k[0].transpose(0, 1)) and torch.equal(values[0], -keys[0])
    cache.clear(torch.tensor([0]))
    assert (cache.block_table[0] == cache.scratch).all()


# --- the engine --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def requests():
    base = lognormal_workload(12, median=10, sigma=0.8, max_output=24, prompt_len=5, seed=3)
    return [Request(r.id, 5 + (r.id % 4) * 3, r.output_tokens) for r in base]


@pytest.fixture(scope="module")
def alone(tiny_model, requests):
    return {r.id: run_alone(tiny_model, r, seed=2) for r in requests}


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_the_engine_gives_the_same_tokens_in_either_layout(tiny_model, requests, alone, policy):
    runs = {
        layout: Engine(tiny_model, policy, 4, seed=2, kv_layout=layout, block_size=3).run(requests)
        for layout in ("contiguous", "paged")
    }
    assert runs["paged"].tokens == runs["contiguous"].tokens == alone
    assert [s.active for s in runs["paged"].steps] == [s.active for s in runs["contiguous"].steps]


def test_preempted_requests_finish_with_the_tokens_of_a_run_without_preemption(
    tiny_model, requests, alone
):
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    kv = KVBudget(-(-longest // 4) + 2, 4, PAGED)  # one request at full length, barely
    engine = Engine(tiny_model, "continuous", len(requests), seed=2, kv_layout="paged", kv=kv)
    result = engine.run(requests)
    assert sum(s.preempted for s in result.steps) >= 5  # preempted over and over
    assert result.tokens == alone
    # And the run took the scheduler's steps: those of the simulation on the same budget.
    sim = simulate(requests, make_scheduler("continuous", len(requests), kv=kv))
    assert [s.active for s in result.steps] == sim.timeline.active_slots
    assert [s.kv_blocks for s in result.steps] == sim.timeline.kv_blocks
    assert [s.kv_tokens for s in result.steps] == sim.timeline.kv_tokens


@pytest.mark.parametrize("reserve", [None, 24])
@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_reserving_in_a_budget_sized_pool_changes_no_token(
    tiny_model, requests, alone, policy, reserve
):
    # Room for three reservations. Reserving each request's own output (None), a static
    # group's padded slots write past what they reserved: into the scratch block, never
    # into blocks a slot's earlier occupant held that another request holds now.
    per = -(-max(r.prompt_tokens + (reserve or r.output_tokens) for r in requests) // 4)
    kv = KVBudget(3 * per, 4, RESERVE, reserve)
    result = Engine(tiny_model, policy, len(requests), seed=2, kv_layout="paged", kv=kv).run(
        requests
    )
    assert result.tokens == alone
    assert max(s.active for s in result.steps) >= 3
