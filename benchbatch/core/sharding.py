"""Tensor parallelism's layout: which part of every weight a rank holds. Pure arithmetic.

Megatron-style, as gpt-fast and vLLM shard a Llama: each layer's projections in are split by
columns (output features) and its projections out by rows (input features), so a rank
computes whole attention heads and a slice of the MLP width on its own, and one all-reduce
after attention and one after the MLP sum the ranks' partial outputs:

- wqkv ([q | k | v] by rows): rank r keeps the rows of its query heads, and of the KV heads
  those queries read. With at least as many KV heads as ranks they split too; with fewer,
  each KV head is replicated on the ranks whose query heads share it (tp / kv_heads ranks);
- w13 ([gate | up]): rank r keeps its slice of the gate rows and the same slice of the up
  rows, so SiLU(gate) * up stays local;
- wo and w2: the columns that match the rank's heads / MLP slice; their biases are added
  once (rank 0 of the group holds them, the other ranks zeros, so the all-reduce adds them
  once);
- LM head: vocabulary-parallel, rows [r V/tp, (r+1) V/tp) (the vocabulary padded with zero
  rows to a multiple of tp); the logits are gathered for greedy tokens. The embedding stays
  whole on every rank (a step gathers only its tokens' rows), so a tied LM head becomes a
  slice of it of its own;
- norms (and Qwen3's per-head q/k norms) are replicated.

A rank's model is the same code as the whole model's, built on `local_config` (its heads,
KV heads and MLP width), its LM head `vocab_per_rank` wide.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.config import ModelConfig
from benchbatch.errors import UserError

Span = tuple[int, int]  # [start, stop)


def check(cfg: ModelConfig, tp: int, option: str = "tp") -> None:
    """A UserError naming --tp when the model does not split over tp ranks."""
    if tp == 1:
        return
    if cfg.heads % tp:
        raise UserError(
            option, f"{cfg.heads} attention heads do not split over {tp} ranks (tp must divide "
            "--heads)"
        )  # fmt: skip
    kv = cfg.kv_heads
    if kv % tp and tp % kv:
        raise UserError(
            option,
            f"{kv} KV heads neither split over {tp} ranks nor replicate evenly on them (tp must "
            "divide --kv-heads or be a multiple of it)",
        )
    if cfg.intermediate % tp:
        raise UserError(
            option, f"the MLP width {cfg.intermediate} does not split over {tp} ranks (tp "
            "must divide --intermediate)"
        )  # fmt: skip


def kv_heads_per_rank(cfg: ModelConfig, tp: int) -> int:
    """KV heads a rank holds: a share of them, or one replicated head."""
    return max(1, cfg.kv_heads // tp)


def vocab_per_rank(cfg: ModelConfig, tp: int) -> int:
    """Rows of the LM head a rank holds (the vocabulary padded to a multiple of tp)."""
    return -(-cfg.vocab // tp)


def local_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The shapes one rank computes with: its heads, KV heads and MLP width; hidden size,
    head size, vocabulary (its embedding is whole) and everything else unchanged."""
    if tp == 1:
        return cfg
    return cfg.replace(
        heads=cfg.heads // tp,
        kv_heads=kv_heads_per_rank(cfg, tp),
        intermediate=cfg.intermediate // tp,
        head_dim=cfg.head_dim,
    )


def kv_head_range(cfg: ModelConfig, tp: int, rank: int) -> Span:
    """The KV heads rank r's query heads read: a query head h reads KV head h // group."""
    per_rank = kv_heads_per_rank(cfg, tp)
    if cfg.kv_heads >= tp:
        return rank * per_rank, (rank + 1) * per_rank
    first_query = rank * (cfg.heads // tp)
    head = first_query // (cfg.heads // cfg.kv_heads)
    return head, head + 1


@dataclass(frozen=True)
class Piece:
    """The part of one full parameter a rank holds.

    dim None: the whole of it. dim 0 or 1: the rows or columns in `spans`, in order, then
    `pad` zero rows. zero: a bias added once per group, whole on rank 0, zeros elsewhere.
    """

    dim: int | None = None
    spans: tuple[Span, ...] = ()
    pad: int = 0
    zero: bool = False

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.spans) + self.pad


WHOLE = Piece()


def piece(name: str, cfg: ModelConfig, tp: int, rank: int) -> Piece:
    """Which part of the whole model's parameter `name` (Transformer's naming) rank holds."""
    if tp == 1:
        return WHOLE
    layer = name.rsplit(".", 2)[-2:]  # e.g. ["wqkv", "weight"]
    module, kind = (layer[0], layer[1]) if len(layer) == 2 else ("", name)
    if module == "wqkv":
        return Piece(0, _qkv_rows(cfg, tp, rank))
    if module == "w13":
        return Piece(0, _gate_up_rows(cfg, tp, rank))
    if module in ("wo", "w2") and kind == "bias":
        return Piece(zero=rank != 0)
    if module == "wo":
        q = cfg.q_dim // tp
        return Piece(1, ((rank * q, (rank + 1) * q),))
    if module == "w2":
        width = cfg.intermediate // tp
        return Piece(1, ((rank * width, (rank + 1) * width),))
    if module == "lm_head":
        per = vocab_per_rank(cfg, tp)
        start, stop = min(rank * per, cfg.vocab), min((rank + 1) * per, cfg.vocab)
        return Piece(0, ((start, stop),), pad=per - (stop - start))
    return WHOLE


def _qkv_rows(cfg: ModelConfig, tp: int, rank: int) -> tuple[Span, ...]:
    q, d = cfg.q_dim // tp, cfg.head_dim
    first, last = kv_head_range(cfg, tp, rank)
    k = (cfg.q_dim + first * d, cfg.q_dim + last * d)
    v = (k[0] + cfg.kv_dim, k[1] + cfg.kv_dim)
    return (rank * q, (rank + 1) * q), k, v


def _gate_up_rows(cfg: ModelConfig, tp: int, rank: int) -> tuple[Span, ...]:
    width, inter = cfg.intermediate // tp, cfg.intermediate
    gate = (rank * width, (rank + 1) * width)
    return gate, (inter + gate[0], inter + gate[1])


def overlap(p: Piece, start: int, stop: int) -> list[tuple[int, int, int]]:
    """Where full rows [start, stop) land in a dim-0 piece: (local row, source row from
    start, count) for each span that meets them (a checkpoint's q_proj fills wqkv's first
    rows, say)."""
    assert p.dim == 0, p
    out, local = [], 0
    for a, b in p.spans:
        lo, hi = max(a, start), min(b, stop)
        if lo < hi:
            out.append((local + lo - a, lo - start, hi - lo))
        local += b - a
    return out
