"""Cached decoding against the full forward pass, and slots that do not disturb each other."""

import pytest
import torch

from benchbatch.core.config import ModelConfig, preset
from benchbatch.runtime.model import Transformer

CONFIGS = {
    "gqa": preset("tiny"),
    "mha": ModelConfig(hidden=64, layers=2, heads=4, intermediate=96, vocab=200, max_context=128),
    "mqa-headdim": ModelConfig(
        hidden=48,
        layers=2,
        heads=4,
        kv_heads=1,
        head_dim=16,
        intermediate=96,
        vocab=200,
        max_context=128,
    ),
}
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(params=list(CONFIGS), ids=list(CONFIGS))
def model(request):
    return Transformer(CONFIGS[request.param], seed=3)


@torch.no_grad()
def test_prefill_then_decode_equals_full_forward(model):
    tokens = torch.randint(0, model.cfg.vocab, (3, 24), generator=torch.Generator().manual_seed(0))
    full = model(tokens)  # [3, 24, vocab], plain causal attention, no cache
    cache = model.new_cache(3, 32)
    logits = [model.step(tokens[:, :10], cache, slice(0, 3), all_logits=True)]
    for i in range(10, 24):
        logits.append(model.step(tokens[:, i : i + 1], cache, slice(0, 3)))
    torch.testing.assert_close(torch.cat(logits, dim=1), full, **TOL)
    assert cache.lengths.tolist() == [24, 24, 24]


@torch.no_grad()
def test_prefill_returns_last_token_logits_by_default(model):
    tokens = torch.randint(0, model.cfg.vocab, (2, 9))
    cache = model.new_cache(2, 16)
    last = model.step(tokens, cache, slice(0, 2))
    assert last.shape == (2, 1, model.cfg.vocab)
    torch.testing.assert_close(last, model(tokens)[:, -1:], **TOL)


@torch.no_grad()
def test_chunked_prefill_equals_one_prefill(model):
    tokens = torch.randint(0, model.cfg.vocab, (2, 21))
    one = model.step(tokens, model.new_cache(2, 32), slice(0, 2), all_logits=True)
    cache = model.new_cache(2, 32)
    chunks = [
        model.step(tokens[:, a:b], cache, slice(0, 2), all_logits=True)
        for a, b in ((0, 8), (8, 16), (16, 21))
    ]
    torch.testing.assert_close(torch.cat(chunks, dim=1), one, **TOL)


@torch.no_grad()
def test_slot_logits_do_not_depend_on_other_slots(model):
    """One sequence decoded alone, then beside slots of other lengths and contents."""
    vocab, gen = model.cfg.vocab, torch.Generator().manual_seed(1)
    seq = torch.randint(0, vocab, (1, 15), generator=gen)
    alone_cache = model.new_cache(1, 40)
    model.step(seq[:, :12], alone_cache, slice(0, 1))
    alone = [model.step(seq[:, i : i + 1], alone_cache, slice(0, 1)) for i in range(12, 15)]

    cache = model.new_cache(4, 40)
    others = {0: 30, 1: 3, 3: 7}  # slot -> prompt length (slot 2 holds our sequence)
    for slot, length in others.items():
        prompt = torch.randint(0, vocab, (1, length), generator=gen)
        model.step(prompt, cache, torch.tensor([slot]))
    model.step(seq[:, :12], cache, torch.tensor([2]))
    mixed = []
    for i in range(12, 15):
        batch = torch.tensor([3, 2, 0])  # not contiguous, not in order
        noise = torch.randint(0, vocab, (3, 1), generator=gen)
        noise[1] = seq[0, i]
        mixed.append(model.step(noise, cache, batch)[1:2])
    torch.testing.assert_close(torch.cat(mixed), torch.cat(alone), **TOL)
    assert cache.lengths.tolist() == [33, 3, 15, 10]


@torch.no_grad()
def test_stale_cache_contents_beyond_a_slot_length_are_ignored(model):
    tokens = torch.randint(0, model.cfg.vocab, (1, 10))
    clean = model.new_cache(1, 64)
    dirty = model.new_cache(1, 64)
    dirty.k.normal_()
    dirty.v.normal_()
    a = model.step(tokens, clean, slice(0, 1))
    b = model.step(tokens, dirty, slice(0, 1))
    torch.testing.assert_close(a, b, **TOL)
    step = torch.randint(0, model.cfg.vocab, (1, 1))
    torch.testing.assert_close(
        model.step(step, clean, slice(0, 1), kv_len=64), model.step(step, dirty, slice(0, 1)), **TOL
    )


def test_same_seed_same_weights_and_different_seed_different():
    cfg = preset("tiny")
    a, b, c = Transformer(cfg, seed=5), Transformer(cfg, seed=5), Transformer(cfg, seed=6)
    assert torch.equal(a.blocks[0].mlp.w2.weight, b.blocks[0].mlp.w2.weight)
    assert not torch.equal(a.blocks[0].mlp.w2.weight, c.blocks[0].mlp.w2.weight)
    assert a.blocks[0].mlp.w2.weight.abs().sum() > 0  # random, never zeros


def test_tied_embeddings_share_one_tensor():
    cfg = ModelConfig(hidden=32, layers=1, heads=2, vocab=50, max_context=16, tie_embeddings=True)
    model = Transformer(cfg)
    assert model.lm_head.weight is model.embed.weight


@torch.no_grad()
def test_mixed_step_equals_separate_steps(model):
    """Decodes and prefill chunks in one forward give what separate calls give."""
    vocab, gen = model.cfg.vocab, torch.Generator().manual_seed(4)
    prompts = torch.randint(0, vocab, (3, 6), generator=gen)
    chunk_a = torch.randint(0, vocab, (1, 5), generator=gen)  # a fresh prompt's first chunk
    chunk_b = torch.randint(0, vocab, (1, 4), generator=gen)  # a later chunk of slot 4
    decode = torch.randint(0, vocab, (3, 1), generator=gen)

    def prepared():
        cache = model.new_cache(6, 32)
        model.step(prompts, cache, slice(0, 3))
        model.step(
            torch.randint(0, vocab, (1, 7), generator=torch.Generator()), cache, torch.tensor([4])
        )
        return cache

    apart = prepared()
    expected = [
        model.step(decode, apart, torch.tensor([2, 0, 1])),
        model.step(chunk_a, apart, torch.tensor([3])),
        model.step(chunk_b, apart, torch.tensor([4])),
    ]
    together = prepared()
    got = model.mixed_step(
        together,
        [
            (decode, torch.tensor([2, 0, 1]), None),
            (chunk_a, torch.tensor([3]), None),
            (chunk_b, torch.tensor([4]), None),
        ],
    )
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **TOL)
    assert together.lengths.tolist() == apart.lengths.tolist() == [7, 7, 7, 5, 11, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_equals_the_pairwise_rotation_bit_for_bit(dtype):
    """The model's four-operation rotation (rotary.rotate over rotary.rotation's tables) is
    the textbook pairwise rotation (rotary.apply_rotary) to the last bit."""
    from benchbatch.runtime.rotary import apply_rotary, rotate, rotation

    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 4, 16, generator=g).to(dtype)
    angles = torch.randn(7, 8, generator=g)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    assert torch.equal(rotate(x, *rotation(cos, sin)), apply_rotary(x, cos, sin))
    assert not torch.equal(apply_rotary(x, cos, sin), x)  # it rotates
