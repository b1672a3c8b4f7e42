"""A Llama-style decoder-only transformer in plain PyTorch, with random seeded weights.

Embedding; per layer RMSNorm, attention (rotary positions, grouped-query heads, torch's
scaled_dot_product_attention) and residual, then RMSNorm, SwiGLU MLP and residual; final
norm; LM head. `forward(tokens)` is the plain causal forward pass (the reference);
`step(tokens, cache, slots)` appends the tokens to the slots' KV cache and attends through
it: a prefill when the slots are empty, a decode step when tokens has one column.

Projections are fused ([q | k | v] and [gate | up]) so a step launches fewer kernels; for
tensor parallelism each block splits by heads (columns) and wo / w2 by rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchbatch.config import ModelConfig
from benchbatch.engines.kvcache import KVCache, Slots


def rotary_tables(cfg: ModelConfig, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, [max_context, head_dim / 2]."""
    half = cfg.head_dim // 2
    freqs = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
    angles = torch.outer(torch.arange(cfg.max_context, dtype=torch.float64, device=device), freqs)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x [batch, tokens, heads, d] by each token's angles."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **factory):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.cfg = cfg
        self.wqkv = nn.Linear(cfg.hidden, cfg.q_dim + 2 * cfg.kv_dim, bias=False, **factory)
        self.wo = nn.Linear(cfg.q_dim, cfg.hidden, bias=False, **factory)

    def forward(self, x, cos, sin, cache: KVCache | None, layer: int, slots, past, kv_len):
        c = self.cfg
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).split((c.q_dim, c.kv_dim, c.kv_dim), dim=-1)
        q = apply_rotary(q.view(b, t, c.heads, c.head_dim), cos, sin)
        k = apply_rotary(k.view(b, t, c.kv_heads, c.head_dim), cos, sin)
        v = v.view(b, t, c.kv_heads, c.head_dim)
        if cache is not None:
            cache.write(layer, slots, past[:, None] + torch.arange(t, device=x.device), k, v)
        if cache is None or kv_len == t:  # nothing earlier to attend to: plain causal
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                is_causal=True,
                enable_gqa=c.heads != c.kv_heads,
            ).transpose(1, 2)
        else:
            keys, values = cache.read(layer, slots, kv_len)
            out = grouped_attention(q, keys, values, past)
        return self.wo(out.reshape(b, t, c.q_dim))


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past):
    """Queries [b, t, heads, d] against cached keys/values [b, kv_heads, L, d], causally.

    Query i of a sequence sees keys 0..past+i. The heads that share a KV head are folded
    into the query axis, so every backend runs GQA without copying keys per head.
    """
    b, t, heads, d = q.shape
    kv_heads, kv_len = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    q = q.view(b, t, kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * t, d)
    key_pos = torch.arange(kv_len, device=q.device)
    query_pos = past[:, None] + torch.arange(t, device=q.device)  # [b, t]
    mask = key_pos[None, None, :] <= query_pos[:, :, None]  # [b, t, L]
    mask = mask[:, None, None].expand(b, 1, group, t, kv_len).reshape(b, 1, group * t, kv_len)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    return out.view(b, kv_heads, group, t, d).permute(0, 3, 1, 2, 4)  # [b, t, kv, group, d]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.inter = cfg.intermediate
        self.w13 = nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=False, **factory)
        self.w2 = nn.Linear(cfg.intermediate, cfg.hidden, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.inter, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, **factory):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, cfg.norm_eps, **factory)
        self.attention = Attention(cfg, **factory)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, **factory)
        self.mlp = MLP(cfg, **factory)

    def forward(self, x, cos, sin, cache, layer, slots, past, kv_len):
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, layer, slots, past, kv_len)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, device="cpu", dtype=torch.float32, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        factory = {"device": device, "dtype": dtype}
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, **factory)
        self.blocks = nn.ModuleList(Block(cfg, **factory) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, **factory)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, **factory)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rotary_tables(cfg, device, dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.randomize(seed)

    @torch.no_grad()
    def randomize(self, seed: int) -> None:
        """Seeded random weights: timing must never run on zeros or on untouched memory."""
        gen = torch.Generator(device=self.embed.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0.0, 0.02, generator=gen)

    def new_cache(self, slots: int, max_len: int | None = None) -> KVCache:
        w = self.embed.weight
        return KVCache(self.cfg, slots, max_len or self.cfg.max_context, w.device, w.dtype)

    def forward(self, tokens: torch.Tensor, all_logits: bool = True) -> torch.Tensor:
        """The plain causal forward over whole sequences, no cache: the reference path."""
        b, t = tokens.shape
        past = torch.zeros(b, dtype=torch.long, device=tokens.device)
        return self._run(tokens, past, None, None, t, all_logits)

    def step(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slots: Slots,
        kv_len: int | None = None,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Append tokens [batch, t] to the slots' caches and return logits.

        `kv_len` bounds the keys attended to (at least every slot's length + t). Passing it
        keeps shapes static (for CUDA graphs); without it the cache's lengths are read,
        which waits for the device.
        """
        past = cache.lengths[slots]
        t = tokens.shape[1]
        if kv_len is None:
            kv_len = int(past.max()) + t
        logits = self._run(tokens, past, cache, slots, kv_len, all_logits)
        cache.lengths[slots] += t
        return logits

    def _run(self, tokens, past, cache, slots, kv_len, all_logits) -> torch.Tensor:
        positions = past[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.embed(tokens)
        for layer, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache, layer, slots, past, kv_len)
        x = self.norm(x if all_logits else x[:, -1:])
        return self.lm_head(x)
