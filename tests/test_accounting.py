"""Accounting against torch's own FLOP counter and against explicit attention."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchbatch.core import accounting as acc
from benchbatch.core.config import ModelConfig, RopeScaling, preset
from benchbatch.runtime.model import Transformer

SHAPES = [
    preset("tiny"),  # GQA: 4 heads over 2 KV heads
    ModelConfig(hidden=96, layers=3, heads=6, vocab=300, max_context=128),  # MHA
    ModelConfig(
        hidden=64, layers=2, heads=8, kv_heads=1, intermediate=200, vocab=128, max_context=128
    ),  # MQA, odd MLP width
    ModelConfig(
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=32,
        vocab=128,
        max_context=128,
        tie_embeddings=True,
        qk_norm=True,
    ),  # Qwen3: head_dim apart from hidden, q/k norm, tied
    ModelConfig(
        hidden=64, layers=2, heads=4, kv_heads=1, vocab=128, max_context=128, qkv_bias=True
    ),  # Qwen2: q/k/v bias
    ModelConfig(
        hidden=64,
        layers=2,
        heads=4,
        vocab=128,
        max_context=128,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        rope_scaling=RopeScaling("linear", 2.0),
    ),  # Llama with attention_bias and mlp_bias
]
IDS = ["gqa", "mha", "mqa", "qwen3", "qwen2", "llama-bias"]


def counted(fn) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("cfg", SHAPES, ids=IDS)
def test_matmul_flops_equal_torch_counter_on_full_forward(cfg):
    model = Transformer(cfg)
    tokens = torch.randint(0, cfg.vocab, (3, 17))
    cost = acc.step_cost(cfg, "fp32", 3, 17, 0, logits_per_seq=17)
    # On CPU the counter counts scaled_dot_product_attention as 0: matmuls only.
    assert counted(lambda: model(tokens)) == cost.linear_flops + cost.lm_head_flops


@pytest.mark.parametrize("cfg", SHAPES, ids=IDS)
@pytest.mark.parametrize("batch,tokens,context", [(1, 1, 9), (4, 1, 30), (2, 12, 0), (2, 5, 7)])
def test_matmul_flops_equal_torch_counter_on_cached_steps(cfg, batch, tokens, context):
    model = Transformer(cfg)
    cache = model.new_cache(batch, context + tokens)
    cache.lengths.fill_(context)
    x = torch.randint(0, cfg.vocab, (batch, tokens))
    cost = acc.step_cost(cfg, "fp32", batch, tokens, context)
    flops = counted(lambda: model.step(x, cache, slice(0, batch), kv_len=context + tokens))
    assert flops == cost.linear_flops + cost.lm_head_flops


@pytest.mark.parametrize("cfg", SHAPES[:2], ids=IDS[:2])
def test_mixed_step_flops_equal_torch_counter_and_weights_are_read_once(cfg):
    model = Transformer(cfg)
    b, context, p, start = 3, 9, 5, 4
    cache = model.new_cache(b + 1, max(context + 1, start + p))
    cache.lengths[:b].fill_(context)
    cache.lengths[b:].fill_(start)
    parts = [
        (torch.randint(0, cfg.vocab, (1, p)), slice(b, b + 1), start + p),
        (torch.randint(0, cfg.vocab, (b, 1)), slice(0, b), context + 1),
    ]
    flops, nbytes = acc.mixed_cost(cfg, "fp32", b, context, p, start)
    decode = acc.step_cost(cfg, "fp32", b, 1, context)
    chunk = acc.step_cost(cfg, "fp32", 1, p, start)
    counted_flops = counted(lambda: model.mixed_step(cache, parts))
    assert counted_flops == decode.linear_flops + decode.lm_head_flops + chunk.linear_flops + (
        chunk.lm_head_flops
    )
    assert flops == decode.flops + chunk.flops
    weights = (acc.total_params(cfg) - (0 if cfg.tie_embeddings else cfg.vocab * cfg.hidden)) * 4
    assert nbytes == decode.bytes + chunk.bytes - weights
    assert acc.mixed_cost(cfg, "fp32", b, context) == (decode.flops, decode.bytes)


def explicit_causal_attention(q, k, v, context):
    """Each query against exactly the keys it may see, with plain matmuls (countable)."""
    outs = []
    for i in range(q.shape[2]):
        keys, values = k[:, :, : context + i + 1], v[:, :, : context + i + 1]
        weights = torch.softmax(q[:, :, i : i + 1] @ keys.transpose(-1, -2), dim=-1)
        outs.append(weights @ values)
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("tokens,context", [(1, 0), (1, 25), (8, 0), (6, 11)])
def test_attention_flops_equal_explicit_causal_matmuls(tokens, context):
    cfg = preset("tiny")
    batch, heads, d = 3, cfg.heads, cfg.head_dim
    q = torch.randn(batch, heads, tokens, d)
    k = torch.randn(batch, heads, context + tokens, d)
    v = torch.randn(batch, heads, context + tokens, d)
    per_layer = counted(lambda: explicit_causal_attention(q, k, v, context))
    cost = acc.step_cost(cfg, "fp32", batch, tokens, context)
    assert cost.attention_flops == cfg.layers * per_layer


def test_dense_attention_counts_the_masked_half_too():
    cfg = preset("tiny")
    q = torch.randn(2, cfg.heads, 10, cfg.head_dim)
    k = torch.randn(2, cfg.heads, 10, cfg.head_dim)
    dense = counted(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ k)
    assert acc.dense_attention_flops(cfg, 2, 10, 0) == cfg.layers * dense
    useful = acc.step_cost(cfg, "fp32", 2, 10, 0).attention_flops
    assert useful * 2 * 10 == acc.dense_attention_flops(cfg, 2, 10, 0) * 11


def test_published_parameter_counts():
    assert acc.total_params(preset("llama2-7b")) == 6_738_415_616
    assert acc.total_params(preset("llama3-8b")) == 8_030_261_248
    # Qwen3-0.6B as published, its 28 x 2 x 128 q/k norm weights included.
    assert acc.total_params(preset("qwen3-0.6b")) == 596_049_920
    # Qwen2.5-0.5B: 494,032,768 published, q/k/v biases included (no preset: by hand).
    qwen25 = ModelConfig(
        hidden=896,
        layers=24,
        heads=14,
        kv_heads=2,
        intermediate=4864,
        vocab=151936,
        tie_embeddings=True,
        qkv_bias=True,
    )
    assert acc.total_params(qwen25) == 494_032_768
    assert acc.total_params(preset("llama3.2-1b")) == 1_235_814_400


def test_parameters_match_the_model():
    for cfg in SHAPES:
        model = Transformer(cfg)
        assert sum(p.numel() for p in model.parameters()) == acc.total_params(cfg)


def test_rotary_tables_are_resident_but_a_step_reads_its_rows():
    cfg = preset("llama3.2-1b")  # 131,072 positions x 32 angles, cos and sin, 2 bytes each
    assert acc.rotary_table_bytes(cfg, "bf16") == 16 * 2**20
    assert acc.weight_bytes(cfg, "bf16") == 2 * 1_235_814_400 + 16 * 2**20
    small = acc.step_cost(cfg.replace(max_context=1024), "bf16", 3, 5, 7)
    big = acc.step_cost(cfg, "bf16", 3, 5, 7)
    assert big == small  # the step gathers 15 rows, whatever the table's length


def test_rotary_tables_bytes_match_the_model_buffers():
    for cfg in SHAPES:
        model = Transformer(cfg)
        buffers = model.rope_cos.nbytes + model.rope_sin.nbytes
        assert buffers == acc.rotary_table_bytes(cfg, "fp32")


def test_decode_bytes_are_weights_plus_kv_cache():
    cfg = preset("article")
    cost = acc.decode_cost(cfg, "fp16", batch=1, context=512)
    per_token_kv = cfg.layers * 2 * cfg.kv_dim * 2
    assert cost.kv_read_bytes == 513 * per_token_kv
    assert cost.kv_write_bytes == per_token_kv
    # every matmul weight and norm once; of the embedding table only the token's row, of
    # the rotary tables only its position's cos and sin rows (head_dim / 2 values each)
    matmul_weights = acc.linear_params(cfg) + cfg.vocab * cfg.hidden
    norms = (2 * cfg.layers + 1) * cfg.hidden
    assert cost.weight_bytes == (matmul_weights + norms + cfg.hidden + cfg.head_dim) * 2
    assert cost.arithmetic_intensity < 1.5  # decode at batch 1: about 1 FLOP per byte


def test_intensity_grows_with_batch_and_article_figure_is_tokens():
    cfg = preset("article")
    small = acc.decode_cost(cfg, "fp16", 1, 512)
    big = acc.decode_cost(cfg, "fp16", 32, 512)
    assert big.arithmetic_intensity > 10 * small.arithmetic_intensity
    assert (small.tokens_per_weight_read, big.tokens_per_weight_read) == (1, 32)
    assert acc.prefill_cost(cfg, "fp16", 1, 2048).tokens_per_weight_read == 2048


def test_article_flops_per_token_is_12_layers_of_2048_squared_plus():
    # The article's 12 plain 2048x2048 linears: 100.7 MFLOP per token. The real block has
    # 4 attention projections and a 3-matrix MLP: 2 x (4 x 2048^2 + 3 x 2048 x 5632) per layer.
    cfg = preset("article")
    per_token = acc.step_cost(cfg, "fp16", 1, 1).linear_flops
    assert per_token == 12 * 2 * (4 * 2048**2 + 3 * 2048 * 5632)


def test_max_batch_by_hand():
    cfg = ModelConfig(hidden=1024, layers=8, heads=8, intermediate=4096, vocab=1000)
    weights = acc.weight_bytes(cfg, "fp16")
    kv_per_seq = 8 * 2 * 1024 * 2 * 1000  # layers x (k, v) x kv_dim x bytes x context
    assert acc.kv_cache_bytes(cfg, "fp16", 1, 1000) == kv_per_seq
    per_seq = kv_per_seq + acc.step_workspace_bytes(cfg, "fp16", 1)
    free = weights + 10 * per_seq + 123
    assert acc.max_batch(cfg, "fp16", 1000, free, reserve_fraction=0.0) == 10
    assert acc.max_batch(cfg, "fp16", 1000, weights // 2) == 0


@pytest.mark.parametrize("context", [1, 16, 17, 65])
def test_a_paged_caches_bytes_are_the_blocks_it_allocates(context):
    """sweep --kv-layout paged counted the contiguous cache: 8,519,680 bytes where the paged
    one allocated 10,747,904 (each sequence in whole blocks, and one scratch block), so its
    memory ceiling let through batches that do not fit. The count is the tensors' own."""
    from benchbatch.runtime.kvcache import PagedKVCache

    cfg = preset("tiny")
    cache = PagedKVCache.per_slot(cfg, 8, context, 16, torch.device("cpu"), torch.float32)
    allocated = cache.k.nbytes + cache.v.nbytes
    assert acc.kv_cache_bytes(cfg, "fp32", 8, context, block_size=16) == allocated
    assert acc.kv_cache_bytes(cfg, "fp32", 8, context) <= allocated
    big = 10 * 2**30
    paged = acc.max_batch(cfg, "fp32", context, big, block_size=16)
    assert paged <= acc.max_batch(cfg, "fp32", context, big)
    # the batch it allows fits (weights, KV blocks, workspace) and one more does not
    usable = int(big * 0.9) - acc.weight_bytes(cfg, "fp32")
    need = lambda b: (acc.kv_cache_bytes(cfg, "fp32", b, context, block_size=16)  # noqa: E731
                      + b * acc.step_workspace_bytes(cfg, "fp32", 1))
    assert need(paged) <= usable < need(paged + 1)
