"""A scheduler's settings, checked where they enter (no torch here): the slots, vLLM's
budgets (max_num_seqs, max_num_batched_tokens), chunked prefill and its chunk size, mixed
steps, and the KV budget. core/scheduler.py says what each does to a step; a setting that
cannot run is a UserError naming it."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from benchbatch.core.kvblocks import KVBudget, blocks_for
from benchbatch.core.optkit import require
from benchbatch.core.workload import Request
from benchbatch.errors import UserError

UNLIMITED = sys.maxsize


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of a scheduler; defaults reproduce the article's simulation rule."""

    slots: int
    max_num_seqs: int | None = None  # None: as many as slots
    max_num_batched_tokens: int | None = None  # None: unlimited
    chunked_prefill: bool = False
    chunk_size: int | None = None  # with chunked_prefill; None: only the budget limits a chunk
    mixed: bool = True
    kv: KVBudget | None = None  # None: slots only (a slot is a full-length KV row)

    def __post_init__(self) -> None:
        require(self.slots >= 1, "slots", f"must be at least 1, got {self.slots}")
        seqs = self.max_num_seqs
        if seqs is not None:
            require(seqs >= 1, "max_num_seqs", f"must be at least 1, got {seqs}")
            require(
                seqs <= self.slots, "max_num_seqs", f"{seqs} is more than the {self.slots} slots"
            )
        self._check_budget()
        self._check_chunk()
        self._check_kv()

    def _check_budget(self) -> None:
        budget = self.max_num_batched_tokens
        if budget is None:
            return
        require(budget >= 1, "max_num_batched_tokens", f"must be at least 1, got {budget}")
        # Every running sequence must be able to decode each step (vLLM asks the same).
        require(
            budget >= self.seqs,
            "max_num_batched_tokens",
            f"{budget} is less than --slots {self.seqs} (vLLM's max_num_seqs): running "
            "decodes would starve",
        )

    def _check_chunk(self) -> None:
        chunk, budget = self.chunk_size, self.max_num_batched_tokens
        if chunk is None:
            return
        require(self.chunked_prefill, "chunk_size", "only applies with chunked prefill")
        require(chunk >= 1, "chunk_size", f"must be at least 1, got {chunk}")
        if budget is not None:
            require(chunk <= budget, "chunk_size", f"{chunk} is more than the token budget "
                    f"(--max-num-batched-tokens {budget})")  # fmt: skip

    def _check_kv(self) -> None:
        if self.kv is None:
            return
        require(self.mixed, "kv_memory", "KV blocks are modelled with mixed steps only")
        # Chunks limited by the budget alone (vLLM's default) leave at most one prompt part
        # prefilled, the newest running request's, so the newest is never a decode already
        # planned when a chunk preempts; smaller chunks would need vLLM's running order.
        chunk, budget = self.chunk_size, self.max_num_batched_tokens
        require(
            chunk is None or budget is None or chunk >= budget,
            "chunk_size",
            "with KV blocks, chunks are limited by the token budget only (vLLM's default)",
        )

    @property
    def seqs(self) -> int:
        return self.slots if self.max_num_seqs is None else self.max_num_seqs

    @property
    def budget(self) -> int:
        return UNLIMITED if self.max_num_batched_tokens is None else self.max_num_batched_tokens

    @property
    def article_rule(self) -> bool:
        """True when the plain rule holds (n tokens hold a slot n steps): fast paths apply."""
        return (
            self.max_num_batched_tokens is None
            and self.seqs == self.slots
            and not self.chunked_prefill
            and self.mixed
            and self.kv is None
        )

    def check_request(self, r: Request) -> None:
        """A request these settings could never run: a UserError naming the setting."""
        self._check_prompt_fits(r)
        self._check_kv_fits(r)

    def _check_prompt_fits(self, r: Request) -> None:
        """Unchunked, a prompt must fit the budget whole; with a KV budget, so must its
        longest recompute (prompt and every output token but the last)."""
        budget = self.max_num_batched_tokens
        if budget is None or self.chunked_prefill:
            return
        longest = r.prompt_tokens + (r.output_tokens - 1 if self.kv else 0)
        if longest > budget:
            what = "prompt" if self.kv is None else "prompt and recompute"
            raise UserError(
                "max_num_batched_tokens",
                f"request {r.id} has a {longest}-token {what}, more than the budget "
                f"{budget}; raise the budget or use --chunked-prefill",
            )

    def _check_kv_fits(self, r: Request) -> None:
        """A request that cannot fit the whole budget alone would never finish."""
        kv = self.kv
        if kv is None:
            return
        if kv.reserve_output is not None and r.output_tokens > kv.reserve_output:
            raise ValueError(f"request {r.id} outgrows its reservation of {kv.reserve_output}")
        need = blocks_for(kv.peak_tokens(r.prompt_tokens, r.output_tokens), kv.block_size)
        if need > kv.blocks:
            raise UserError(
                "kv_memory",
                f"request {r.id} ({r.prompt_tokens:,}-token prompt, {r.output_tokens:,} "
                f"output tokens) needs {need:,} blocks of {kv.block_size} tokens under "
                f"{kv.policy}, more than the budget's {kv.blocks:,}",
            )
