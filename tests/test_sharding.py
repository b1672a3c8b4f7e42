"""Tensor parallelism's layout and accounting, as arithmetic (no ranks needed).

The ranks' pieces of every weight cover the whole weight (each row or column once, KV heads
replicated exactly where there are fewer than ranks), one rank's FLOPs and bytes are the
whole model's split as the layout says, the largest batch grows with the ranks, and the
options refuse what cannot be sharded in one line naming --tp.
"""

from __future__ import annotations

import pytest

from benchbatch.core import accounting as acc
from benchbatch.core import sharding
from benchbatch.core.config import ModelConfig, preset
from benchbatch.errors import UserError
from benchbatch.runtime import distributed

LLAMA = preset("llama3-8b")  # 32 heads over 8 KV heads


def covered(pieces: list[sharding.Piece]) -> list[int]:
    return sorted(i for p in pieces for a, b in p.spans for i in range(a, b))


@pytest.mark.parametrize("tp", [2, 4, 8, 16, 32])
def test_pieces_cover_every_weight(tp):
    cfg = LLAMA
    pieces = {
        name: [sharding.piece(f"blocks.0.{name}", cfg, tp, r) for r in range(tp)]
        for name in ("attention.wqkv.weight", "attention.wo.weight", "mlp.w13.weight",
                     "mlp.w2.weight")  # fmt: skip
    }
    q, kv = cfg.q_dim, cfg.kv_dim
    rows = covered(pieces["attention.wqkv.weight"])
    assert [i for i in rows if i < q] == list(range(q))  # every query row once
    kv_rows = [i for i in rows if i >= q]
    copies = max(1, tp // cfg.kv_heads)  # KV heads replicated on tp / kv_heads ranks
    assert kv_rows == sorted(list(range(q, q + 2 * kv)) * copies)
    assert covered(pieces["attention.wo.weight"]) == list(range(q))
    assert covered(pieces["mlp.w13.weight"]) == list(range(2 * cfg.intermediate))
    assert covered(pieces["mlp.w2.weight"]) == list(range(cfg.intermediate))


def test_a_ranks_query_heads_read_its_kv_heads():
    cfg = LLAMA  # group of 4 query heads per KV head
    for tp in (2, 8, 16, 32):
        local = sharding.local_config(cfg, tp)
        for r in range(tp):
            first, last = sharding.kv_head_range(cfg, tp, r)
            queries = range(r * local.heads, (r + 1) * local.heads)
            assert {h // 4 for h in queries} == set(range(first, last))
            assert last - first == local.kv_heads


def test_lm_head_is_vocabulary_parallel_with_padding():
    cfg = preset("tiny").replace(vocab=250)
    pieces = [sharding.piece("lm_head.weight", cfg, 4, r) for r in range(4)]
    assert [p.size for p in pieces] == [63] * 4  # 250 padded to 252
    assert covered(pieces) == list(range(250)) and pieces[-1].pad == 2
    bias = [sharding.piece("blocks.1.mlp.w2.bias", cfg, 4, r) for r in range(4)]
    assert [b.zero for b in bias] == [False, True, True, True]  # added once, by rank 0
    assert sharding.piece("embed.weight", cfg, 4, 1) == sharding.WHOLE


def test_overlap_finds_a_checkpoint_tensors_rows():
    piece = sharding.Piece(0, ((0, 4), (10, 12), (20, 22)))
    assert sharding.overlap(piece, 10, 20) == [(4, 0, 2)]  # k_proj's rows 0..1 at local row 4
    assert sharding.overlap(piece, 0, 10) == [(0, 0, 4)]
    assert sharding.overlap(piece, 18, 30) == [(6, 2, 2)]


@pytest.mark.parametrize(
    "cfg,tp,message",
    [
        (preset("tiny").replace(heads=6, kv_heads=6, hidden=96), 4, "6 attention heads"),
        (ModelConfig(hidden=96, heads=12, kv_heads=3, vocab=64, max_context=64), 4, "3 KV heads"),
        (preset("tiny").replace(intermediate=130), 4, "MLP width 130"),
    ],
)
def test_what_cannot_be_sharded_is_refused_naming_tp(cfg, tp, message):
    with pytest.raises(UserError, match=message) as e:
        sharding.check(cfg, tp)
    assert e.value.option == "tp"


def test_one_ranks_accounting_is_its_share():
    cfg, tp = LLAMA, 4
    whole, part = acc.decode_cost(cfg, "bf16", 8, 512), acc.decode_cost(cfg, "bf16", 8, 512, tp)
    assert part.linear_flops * tp == whole.linear_flops
    assert part.attention_flops * tp == whole.attention_flops
    assert part.lm_head_flops * tp == whole.lm_head_flops  # 128256 splits evenly over 4
    assert part.kv_read_bytes * tp == whole.kv_read_bytes
    embedding = cfg.vocab * cfg.hidden * 2  # replicated on every rank
    assert acc.weight_bytes(cfg, "bf16", tp) == pytest.approx(
        (acc.weight_bytes(cfg, "bf16") - embedding) / tp + embedding, rel=1e-3
    )


def test_replicated_kv_heads_are_counted_on_every_rank():
    cfg = LLAMA  # 8 KV heads over 16 ranks: each rank holds one
    assert acc.kv_bytes_per_token(cfg, "bf16", 16) == acc.kv_bytes_per_token(cfg, "bf16") // 8


def test_a_tied_head_becomes_a_slice_of_its_own():
    tied = preset("qwen3-0.6b")
    untied = tied.replace(tie_embeddings=False)
    head = tied.vocab * tied.hidden
    assert acc.total_params(untied) - acc.total_params(tied) == head  # shared on one device
    assert acc.total_params(untied, 2) == acc.total_params(tied, 2)  # a slice on each rank
    assert acc.total_params(tied, 2) - acc.total_params(tied.replace(vocab=1), 2) == (
        head + sharding.vocab_per_rank(tied, 2) * tied.hidden - tied.hidden - tied.hidden
    )  # the whole embedding and half the head (vocab=1: one row of each)


def test_the_largest_batch_grows_with_the_ranks():
    cfg, free = preset("llama3-8b"), 80 * 2**30
    batches = [acc.max_batch(cfg, "bf16", 4096, free, tp=tp) for tp in (1, 2, 4, 8)]
    assert batches == sorted(batches) and batches[-1] > 8 * batches[0]


def test_bus_bytes_are_nccl_tests():
    assert acc.bus_bytes(1000, 2) == 1000
    assert acc.bus_bytes(1000, 4) == 1500
    assert acc.bus_bytes(1000, 8) == 1750
    assert acc.allreduces_per_step(LLAMA, 1) == 0 and acc.allreduces_per_step(LLAMA, 2) == 64


def test_tp_needs_torchrun_and_must_fit_its_ranks(monkeypatch):
    for name in distributed.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert distributed.resolve_tp(None) == 1 and distributed.resolve_tp(1) == 1
    with pytest.raises(UserError, match="2 ranks need torchrun"):
        distributed.resolve_tp(2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "6")
    assert distributed.resolve_tp(None) == 6 and distributed.resolve_tp(3) == 3
    with pytest.raises(UserError, match="more than the 6 rank"):
        distributed.resolve_tp(8)
    with pytest.raises(UserError, match="do not make groups of 4"):
        distributed.resolve_tp(4)
    assert not distributed.is_writer()
    assert distributed.device_spec("cpu") == "cpu"
    with pytest.raises(UserError, match="cuda:LOCAL_RANK"):
        distributed.device_spec("cuda:0")


def test_without_torchrun_agreeing_is_the_identity():
    assert distributed.together(lambda: 3) == 3
    assert distributed.gather("x") == ["x"]
    assert distributed.slowest(1.0, 2.0) == [1.0, 2.0]
    assert distributed.agree_max(7) == 7 and distributed.least(5) == 5
    assert distributed.agree_any(False) is False
