"""Step-level scheduling shared by the simulator and the real engine (no torch here).

Contract (vLLM v1 style): ``plan = sched.schedule()`` says what the next step computes;
the driver runs it (or only prices it, in simulation) and calls ``sched.update(plan)``,
which records the tokens produced, frees finished slots and returns the finished ids.
The scheduler knows each request's forced output length, so the simulator never decides
when a request ends; the real engine may end one sooner, at the model's end-of-sequence
token, by naming it in ``update(plan, stopped=...)``: the forced length is then a cap.

A request owns a slot (a KV-cache row in the real engine) from admission to its last
token. With the default settings (unlimited token budget, no chunking, mixed steps) this
is the article's rule: the admission step prefills the whole prompt and yields token 1,
then n - 1 decode steps follow, so n output tokens hold a slot for exactly n steps, and a
slot freed at the end of step t is refilled in step t + 1.

Budgets (vLLM names): max_num_seqs caps running sequences, max_num_batched_tokens caps
tokens per step (a decode is 1 token, a prefill chunk its prompt tokens). The step is
filled in stall-free order (Sarathi-Serve): decodes of running requests first, then the
next chunk of prefills already under way, then new requests while a slot and budget
remain. The three schemes of the Sarathi ablation are two switches:

- mixed=True,  chunked_prefill=False: whole prompts ride in steps with decodes; a prompt
  that does not fit the budget left waits (first come, first served: nobody overtakes it).
  A prompt longer than the whole budget could never run, so add_requests rejects it with
  a UserError (vLLM likewise requires the budget to cover a prompt without chunking).
- mixed=False, chunked_prefill=True: a step holds prefill chunks or decodes, never both;
  while both kinds have work, prefill and decode steps take turns, so each decode waits
  one chunk step per token (not the whole prompt, as prefill-first would) and prompts get
  every other step. This reproduces the ordering of the Sarathi ablation's middle row.
- mixed=True,  chunked_prefill=True: Sarathi-Serve, chunks piggyback on decode steps.

KV memory (kv=KVBudget, core/kvblocks.py): without it a slot stands for a KV-cache row
as long as the longest request, and only the slot count limits the batch. With it, memory
is a resource of its own, in blocks (vLLM's block manager): admitting a request takes
blocks for its prompt (paged) or for its prompt and maximum output (reserve); a decode that
crosses a block boundary takes one more; when the pool is empty, the most recently admitted
request is preempted: its blocks are freed, it goes back to the front of the queue, and on
readmission its prompt and the tokens it had generated are prefilled again (vLLM's
recompute), no new request being admitted in a step that preempted. Under a token budget
and with chunked prefill (mixed steps only) the blocks follow vLLM v1's scheduler: a chunk
takes the blocks its tokens need when it is planned (a new request those of its first
chunk), running requests in admission order (decodes, then prefills under way), and a
request that finds the pool empty preempts the newest running one, a prefill under way
included (it starts again from its first token).
"""

from __future__ import annotations

import heapq

from benchbatch.core.kvblocks import PAGED
from benchbatch.core.scheduler_base import Scheduler, Seq


class ContinuousScheduler(Scheduler):
    """Iteration-level scheduling (ORCA): every step, free slots are refilled."""

    policy = "continuous"

    def _can_admit(self) -> bool:
        head = self._queue.head(self.step)
        return bool(self._free) and self.num_running < self.config.seqs and head is not None

    def _admit(self, budget_left: int) -> list[Seq]:
        """First come, first served while a slot, the budget and (paged) the blocks of the
        head's first chunk allow: the head that cannot start stops the queue."""
        new = []
        while self._can_admit():
            head = self._queue.items[0]
            n = self._chunk_len(self._prompt_tokens(head), budget_left)
            if n == 0 or not self._kv_admits(head, n):
                break
            new.append(self._admit_head(n))
            budget_left -= n
        return new


class StaticScheduler(Scheduler):
    """Static batching: a group of up to `slots` requests starts together once the previous
    group is over; finished members' slots idle (padded) until the group's longest ends."""

    policy = "static"

    def __init__(self, slots: int, record_tokens: bool = True, **settings) -> None:
        super().__init__(slots, record_tokens, **settings)
        # A finished member's slot -> the KV it held after its last step, and that step.
        self._padding: dict[int, tuple[int, int]] = {}
        kv = self.config.kv
        if kv is not None and kv.policy == PAGED:  # a group that grew could not pad
            raise ValueError("static batching reserves its KV memory: use the reserve policy")

    def _can_admit(self) -> bool:
        head = self._queue.head(self.step)
        return self.num_running == 0 and head is not None and self._kv_admits(head)

    def _admit(self, budget_left: int) -> list[Seq]:
        # The group takes its slots at once; its prefills then share the token budget.
        if not self._can_admit():
            return []
        new = []
        while len(new) < self.config.seqs and self._can_join():
            new.append(self._admit_head())
        return new

    def _can_join(self) -> bool:
        head = self._queue.head(self.step)
        return head is not None and self._kv_admits(head)

    def _release(self, slot: int, seq: Seq) -> None:
        self._padding[slot] = (seq.prefilled + max(0, seq.generated - 1), self.step)
        if self.num_running == 0:  # the group is over: its slots (and memory) come free
            for s in self._padding:
                if self.kv is not None:
                    self.kv.free(s)
                heapq.heappush(self._free, s)
            self._padding.clear()

    def _padded(self) -> tuple[int, ...]:
        return tuple(sorted(self._padding))

    def _padded_context(self) -> int:
        """The longest padded slot's KV before this step: what it held after its last step,
        plus a padding token a step since."""
        return max((held + self.step - 1 - last for held, last in self._padding.values()),
                   default=0)  # fmt: skip


POLICIES: dict[str, type[Scheduler]] = {
    "static": StaticScheduler,
    "continuous": ContinuousScheduler,
}


def make_scheduler(policy: str, slots: int, record_tokens: bool = True, **settings) -> Scheduler:
    """A scheduler by policy name; settings are SchedulerConfig's fields."""
    if policy not in POLICIES:  # the commands choose policies themselves: a bug, not input
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[policy](slots, record_tokens, **settings)
