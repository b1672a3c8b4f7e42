"""A Llama-style decoder-only transformer in plain PyTorch, random or checkpoint weights.

Embedding; per layer RMSNorm, attention (rotary positions, grouped-query heads, torch's
scaled_dot_product_attention) and residual, then RMSNorm, SwiGLU MLP and residual; final
norm; LM head. What sets the families apart is in the config: Qwen3's per-head q/k RMSNorm,
Qwen2's q/k/v bias, Llama 3's rescaled rotary frequencies. `forward(tokens)` is the plain
causal forward pass (the reference); `step(tokens, cache, slots)` appends the tokens to the
slots' KV cache and attends through it: a prefill when the slots are empty, a decode step
when tokens has one column.

Projections are fused ([q | k | v] and [gate | up]) so a step launches fewer kernels. Under
tensor parallelism (`shard`, benchbatch/runtime/tensor_parallel.py) a rank's model is this
same code on its own heads and MLP slice (sharding.local_config): wqkv and w13 hold its
columns, wo and w2 its rows, their outputs are all-reduced (`shard.all_reduce`, once after
attention and once after the MLP), and the LM head holds a slice of the vocabulary whose
logits are gathered (`shard.gather_vocab`) for greedy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from benchbatch.core.config import ModelConfig
from benchbatch.runtime.kvcache import KVCache, PagedKVCache, Slots
from benchbatch.runtime.layout import ROWS, WeightLayout, is_columns, repack
from benchbatch.runtime.rotary import rotary_tables, rotate, rotation


@dataclass
class Segment:
    """`batch` sequences with `t` new tokens each, packed at rows [start, start + batch * t).

    A step is one or more segments: a decode batch is one (t = 1), a prefill chunk another,
    so a mixed step runs every matmul once over all tokens and attention per segment.
    """

    slots: Slots | None
    past: torch.Tensor  # [batch] tokens each sequence held before this step
    batch: int
    t: int
    kv_len: int  # keys attended: at least max(past) + t
    start: int = 0
    masks: dict = field(default_factory=dict, repr=False, compare=False)  # one per group
    dense: bool = False  # every query sees every key (decode at kv_len): attention needs no mask

    def mask(self, group: int) -> torch.Tensor | None:
        """grouped_attention's causal mask, built once per step (every layer shares it);
        None when the segment is dense (a masked attention kernel is slower: measured 13.0
        against 9.2 ms a layer at batch 32 over 513 keys on the 2-core CPU)."""
        if self.dense:
            return None
        if group not in self.masks:
            self.masks[group] = causal_mask(self.past, self.t, self.kv_len, group)
        return self.masks[group]

    @property
    def rows(self) -> slice:
        return slice(self.start, self.start + self.batch * self.t)

    def positions(self) -> torch.Tensor:
        return self.past[:, None] + torch.arange(self.t, device=self.past.device)

    def last_rows(self) -> torch.Tensor:
        """Packed row of each sequence's last token (the one whose logits serving needs)."""
        offsets = torch.arange(self.batch, device=self.past.device) * self.t + self.t - 1
        return self.start + offsets


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **factory):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _whole(x: torch.Tensor) -> torch.Tensor:
    return x


def split_linear(x: torch.Tensor, linear: nn.Linear, sizes) -> list[torch.Tensor]:
    """linear(x).split(sizes, dim=-1) as one product per row slice of the weight (views: the
    weight stays one tensor, for checkpoints and sharding alike)."""
    w, b, out, start = linear.weight, linear.bias, [], 0
    for n in sizes:
        out.append(F.linear(x, w[start : start + n], None if b is None else b[start : start + n]))
        start += n
    return out


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, shard=None, **factory):
        super().__init__()
        self.cfg = cfg
        self.reduce = shard.all_reduce if shard is not None else _whole
        self.split = False  # WeightLayout.split: q, k, v as three products
        qkv = cfg.q_dim + 2 * cfg.kv_dim
        self.wqkv = nn.Linear(cfg.hidden, qkv, bias=cfg.qkv_bias, **factory)
        self.wo = nn.Linear(cfg.q_dim, cfg.hidden, bias=cfg.o_bias, **factory)
        if cfg.qk_norm:  # Qwen3: each head's queries and keys normalized before rotary
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, **factory)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, **factory)

    def forward(self, x, cos, sin, cache: KVCache | None, layer: int, segments: list[Segment]):
        """cos, sin: the step's `rotation` tables [tokens, 1, head_dim]."""
        c = self.cfg
        n, sizes = x.shape[0], (c.q_dim, c.kv_dim, c.kv_dim)
        if not self.split and not c.qk_norm:  # q, k side by side in the output: one rotation
            qkv = self.wqkv(x)
            qk = qkv[:, : c.q_dim + c.kv_dim].view(n, c.heads + c.kv_heads, c.head_dim)
            q, k = rotate(qk, cos, sin).split((c.heads, c.kv_heads), dim=1)
            v = qkv[:, c.q_dim + c.kv_dim :]
        else:
            if self.split:  # three products over row slices of the one weight
                q, k, v = split_linear(x, self.wqkv, sizes)
            else:
                q, k, v = self.wqkv(x).split(sizes, dim=-1)
            q, k = q.view(n, c.heads, c.head_dim), k.view(n, c.kv_heads, c.head_dim)
            if c.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        v = v.view(n, c.kv_heads, c.head_dim)
        outs = [self._attend(q, k, v, cache, layer, seg) for seg in segments]
        return self.reduce(self.wo(outs[0] if len(outs) == 1 else torch.cat(outs)))

    def _attend(self, q, k, v, cache, layer, seg: Segment) -> torch.Tensor:
        c, shape = self.cfg, (seg.batch, seg.t)
        q, k, v = (z[seg.rows].view(*shape, *z.shape[1:]) for z in (q, k, v))
        if cache is not None:
            cache.write(layer, seg.slots, seg.positions(), k, v)
        if cache is None or seg.kv_len == seg.t:  # nothing earlier to attend to: plain causal
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=c.heads != c.kv_heads,
            ).transpose(1, 2)
        else:
            keys, values = cache.read(layer, seg.slots, seg.kv_len)
            mask = seg.mask(c.heads // c.kv_heads)
            out = grouped_attention(q, keys, values, seg.past, mask, dense=seg.dense)
        return out.reshape(seg.batch * seg.t, c.q_dim)


def grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past, mask=None, dense=False
) -> torch.Tensor:
    """Queries [b, t, heads, d] against cached keys/values [b, kv_heads, L, d], causally.

    Query i of a sequence sees keys 0..past+i. The heads that share a KV head are folded
    into the query axis, so every backend runs GQA without copying keys per head. `mask`:
    causal_mask's, when the caller built it once for every layer; dense: every query sees
    every key (no mask at all).
    """
    b, t, heads, d = q.shape
    kv_heads, kv_len = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    q = q.view(b, t, kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * t, d)
    if mask is None and not dense:
        mask = causal_mask(past, t, kv_len, group)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    return out.view(b, kv_heads, group, t, d).permute(0, 3, 1, 2, 4)  # [b, t, kv, group, d]


def causal_mask(past: torch.Tensor, t: int, kv_len: int, group: int) -> torch.Tensor:
    """Which of kv_len keys each of t new queries of a sequence sees (keys 0..past+i), laid
    out as grouped_attention folds the queries: [b, 1, group * t, kv_len] (broadcast over
    the group when t is 1, where no copy is needed)."""
    b = past.shape[0]
    key_pos = torch.arange(kv_len, device=past.device)
    query_pos = past[:, None] + torch.arange(t, device=past.device)  # [b, t]
    mask = key_pos[None, None, :] <= query_pos[:, :, None]  # [b, t, L]
    if t == 1:
        return mask[:, None]  # [b, 1, 1, L]
    return mask[:, None, None].expand(b, 1, group, t, kv_len).reshape(b, 1, group * t, kv_len)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, shard=None, **factory):
        super().__init__()
        self.inter = cfg.intermediate
        self.reduce = shard.all_reduce if shard is not None else _whole
        self.split = False  # WeightLayout.split: gate and up as two products
        self.w13 = nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=cfg.mlp_bias, **factory)
        self.w2 = nn.Linear(cfg.intermediate, cfg.hidden, bias=cfg.mlp_bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split:
            gate, up = split_linear(x, self.w13, (self.inter, self.inter))
        else:
            gate, up = self.w13(x).split(self.inter, dim=-1)
        return self.reduce(self.w2(F.silu(gate) * up))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, shard=None, **factory):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, cfg.norm_eps, **factory)
        self.attention = Attention(cfg, shard, **factory)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, **factory)
        self.mlp = MLP(cfg, shard, **factory)

    def forward(self, x, cos, sin, cache, layer, segments):
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, layer, segments)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        device="cpu",
        dtype=torch.float32,
        seed: int = 0,
        init: bool = True,
        shard=None,
    ):
        """init=False leaves the weights uninitialized for a checkpoint to fill: the modules are
        built on the meta device and then given memory, so nothing is drawn and overwritten.
        shard: this rank's place in a tensor-parallel group (its layers are built on its
        local_cfg; shard.randomize draws its slices of the whole model's weights, and
        checkpoint.load reads its slices of a checkpoint's)."""
        super().__init__()
        self.cfg, self.shard = cfg, shard
        self.local_cfg = local = shard.local_config(cfg) if shard is not None else cfg
        factory = {"device": device if init else "meta", "dtype": dtype}
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, **factory)
        self.blocks = nn.ModuleList(Block(local, shard, **factory) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, **factory)
        head_rows = shard.head_rows(cfg) if shard is not None else cfg.vocab
        self.lm_head = nn.Linear(cfg.hidden, head_rows, bias=False, **factory)
        tied = cfg.tie_embeddings and shard is None  # a sharded head is a slice of its own
        if not init:
            for child in (self.embed, self.blocks, self.norm, self.lm_head):
                if not (tied and child is self.lm_head):  # it takes embed's
                    child.to_empty(device=device)
        if tied:
            self.lm_head.weight = self.embed.weight
        cos, sin = rotary_tables(cfg, device, dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.layout = ROWS
        if init:
            self.randomize(seed)

    @torch.no_grad()
    def lay_out(self, layout: WeightLayout) -> Transformer:
        """Store the projection weights as `layout` says (runtime/layout.py measures which
        is faster on a device): the same values, so the same model; only the memory order
        of each weight and how many products read it change. One weight is copied at a
        time. A head tied to the embedding keeps the embedding's rows. PACKED puts each
        projection's nn.Linear in a layout.PackedLinear (and back for any other)."""
        self.layout = layout
        tied = self.lm_head.weight is self.embed.weight
        repack(self, layout.packed, self.lm_head if tied else None, layout.floor)  # or back
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.split = layout.split
            if isinstance(module, nn.Linear) and not (tied and module is self.lm_head):
                w = module.weight
                if layout.columns != is_columns(w):
                    stored = w.t().contiguous().t() if layout.columns else w.contiguous()
                    module.weight = nn.Parameter(stored, requires_grad=w.requires_grad)
        return self

    @torch.no_grad()
    def randomize(self, seed: int) -> None:
        """Seeded random weights: timing must never run on zeros or on untouched memory.
        A rank of a tensor-parallel group gets its slices of the whole model's draws."""
        if self.shard is not None:
            return self.shard.randomize(self, seed)
        gen = torch.Generator(device=self.embed.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            if p.is_contiguous():
                p.normal_(0.0, 0.02, generator=gen)
            else:  # the same draws in any layout: drawn in row order, then stored
                p.copy_(
                    torch.empty_like(p, memory_format=torch.contiguous_format).normal_(
                        0.0, 0.02, generator=gen
                    )
                )

    def new_cache(
        self,
        slots: int,
        max_len: int | None = None,
        layout: str = "contiguous",
        block_size: int = 16,
        num_blocks: int | None = None,
    ) -> KVCache | PagedKVCache:
        """A KV cache for `slots` sequences of up to max_len tokens: one contiguous row per
        slot, or (layout "paged") a block pool that attention reads through block tables:
        num_blocks for a scheduler to hand out, or by default each slot's own blocks."""
        w, max_len, cfg = self.embed.weight, max_len or self.cfg.max_context, self.local_cfg
        if layout == "contiguous":
            return KVCache(cfg, slots, max_len, w.device, w.dtype)
        if num_blocks is None:
            return PagedKVCache.per_slot(cfg, slots, max_len, block_size, w.device, w.dtype)
        return PagedKVCache(cfg, slots, max_len, num_blocks, block_size, w.device, w.dtype)

    def forward(self, tokens: torch.Tensor, all_logits: bool = True) -> torch.Tensor:
        """The plain causal forward over whole sequences, no cache: the reference path."""
        b, t = tokens.shape
        past = torch.zeros(b, dtype=torch.long, device=tokens.device)
        seg = Segment(None, past, b, t, t)
        return self._run(tokens.reshape(-1), [seg], None, all_logits)[0]

    def step(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slots: Slots,
        kv_len: int | None = None,
        all_logits: bool = False,
        dense: bool = False,
    ) -> torch.Tensor:
        """Append tokens [batch, t] to the slots' caches and return logits [batch, 1, vocab].

        `kv_len` bounds the keys attended to (at least every slot's length + t). Passing it
        keeps shapes static (for CUDA graphs); without it the cache's lengths are read,
        which waits for the device. dense: the caller knows every slot holds exactly
        kv_len - 1 tokens (a decode step's keys need no mask; see mixed_step).
        """
        return self.mixed_step(cache, [(tokens, slots, kv_len)], all_logits, dense)[0]

    def mixed_step(
        self,
        cache: KVCache,
        parts: list[tuple[torch.Tensor, Slots, int | None]],
        all_logits: bool = False,
        dense: bool = False,
    ) -> list[torch.Tensor]:
        """One forward over several groups of (tokens [b, t], slots, kv_len): e.g. a decode
        batch and prefill chunks together, each group attending through its own slots.

        A decode group whose slots all hold kv_len - 1 tokens attends without a mask (the
        masked kernel cost 13.0 against 9.2 ms a layer at batch 32 on the 2-core CPU):
        known from `dense` (the caller's word), or read from the lengths where they are
        read anyway (kv_len not given). Never read otherwise: on CUDA that would wait for
        the device, and a captured graph cannot read at all."""
        segments, start = [], 0
        for tokens, slots, kv_len in parts:
            past = cache.lengths[slots]
            b, t = tokens.shape
            full = dense
            if kv_len is None:
                kv_len = int(past.max()) + t
                full = dense or (t == 1 and int(past.min()) + 1 == kv_len)
            segments.append(Segment(slots, past, b, t, kv_len, start, dense=full and t == 1))
            start += b * t
        flat = torch.cat([tokens.reshape(-1) for tokens, _, _ in parts])
        logits = self._run(flat, segments, cache, all_logits)
        for seg in segments:
            cache.lengths[seg.slots] += seg.t
        return logits

    def _run(self, flat, segments: list[Segment], cache, all_logits) -> list[torch.Tensor]:
        positions = torch.cat([seg.positions().reshape(-1) for seg in segments])
        cos, sin = rotation(self.rope_cos[positions], self.rope_sin[positions])
        x = self.embed(flat)
        for layer, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache, layer, segments)
        if all_logits:
            logits = self._logits(x)
            return [logits[seg.rows].view(seg.batch, seg.t, -1) for seg in segments]
        rows = torch.cat([seg.last_rows() for seg in segments])
        logits = self._logits(x[rows])
        parts = logits.split([seg.batch for seg in segments])
        return [part.view(seg.batch, 1, -1) for part, seg in zip(parts, segments, strict=True)]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head over the final norm; under tensor parallelism each rank's slice of the
        vocabulary, gathered into the full logits."""
        logits = self.lm_head(self.norm(x))
        return logits if self.shard is None else self.shard.gather_vocab(logits, self.cfg.vocab)
