"""Rotary position embeddings: the cos and sin tables (with Llama 3's and linear frequency
scaling, as transformers computes them) and the rotation of q and k by them."""

from __future__ import annotations

import math

import torch

from benchbatch.core.config import ModelConfig, RopeScaling


def rotary_tables(cfg: ModelConfig, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, [max_context, head_dim / 2].

    Computed in float32 the way transformers does (as Meta's reference and vLLM do too), then
    cast: the tables equal the ones the checkpoint was trained and is served with, bit for bit
    on the same device, where float64 would differ in the last bits at long positions.
    """
    inv_freq = inverse_frequencies(cfg).to(device)
    positions = torch.arange(cfg.max_context, device=device).float()
    angles = torch.outer(positions, inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Radians per position of each rotated pair, float32 on the CPU (transformers' order)."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    return _llama3_frequencies(inv_freq, scaling)


def _llama3_frequencies(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1's rule, operation for operation as transformers' _compute_llama3_parameters:
    long wavelengths slowed by factor, short ones kept, the band between blended."""
    low_freq_wavelen = s.original_max_context / s.low_freq_factor
    high_freq_wavelen = s.original_max_context / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_context / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x [tokens, heads, d] by each token's angles [tokens, d/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rotation(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables `rotate` takes, built once per step from its tokens' cos and sin rows
    [tokens, d/2]: cos twice over and sin with the first half negated, [tokens, 1, d]."""
    return torch.cat((cos, cos), dim=-1)[:, None], torch.cat((-sin, sin), dim=-1)[:, None]


def rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """apply_rotary in four operations and bit for bit the same: the pairs swapped by one
    flip, so (x1 cos - x2 sin, x2 cos + x1 sin) is x * cos2 + swapped * sin2, since
    x1 cos + x2 (-sin) rounds exactly as x1 cos - x2 sin."""
    *lead, d = x.shape
    swapped = x.unflatten(-1, (2, d // 2)).flip(-2).view(*lead, d)
    return x * cos2 + swapped * sin2
