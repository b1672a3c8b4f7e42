"""A preallocated KV cache with one row (slot) per sequence and a length per slot.

Slots at different lengths can decode in the same step, which continuous batching needs:
a step writes each slot's new keys at that slot's own length, and attention masks every
key beyond it.
"""

from __future__ import annotations

import torch

from benchbatch.config import ModelConfig

Slots = slice | torch.Tensor  # a contiguous range of slots (cheap views) or any index tensor


class KVCache:
    def __init__(
        self, cfg: ModelConfig, slots: int, max_len: int, device: torch.device, dtype: torch.dtype
    ):
        shape = (cfg.layers, slots, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(slots, device=device, dtype=torch.long)
        self.slots, self.max_len = slots, max_len

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def index(self, slots: Slots) -> torch.Tensor:
        """Slot numbers as a tensor, whichever form `slots` came in."""
        if isinstance(slots, slice):
            return torch.arange(self.slots, device=self.lengths.device)[slots]
        return slots

    def write(self, layer: int, slots: Slots, positions: torch.Tensor, k, v) -> None:
        """Store k, v of shape [batch, tokens, kv_heads, head_dim] at each slot's positions."""
        rows = self.index(slots)[:, None].expand_as(positions)
        self.k[layer][rows, :, positions] = k
        self.v[layer][rows, :, positions] = v

    def read(self, layer: int, slots: Slots, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [batch, kv_heads, kv_len, head_dim] of the given slots.

        A contiguous range is a view (no copy); other slot sets are gathered, which costs
        one extra pass over their keys and values.
        """
        k, v = self.k[layer][:, :, :kv_len], self.v[layer][:, :, :kv_len]
        if isinstance(slots, slice):
            return k[slots], v[slots]
        return k.index_select(0, slots), v.index_select(0, slots)

    def reset(self, slots: Slots | None = None) -> None:
        """Forget the contents of some slots (lengths to 0); the memory stays allocated."""
        self.lengths[slice(None) if slots is None else slots] = 0
