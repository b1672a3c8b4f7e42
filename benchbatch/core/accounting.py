"""FLOPs and bytes of one step of the model: pure arithmetic, no torch.

A step processes `tokens` new tokens for each of `batch` sequences that already hold
`context` tokens in their KV cache. Prefill is (batch, prompt, context=0); decode is
(batch, 1, context). What is counted:

- linear FLOPs: 2 x weights x tokens for every projection of every layer;
- LM head FLOPs on a line of their own: serving needs logits only for the last token of each
  sequence, so by default one row per sequence (a full forward for scoring needs all);
- attention FLOPs: QK^T and AV, 2 x head_dim each per (query, key) pair and head. Causal
  attention has query i see keys 0..context+i, so only those pairs are counted (the useful
  half of a square prefill), although dense kernels may compute the masked ones too;
- bytes: each weight read once per step, the KV cache read (every key and value the step
  attends to) and written (the new tokens), and activations (each matmul, norm and
  elementwise op reads its inputs and writes its outputs once: no fusion assumed).

FLOPs are the matmuls' (what a roofline sets against the tensor-core peak, and what torch's
FlopCounterMode counts). Elementwise work (norms, Qwen3's q/k norm, biases, rotary, SiLU,
softmax) is memory-bound: it is counted in bytes (its parameters and activations), not FLOPs.

Tensor parallelism (tp ranks, benchbatch/core/sharding.py): every count takes `tp` and is then
one rank's: its heads, KV heads and MLP slice (local_config), its slice of the LM head
(vocab_per_rank rows), the whole embedding, norms and rotary tables it replicates, and its
KV cache. The all-reduces are communication, counted apart (allreduce_bytes), not as bytes.

Buffers: the rotary cos and sin tables ([max_context, head_dim / 2] each, in the model's
dtype) are resident (weight_bytes counts them whole: 16 MiB for llama3.2-1b in bf16), but a
step gathers only the rows of its tokens' positions, so a step reads head_dim values per new
token from them, as it reads one row of an untied embedding table per token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from benchbatch.core import sharding
from benchbatch.core.config import DTYPE_BYTES, ModelConfig


def layer_linear_params(cfg: ModelConfig) -> int:
    """Weights of one layer's matmuls: q, k, v, o projections and the SwiGLU MLP."""
    attention = cfg.hidden * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * cfg.hidden
    mlp = 3 * cfg.hidden * cfg.intermediate
    return attention + mlp


def layer_vector_params(cfg: ModelConfig) -> int:
    """One layer's other parameters: norm weights (Qwen3's q/k norm too) and biases."""
    norms = 2 * cfg.hidden + (2 * cfg.head_dim if cfg.qk_norm else 0)
    qkv_bias = cfg.q_dim + 2 * cfg.kv_dim if cfg.qkv_bias else 0
    o_bias = cfg.hidden if cfg.o_bias else 0
    mlp_bias = 2 * cfg.intermediate + cfg.hidden if cfg.mlp_bias else 0
    return norms + qkv_bias + o_bias + mlp_bias


def linear_params(cfg: ModelConfig) -> int:
    """Weights that every token multiplies, LM head excluded."""
    return cfg.layers * layer_linear_params(cfg)


def total_params(cfg: ModelConfig, tp: int = 1) -> int:
    """Every parameter the model (one rank of tp) holds: embedding and LM head shared when
    tied, unless the head is sharded (tp > 1: its own slice of the vocabulary)."""
    local = sharding.local_config(cfg, tp)
    final_norm = cfg.hidden
    embeddings = cfg.vocab * cfg.hidden + _separate_head_rows(cfg, tp) * cfg.hidden
    return linear_params(local) + cfg.layers * layer_vector_params(local) + final_norm + embeddings


def _separate_head_rows(cfg: ModelConfig, tp: int) -> int:
    """Rows of an LM head that is not the embedding itself (0 when tied and whole)."""
    if tp == 1:
        return 0 if cfg.tie_embeddings else cfg.vocab
    return sharding.vocab_per_rank(cfg, tp)


def rotary_table_bytes(cfg: ModelConfig, dtype: str) -> int:
    """The cos and sin tables, [max_context, head_dim / 2] each: resident beside the weights."""
    return cfg.max_context * cfg.head_dim * DTYPE_BYTES[dtype]


def weight_bytes(cfg: ModelConfig, dtype: str, tp: int = 1) -> int:
    """What the model (one rank of tp) holds in memory: its parameters and rotary tables."""
    return total_params(cfg, tp) * DTYPE_BYTES[dtype] + rotary_table_bytes(cfg, dtype)


def kv_bytes_per_token(cfg: ModelConfig, dtype: str, tp: int = 1) -> int:
    """Keys and values of one token in every layer (the KV heads of one rank of tp)."""
    return cfg.layers * 2 * sharding.local_config(cfg, tp).kv_dim * DTYPE_BYTES[dtype]


def kv_cache_bytes(cfg: ModelConfig, dtype: str, batch: int, context: int, tp: int = 1,
                   block_size: int | None = None) -> int:  # fmt: skip
    """The KV cache of `batch` sequences of `context` tokens; block_size: a paged cache's
    (each sequence in whole blocks, and the pool's one scratch block beside them)."""
    if block_size is None:
        return batch * context * kv_bytes_per_token(cfg, dtype, tp)
    blocks = batch * -(-context // block_size) + 1
    return blocks * block_size * kv_bytes_per_token(cfg, dtype, tp)


def causal_pairs(tokens: int, context: int) -> int:
    """(query, key) pairs a causal step attends: query i sees context + i + 1 keys."""
    return tokens * context + tokens * (tokens + 1) // 2


def _activation_elements_per_token(cfg: ModelConfig) -> int:
    """Elements read plus written per token per layer, one pass per op (no fusion)."""
    h, q, kv, inter = cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.intermediate
    norms = 2 * (h + h)  # two RMSNorms: read x, write normed x
    qk_norm = 2 * (q + kv) if cfg.qk_norm else 0  # read and write q and k once more
    projections = (h + q + 2 * kv) + (q + h) + (h + 2 * inter) + (inter + h)
    attention_io = q + q  # read the queries, write the attention output
    rotary = 2 * (q + kv) + 2 * cfg.head_dim  # read and write q and k; read cos, sin twice
    swiglu = 2 * inter + inter  # read gate and up, write their product
    residuals = 2 * 3 * h  # two adds: read two, write one
    return norms + qk_norm + projections + attention_io + rotary + swiglu + residuals


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of one step; every field an exact integer."""

    batch: int
    tokens: int
    context: int
    linear_flops: int
    lm_head_flops: int
    attention_flops: int
    weight_bytes: int
    kv_read_bytes: int
    kv_write_bytes: int
    activation_bytes: int

    @property
    def flops(self) -> int:
        return self.linear_flops + self.lm_head_flops + self.attention_flops

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.activation_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved: what a roofline places against the ridge point."""
        return self.flops / self.bytes

    @property
    def tokens_per_weight_read(self) -> int:
        """The articles' simplified 'intensity': new tokens that share one read of the weights."""
        return self.batch * self.tokens

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(flops=self.flops, bytes=self.bytes)
        d["arithmetic_intensity"] = self.arithmetic_intensity
        d["tokens_per_weight_read"] = self.tokens_per_weight_read
        return d


def step_cost(
    cfg: ModelConfig,
    dtype: str,
    batch: int,
    tokens: int,
    context: int = 0,
    logits_per_seq: int = 1,
    tp: int = 1,
) -> StepCost:
    """FLOPs and bytes of one step: `tokens` new tokens for each of `batch` sequences (on
    one rank of tp: its shard of the work, and the full logits it gathers)."""
    b = DTYPE_BYTES[dtype]
    new = batch * tokens
    logit_rows = batch * logits_per_seq
    pairs = batch * causal_pairs(tokens, context)
    local, head_rows = sharding.local_config(cfg, tp), sharding.vocab_per_rank(cfg, tp)
    gathered_logits = logit_rows * cfg.vocab if tp > 1 else 0
    return StepCost(
        batch=batch,
        tokens=tokens,
        context=context,
        linear_flops=2 * new * linear_params(local),
        lm_head_flops=2 * logit_rows * cfg.hidden * head_rows,
        attention_flops=cfg.layers * 4 * local.q_dim * pairs,
        weight_bytes=(total_params(cfg, tp) - _unread_embedding(cfg, tp)) * b
        + new * _gathered(cfg) * b,
        kv_read_bytes=batch * (context + tokens) * kv_bytes_per_token(cfg, dtype, tp),
        kv_write_bytes=new * kv_bytes_per_token(cfg, dtype, tp),
        activation_bytes=b
        * (
            new * (cfg.layers * _activation_elements_per_token(local) + cfg.head_dim)
            + logit_rows * (cfg.hidden + head_rows)
            + gathered_logits
        ),
    )


def _gathered(cfg: ModelConfig) -> int:
    """Table values a new token reads: its embedding row and its position's cos and sin rows
    (written out once as the step's cos and sin: head_dim activation values per token)."""
    return cfg.hidden + cfg.head_dim


def _unread_embedding(cfg: ModelConfig, tp: int = 1) -> int:
    """The embedding table is gathered, not read whole (unless it doubles as the LM head,
    which a sharded head never does)."""
    return 0 if cfg.tie_embeddings and tp == 1 else cfg.vocab * cfg.hidden


def prefill_cost(cfg: ModelConfig, dtype: str, batch: int, prompt: int, tp: int = 1) -> StepCost:
    return step_cost(cfg, dtype, batch, prompt, context=0, tp=tp)


def decode_cost(cfg: ModelConfig, dtype: str, batch: int, context: int, tp: int = 1) -> StepCost:
    return step_cost(cfg, dtype, batch, 1, context=context, tp=tp)


def allreduce_bytes(cfg: ModelConfig, dtype: str, tokens: int) -> int:
    """The message of one of a step's all-reduces: every token's hidden vector."""
    return tokens * cfg.hidden * DTYPE_BYTES[dtype]


def allreduces_per_step(cfg: ModelConfig, tp: int) -> int:
    """One after attention and one after the MLP in every layer (none on one rank)."""
    return 2 * cfg.layers if tp > 1 else 0


def bus_bytes(message_bytes: int, ranks: int) -> float:
    """What an all-reduce moves over each rank's link, as nccl-tests counts it: a ring
    all-reduce sends and receives 2 (n - 1) / n of the message per rank. busbw = this over
    the time (algbw x 2 (n - 1) / n)."""
    return message_bytes * 2 * (ranks - 1) / ranks


def mixed_cost(
    cfg: ModelConfig,
    dtype: str,
    decode_batch: int,
    context: int,
    prefill_tokens: int = 0,
    prefill_start: int = 0,
) -> tuple[int, int]:
    """(FLOPs, bytes) of one forward over a decode batch (one token for each of
    `decode_batch` sequences holding `context` tokens) and one prompt's chunk riding along
    (`prefill_tokens` tokens after `prefill_start` cached ones), as model.mixed_step runs
    them: each part's FLOPs and bytes, the weights read once for both."""
    parts = []
    if decode_batch:
        parts.append(step_cost(cfg, dtype, decode_batch, 1, context))
    if prefill_tokens:
        parts.append(step_cost(cfg, dtype, 1, prefill_tokens, prefill_start))
    shared = (total_params(cfg) - _unread_embedding(cfg)) * DTYPE_BYTES[dtype]
    flops = sum(c.flops for c in parts)
    return flops, sum(c.bytes for c in parts) - shared * (len(parts) - 1)


def dense_attention_flops(cfg: ModelConfig, batch: int, tokens: int, context: int) -> int:
    """What a counter that ignores the causal mask reports: every query against every key."""
    return cfg.layers * 4 * cfg.q_dim * batch * tokens * (context + tokens)


def step_workspace_bytes(cfg: ModelConfig, dtype: str, tokens: int, tp: int = 1) -> int:
    """Transient memory of a step over `tokens` tokens: the widest activations (one rank's)
    and the full logits."""
    b, c = DTYPE_BYTES[dtype], sharding.local_config(cfg, tp)
    widest = c.hidden * 2 + c.q_dim + 2 * c.kv_dim + 3 * c.intermediate
    return tokens * (widest * b + cfg.vocab * 4)  # logits are taken to fp32 for sampling


def max_batch(
    cfg: ModelConfig,
    dtype: str,
    context: int,
    free_bytes: int,
    reserve_fraction: float = 0.1,
    tp: int = 1,
    block_size: int | None = None,
) -> int:
    """Sequences of `context` tokens that fit beside the weights (0 when even one does not);
    with tp, on each rank's `free_bytes` beside its shard: the batch grows with the ranks.

    Each sequence needs its KV cache (with block_size, a paged cache's: whole blocks, and
    the pool's scratch block once) plus its share of a decode step's workspace; a fraction
    of the free memory is held back for the allocator's fragmentation and the runtime.
    """
    usable = int(free_bytes * (1 - reserve_fraction)) - weight_bytes(cfg, dtype, tp)
    scratch = 0
    if block_size is not None:  # the pool's scratch block, once
        scratch = block_size * kv_bytes_per_token(cfg, dtype, tp)
        one = kv_cache_bytes(cfg, dtype, 1, context, tp, block_size) - scratch
    else:
        one = kv_cache_bytes(cfg, dtype, 1, context, tp)
    per_seq = one + step_workspace_bytes(cfg, dtype, 1, tp)
    return max(0, (usable - scratch) // per_seq)
