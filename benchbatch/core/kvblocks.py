"""KV-cache memory in blocks, as vLLM's block manager keeps it (no torch here).

The KV cache is a pool of fixed-size blocks (`block_size` tokens each, 16 by default as in
vLLM). A running sequence owns a list of blocks, its block table: token position p lives in
block table[p // block_size] at offset p % block_size, so a sequence needs
ceil(tokens / block_size) blocks and wastes less than one block (internal fragmentation).

Two ways to hand out the pool, side by side on the same memory:

- paged: a sequence gets blocks as it grows (its prompt at admission, one more each time a
  decode crosses a block boundary); when the pool is empty the scheduler preempts;
- reserve: a sequence takes prompt + its maximum output up front (what a contiguous per-slot
  cache does), so it never grows and nothing is preempted, but most of what it holds is
  never written: the fragmentation PagedAttention removes.

The pool is handed out first in, first out (a freed block goes to the back of the queue, as
vLLM's free block queue does), so which blocks a sequence gets is deterministic. The queue is
kept as the never-used blocks (a counter: they come first, in order) and a deque of returned
ones, so its size follows the blocks handed out, not the budget (a 10^14-block budget costs
nothing until it is used).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

PAGED, RESERVE = "paged", "reserve"
KV_POLICIES = (PAGED, RESERVE)
DEFAULT_BLOCK_SIZE = 16  # vLLM's default


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` tokens."""
    return -(-tokens // block_size)


@dataclass(frozen=True)
class KVBudget:
    """The KV memory a scheduler may hand out, and how.

    reserve_output: with the reserve policy, the output tokens each sequence reserves beside
    its prompt (the serving system's max_tokens); None: each request's own output_tokens
    (its cap in the real engine).
    """

    blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    policy: str = PAGED
    reserve_output: int | None = None

    def __post_init__(self) -> None:
        if self.blocks < 1 or self.block_size < 1 or self.policy not in KV_POLICIES:
            raise ValueError(f"invalid KV budget: {self}")  # options check users' values
        if self.reserve_output is not None and self.reserve_output < 1:
            raise ValueError(f"invalid KV budget: {self}")

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    def reservation(self, prompt_tokens: int, output_tokens: int) -> int:
        """Tokens a request takes at admission under the reserve policy."""
        return prompt_tokens + (self.reserve_output or output_tokens)

    def peak_tokens(self, prompt_tokens: int, output_tokens: int) -> int:
        """The most tokens a request ever holds: its reservation, or (paged) its prompt and
        every output token but the last (which is never fed back, so never cached)."""
        if self.policy == RESERVE:
            return self.reservation(prompt_tokens, output_tokens)
        return prompt_tokens + output_tokens - 1


class BlockManager:
    """The block pool and each slot's block table."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        # The free queue: blocks _fresh.. num_blocks - 1 (never handed out), then _returned.
        self._fresh = 0
        self._returned: deque[int] = deque()
        self._tables: dict[int, list[int]] = {}  # slot -> its blocks, in position order

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._fresh + len(self._returned)

    @property
    def num_used(self) -> int:
        return self._fresh - len(self._returned)

    def _take(self, n: int) -> list[int]:
        """The first n blocks of the free queue (the caller checked there are n)."""
        fresh = min(n, self.num_blocks - self._fresh)
        taken = list(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        taken += [self._returned.popleft() for _ in range(n - fresh)]
        return taken

    def table(self, slot: int) -> list[int]:
        return self._tables.get(slot, [])

    def holds(self, slot: int) -> int:
        """Tokens the slot's blocks can hold."""
        return len(self.table(slot)) * self.block_size

    def missing(self, slot: int, tokens: int) -> int:
        """Blocks the slot still needs to hold `tokens` tokens."""
        return max(0, blocks_for(tokens, self.block_size) - len(self.table(slot)))

    def grow(self, slot: int, tokens: int) -> list[tuple[int, int]] | None:
        """Give the slot blocks for `tokens` tokens in all; None (and nothing taken) if the
        pool lacks them. Returns the new (index in the table, block) pairs."""
        need = self.missing(slot, tokens)
        if need > self.num_free:
            return None
        table = self._tables.setdefault(slot, [])
        new = list(enumerate(self._take(need), start=len(table)))
        table.extend(block for _, block in new)
        return new

    def free(self, slot: int) -> int:
        """Return the slot's blocks to the pool; how many there were."""
        table = self._tables.pop(slot, [])
        self._returned.extend(table)
        return len(table)

    def check(self) -> None:
        """Every block is free or in exactly one table (a bug if not)."""
        owned = [b for table in self._tables.values() for b in table]
        every = owned + list(self._returned)  # the blocks ever handed out
        assert sorted(every) == list(range(self._fresh)), "a block lost or shared"
