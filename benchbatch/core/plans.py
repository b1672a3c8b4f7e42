"""What one step computes: the plan a scheduler (core/scheduler.py) hands its driver, the
simulator or the real engine, and the counts every step-cost model prices (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class DecodeEntry:
    """One decode token. context_len: tokens already in the slot's KV cache before this
    step (prompt + generated - 1), which is also the position of the token fed in."""

    slot: int
    request_id: int
    context_len: int


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens [start, start + num_tokens) of a request. The chunk that completes the
    prompt also yields the request's first output token (logits of the last prompt token)."""

    slot: int
    request_id: int
    start: int
    num_tokens: int
    completes_prompt: bool


@dataclass(frozen=True)
class StepPlan:
    """Everything one step computes. padded_slots: slots of a static group whose request
    has finished; they do no useful work, but a static engine still computes them."""

    step: int
    decodes: tuple[DecodeEntry, ...] = ()
    prefills: tuple[PrefillChunk, ...] = ()
    admitted: tuple[int, ...] = ()
    padded_slots: tuple[int, ...] = ()
    # With a KV budget: blocks given out this step as (slot, index in its table, block),
    # requests preempted before it ran, and blocks held once it is planned.
    new_blocks: tuple[tuple[int, int, int], ...] = ()
    preempted: tuple[int, ...] = ()
    kv_blocks: int = 0
    # The longest KV a padded slot holds before the step (it keeps growing by its padding
    # token): the real engine's decode batch attends every row up to it too.
    padded_context: int = 0
    # Steps since the requests in a step last changed (0: this step's are not the last
    # step's: one joined or left): a server whose steps start slow after a change and
    # settle (vLLM-CPU's do) is priced by it (StepCostModel.settle_s).
    since_change: int = 0

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decodes)

    @cached_property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills)

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens

    @cached_property
    def num_context_tokens(self) -> int:
        """KV entries read: decode contexts plus earlier chunks that a chunk attends to."""
        return sum(d.context_len for d in self.decodes) + sum(c.start for c in self.prefills)

    @property
    def kv_tokens(self) -> int:
        """Tokens the active sequences hold in the KV cache once the step has run."""
        return self.num_context_tokens + self.num_tokens

    @property
    def active_slots(self) -> tuple[int, ...]:
        """Slots doing useful work this step (decoding or prefilling)."""
        return tuple(d.slot for d in self.decodes) + tuple(c.slot for c in self.prefills)

    @property
    def num_active(self) -> int:
        return len(self.decodes) + len(self.prefills)

    @property
    def num_output_tokens(self) -> int:
        return len(self.decodes) + sum(c.completes_prompt for c in self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills
