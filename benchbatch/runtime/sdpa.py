"""Which scaled_dot_product_attention backend a step's attention runs on: flash, cuDNN,
memory-efficient or math.

torch picks one per call from the tensors (device, dtype, head size, mask, strides) and
the enabled backends, and its default order changed between releases (2.5, 2.5.1-2.10,
2.11+): a row's time means little without the kernel that produced it. The choice is asked
of torch's own selector (torch._fused_sdp_choice, what F.scaled_dot_product_attention calls)
with tensors laid out as model.py passes them, for each kind of attention call a step makes:

- prefill: no earlier keys, plain causal (is_causal=True, GQA through enable_gqa);
- decode: one query per sequence against the cache, no mask (every key is visible);
- masked: a mixed or chunked step, queries against cached keys through a boolean mask.

One sequence stands for the batch (the choice does not depend on it in any backend's
checks that a step reaches, and a real batch's cache could be gigabytes).
"""

from __future__ import annotations

import torch

NAMES = {
    "MATH": "math",
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "memory-efficient",
    "CUDNN_ATTENTION": "cudnn",
    "OVERRIDEABLE": "overrideable",
    "ERROR": "none",
}
KINDS = ("prefill", "decode", "masked")


def name_of(choice: int) -> str:
    """torch's SDPBackend number as one of NAMES' words (unknown numbers as themselves)."""
    from torch.nn.attention import SDPBackend

    for name, member in SDPBackend.__members__.items():  # a pybind enum: not iterable
        if int(member.value) == int(choice):
            return NAMES.get(name, name.lower())
    return f"backend {choice}"


def choose(q, k, v, attn_mask=None, is_causal: bool = False, enable_gqa: bool = False) -> str:
    """The backend torch would run this call on, under the backends enabled now."""
    kwargs = {"enable_gqa": enable_gqa} if enable_gqa else {}
    choice = torch._fused_sdp_choice(q, k, v, attn_mask, 0.0, is_causal, **kwargs)
    return name_of(choice)


def for_kind(cfg, kind: str, tokens: int, kv_len: int, device, dtype) -> str:
    """The backend of one attention call of this kind: `tokens` new queries, kv_len keys."""
    heads, kv_heads, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    make = lambda *shape: torch.zeros(*shape, device=device, dtype=dtype)  # noqa: E731
    if kind == "prefill":
        q, k = make(1, heads, tokens, d), make(1, kv_heads, tokens, d)
        return choose(q, k, k, is_causal=True, enable_gqa=heads != kv_heads)
    # grouped_attention: the heads sharing a KV head folded into the query axis.
    group = heads // kv_heads
    q, keys = make(1, kv_heads, group * tokens, d), make(1, kv_heads, kv_len, d)
    mask = None
    if kind == "masked":
        mask = torch.ones(1, 1, group * tokens, kv_len, dtype=torch.bool, device=device)
    return choose(q, keys, keys, attn_mask=mask)


def for_step(cfg, phase: str, tokens: int, context: int, device, dtype) -> str:
    """A timed step's backend: prefill from nothing is causal, decode is unmasked."""
    if phase == "prefill" and context == 0:
        return for_kind(cfg, "prefill", tokens, tokens, device, dtype)
    kind = "decode" if tokens == 1 else "masked"
    return for_kind(cfg, kind, tokens, context + tokens, device, dtype)


def by_kind(cfg, device, dtype, tokens: int = 512, context: int = 512) -> dict[str, str]:
    """metadata.json's record: each kind's backend at the article's sizes (a prompt of 512,
    decode at a context of 512, a 64-token chunk riding on 512 cached tokens)."""
    tokens, context = min(tokens, cfg.max_context), min(context, cfg.max_context - 64)
    return {
        "prefill": for_kind(cfg, "prefill", tokens, tokens, device, dtype),
        "decode": for_kind(cfg, "decode", 1, context + 1, device, dtype),
        "masked": for_kind(cfg, "masked", 64, context + 64, device, dtype),
    }
