"""A preallocated KV cache with one row (slot) per sequence and a length per slot.

Slots at different lengths can decode in the same step, which continuous batching needs:
a step writes each slot's new keys at that slot's own length, and attention masks every
key beyond it.
"""

from __future__ import annotations

import torch

from benchbatch.core.config import ModelConfig

Slots = slice | torch.Tensor  # a contiguous range of slots (cheap views) or any index tensor


def layer_views(k: torch.Tensor, v: torch.Tensor) -> tuple[tuple, tuple]:
    """Each layer's keys and values as views of its own, made once: a step writes and reads
    cache.k_layers[layer] (no select per call), and under torch.compile a write into one of
    these writes in place, where a write into cache.k[layer] made inductor copy the whole
    cache every step (measured: 2.3 ms against 0.32 ms for two layers at 513 positions).
    One select each, not unbind: unbind's views refuse in-place writes with grad enabled;
    and writes store detached values, so the cache never joins an autograd graph (a kept
    view of a cache that had would be a stale leaf)."""
    return tuple(k[i] for i in range(k.shape[0])), tuple(v[i] for i in range(v.shape[0]))


class _SlotCache:
    """What both layouts share: their bytes, and slots as a tensor of slot numbers."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor
    slots: int

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def index(self, slots: Slots) -> torch.Tensor:
        """Slot numbers as a tensor, whichever form `slots` came in."""
        if isinstance(slots, slice):
            return torch.arange(self.slots, device=self.lengths.device)[slots]
        return slots


class KVCache(_SlotCache):
    def __init__(
        self, cfg: ModelConfig, slots: int, max_len: int, device: torch.device, dtype: torch.dtype
    ):
        shape = (cfg.layers, slots, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.k_layers, self.v_layers = layer_views(self.k, self.v)
        self.lengths = torch.zeros(slots, device=device, dtype=torch.long)
        self.slots, self.max_len = slots, max_len

    def write(self, layer: int, slots: Slots, positions: torch.Tensor, k, v) -> None:
        """Store k, v of shape [batch, tokens, kv_heads, head_dim] at each slot's positions."""
        rows = self.index(slots)[:, None].expand_as(positions)
        self.k_layers[layer][rows, :, positions] = k.detach()  # the cache is state, not a graph
        self.v_layers[layer][rows, :, positions] = v.detach()

    def read(self, layer: int, slots: Slots, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [batch, kv_heads, kv_len, head_dim] of the given slots.

        A contiguous range is a view (no copy); other slot sets are gathered, which costs
        one extra pass over their keys and values.
        """
        k, v = self.k_layers[layer][:, :, :kv_len], self.v_layers[layer][:, :, :kv_len]
        if isinstance(slots, slice):
            return k[slots], v[slots]
        return k.index_select(0, slots), v.index_select(0, slots)

    def reset(self, slots: Slots | None = None) -> None:
        """Forget the contents of some slots (lengths to 0); the memory stays allocated."""
        self.lengths[slice(None) if slots is None else slots] = 0


class PagedKVCache(_SlotCache):
    """The KV cache as a pool of fixed-size blocks and a block table per slot (PagedAttention).

    Token position p of a slot lives in block block_table[slot, p // block_size] at offset
    p % block_size, so a sequence holds only the blocks it has reached and any free block can
    go to any sequence. Keys and values are stored [layer, kv_head, block, offset, head_dim]:
    reading a batch's blocks is one gather per layer (index_select over the block axis) into
    a workspace the cache keeps (a fresh buffer each layer would cost more than the gather:
    on a CPU, the page faults of new memory), after which the keys are a strided view
    [batch, kv_heads, length, head_dim], which is what attention takes from the contiguous
    cache too. That gather is the price of paging without a paged-attention kernel;
    scripts/bench_paged.py measures it.

    The pool has one block more than it hands out, the last: table entries no sequence owns
    point there, so a static group's padded slot that writes past what it reserved, or reads
    a table it never filled, touches only that scratch block (its outputs are discarded).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        slots: int,
        max_len: int,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        shape = (cfg.layers, cfg.kv_heads, num_blocks + 1, block_size, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.k_layers, self.v_layers = layer_views(self.k, self.v)
        self.lengths = torch.zeros(slots, device=device, dtype=torch.long)
        self.slots, self.max_len = slots, max_len
        self.num_blocks, self.block_size, self.scratch = num_blocks, block_size, num_blocks
        width = -(-max_len // block_size)
        self.block_table = torch.full((slots, width), num_blocks, device=device, dtype=torch.long)
        self._work: dict[str, torch.Tensor] = {}  # gathered keys, values: reused every layer

    @classmethod
    def per_slot(cls, cfg, slots: int, max_len: int, block_size: int, device, dtype, seed=0):
        """Blocks enough for every slot at max_len (the contiguous cache's memory), dealt out
        in a seeded random order: a pool as scattered as serving leaves it."""
        width = -(-max_len // block_size)
        cache = cls(cfg, slots, max_len, slots * width, block_size, device, dtype)
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(slots * width, generator=gen).view(slots, width)
        cache.block_table.copy_(order.to(device))
        return cache

    def assign(self, slots: torch.Tensor, indices: torch.Tensor, blocks: torch.Tensor) -> None:
        """block_table[slots[i], indices[i]] = blocks[i]: blocks a scheduler handed out."""
        self.block_table[slots, indices] = blocks

    def clear(self, slots: Slots) -> None:
        """Point the slots' tables at the scratch block: their old blocks went elsewhere."""
        self.block_table[slots] = self.scratch

    def write(self, layer: int, slots: Slots, positions: torch.Tensor, k, v) -> None:
        """Store k, v [batch, tokens, kv_heads, head_dim] at each slot's positions."""
        rows = self.index(slots)[:, None].expand_as(positions)
        blocks = self.block_table[rows, positions // self.block_size]
        offsets = positions % self.block_size
        self.k_layers[layer][:, blocks, offsets] = k.detach().permute(2, 0, 1, 3)
        self.v_layers[layer][:, blocks, offsets] = v.detach().permute(2, 0, 1, 3)

    def read(self, layer: int, slots: Slots, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [batch, kv_heads, kv_len, head_dim] of the slots, gathered
        through their block tables (positions past a slot's length are masked by
        attention)."""
        table = self.block_table[slots, : -(-kv_len // self.block_size)]
        k = self._gather("k", self.k_layers[layer], table, kv_len)
        return k, self._gather("v", self.v_layers[layer], table, kv_len)

    def _gather(self, name: str, pool: torch.Tensor, table: torch.Tensor, kv_len: int):
        """The table's blocks of one layer, [batch, kv_heads, kv_len, head_dim] (a view of
        the workspace, valid until the next read: attention consumes it first)."""
        heads, _, block, dim = pool.shape
        batch, width = table.shape
        size = heads * batch * width * block * dim
        work = self._work.get(name)
        if work is None or work.numel() < size:
            work = self._work[name] = torch.empty(size, dtype=pool.dtype, device=pool.device)
        picked = work[:size].view(heads, batch * width, block, dim)
        torch.index_select(pool, 1, table.reshape(-1), out=picked)
        keys = picked.view(heads, batch, width * block, dim).transpose(0, 1)
        return keys[:, :, :kv_len]

    def reset(self, slots: Slots | None = None) -> None:
        """Forget the contents of some slots (lengths to 0); blocks stay where they are."""
        self.lengths[slice(None) if slots is None else slots] = 0
