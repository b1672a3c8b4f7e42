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
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from benchbatch.core.kvblocks import PAGED, BlockManager, blocks_for
from benchbatch.core.metrics import TokenRecorder
from benchbatch.core.plans import DecodeEntry, PrefillChunk, StepPlan
from benchbatch.core.scheduler_config import UNLIMITED, SchedulerConfig
from benchbatch.core.workload import Request
from benchbatch.errors import UserError


@dataclass
class _Seq:
    """A running request: where it sits and how far it got."""

    request: Request
    slot: int
    prefilled: int = 0
    generated: int = 0
    recompute: int = 0  # generated tokens prefilled again after a preemption
    admission: int = 0  # the scheduler's count of admissions when it was admitted

    @property
    def prompt_left(self) -> int:
        return self.request.prompt_tokens + self.recompute - self.prefilled


@dataclass
class _Queue:
    """Waiting requests, first come first served: by arrival step, then submission order,
    so the eligible requests (arrived by now) are always a prefix."""

    items: deque[Request] = field(default_factory=deque)

    def add(self, requests: Iterable[Request]) -> None:
        new = list(requests)
        unsorted = any(a.arrival_step > b.arrival_step for a, b in pairwise(new))
        if unsorted or (self.items and new and new[0].arrival_step < self.items[-1].arrival_step):
            new = sorted([*self.items, *new], key=lambda r: r.arrival_step)  # stable
            self.items.clear()
        self.items.extend(new)

    def head(self, step: int) -> Request | None:
        """The first waiting request if it has arrived by step."""
        if self.items and self.items[0].arrival_step <= step:
            return self.items[0]
        return None

    def __len__(self) -> int:
        return len(self.items)


class Scheduler:
    """Base: owns the queue, the slots and the token accounting; policies choose admission.

    Subclasses implement _can_admit() and _admit(budget_left).
    """

    policy = "base"

    def __init__(self, slots: int, record_tokens: bool = True, **settings) -> None:
        self.config = SchedulerConfig(slots, **settings)
        self.step = 0  # index of the step the next schedule() plans
        self.recorder = TokenRecorder() if record_tokens else None
        self.finished: list[int] = []  # request ids, in finishing order
        self._queue = _Queue()
        self._free = list(range(slots))  # a heap: the lowest free slot is used first
        self._prefilling: dict[int, _Seq] = {}  # slot -> seq, in admission order
        self._decoding: dict[int, _Seq] = {}  # slot -> seq
        self._finished_ids: set[int] = set()
        self._submitted = 0
        self._planned: StepPlan | None = None
        self._last_prefilled = False  # unmixed steps alternate prefill and decode
        kv = self.config.kv
        self.kv = None if kv is None else BlockManager(kv.blocks, kv.block_size)
        self.preemptions = 0
        self._admissions = 0
        self._resume: dict[int, int] = {}  # preempted request -> tokens it had generated
        self._new_blocks: list[tuple[int, int, int]] = []  # of the step being planned
        self._preempted_now: list[int] = []
        self._members: frozenset[int] = frozenset()  # the last step's requests
        self._since_change = 0

    # --- driver API ---------------------------------------------------------------------

    def add_requests(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        for r in requests:
            self._check_prompt_fits(r)
            self._check_kv_fits(r)
            if self.recorder is not None:
                self.recorder.add(r.id, r.arrival_step)
        self._queue.add(requests)
        self._submitted += len(requests)

    @property
    def done(self) -> bool:
        return not self._queue and not self.num_running

    @property
    def num_running(self) -> int:
        return len(self._prefilling) + len(self._decoding)

    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    def schedule(self) -> StepPlan:
        """Plan the next step: decodes, then chunks under way, then new requests."""
        assert self._planned is None, "schedule() called twice without update()"
        self._new_blocks, self._preempted_now = [], []
        if self.kv is not None:
            self._make_room()
        decodes, prefills, admitted = (), (), ()
        if self._runs_decodes():
            decodes = self._plan_decodes()
        if self.config.mixed or not decodes:
            prefills, admitted = self._plan_prefills(self.config.budget - len(decodes))
        self._last_prefilled = bool(prefills)
        members = frozenset(d.request_id for d in decodes) | {c.request_id for c in prefills}
        self._since_change = self._since_change + 1 if members == self._members else 0
        self._members = members
        plan = StepPlan(self.step, decodes, prefills, admitted, self._padded(), *self._kv_parts(),
                        padded_context=self._padded_context(),
                        since_change=self._since_change)  # fmt: skip
        self._check_plan(plan)
        self._planned = plan
        return plan

    def update(self, plan: StepPlan, stopped: Collection[int] = ()) -> list[int]:
        """Apply a step that ran: record its tokens, free finished slots, advance the step.

        stopped: requests whose token of this step ends them before their forced length
        (an end-of-sequence token); each must have produced a token in this plan.
        """
        assert plan is self._planned, "update() must get the plan of the last schedule()"
        finished: list[int] = []
        for d in plan.decodes:
            self._emit(self._decoding[d.slot], finished, d.request_id in stopped)
        for c in plan.prefills:
            self._advance_prefill(c, finished, c.request_id in stopped)
        assert all(rid in finished for rid in stopped), f"{stopped} stopped without a token"
        self._planned = None
        self.step += 1
        return finished

    def cancel(self, request_id: int) -> bool:
        """Drop a request between steps (its client went away, as vLLM aborts one): taken off
        the queue if waiting, or out of its slot if running (freed as a finished request's
        is: at once, or for static at the group's end). It leaves the accounting as if never
        submitted and is not in `finished`. Returns whether it was here to drop."""
        assert self._planned is None, "cancel() between update() and the next schedule()"
        for r in self._queue.items:
            if r.id == request_id:
                self._queue.items.remove(r)
                self._resume.pop(request_id, None)
                self._submitted -= 1
                return True
        for running in (self._prefilling, self._decoding):
            for slot, seq in running.items():
                if seq.request.id == request_id:
                    del running[slot]
                    self._release(slot, seq)
                    self._submitted -= 1
                    return True
        return False

    # --- planning -----------------------------------------------------------------------

    def _runs_decodes(self) -> bool:
        """Mixed steps always decode. Unmixed, decode and prefill steps take turns while both
        have work, so a long prompt delays each token by one prefill step, not by all of them
        (the Sarathi ablation's 'chunking without mixing': lower TBT, higher TTFT)."""
        if self.config.mixed or not self._prefill_pending():
            return True
        return bool(self._decoding) and self._last_prefilled

    def _plan_decodes(self) -> tuple[DecodeEntry, ...]:
        return tuple(
            DecodeEntry(slot, s.request.id, s.request.prompt_tokens + s.generated - 1)
            for slot, s in self._decoding.items()
        )

    def _plan_prefills(self, budget_left: int) -> tuple[tuple[PrefillChunk, ...], tuple[int, ...]]:
        chunks = self._plan_chunks(list(self._prefilling.values()), budget_left)
        budget_left -= sum(c.num_tokens for c in chunks)
        new = self._admit(budget_left)
        chunks += self._plan_chunks(new, budget_left)
        return tuple(chunks), tuple(s.request.id for s in new)

    def _plan_chunks(self, seqs: list[_Seq], budget_left: int) -> list[PrefillChunk]:
        """Next chunk of each prefill in order, until the budget runs out (FCFS: a prefill
        that cannot run stops the ones behind it). With a KV budget each chunk takes its
        blocks, preempting the newest running requests while the pool lacks them."""
        chunks = []
        for s in seqs:
            if self._prefilling.get(s.slot) is not s:
                continue  # preempted for an older request's blocks
            n = self._chunk_len(s.prompt_left, budget_left)
            if n == 0 or (self.kv is not None and not self._grow(s, s.prefilled + n)):
                break
            chunks.append(PrefillChunk(s.slot, s.request.id, s.prefilled, n, n == s.prompt_left))
            budget_left -= n
        return chunks

    def _chunk_len(self, prompt_left: int, budget_left: int) -> int:
        """Prompt tokens that can run now; 0 if none (unchunked: all or nothing)."""
        if not self.config.chunked_prefill:
            return prompt_left if prompt_left <= budget_left else 0
        limit = self.config.chunk_size or UNLIMITED
        return max(0, min(prompt_left, limit, budget_left))

    def _prefill_pending(self) -> bool:
        return bool(self._prefilling) or self._can_admit()

    def _padded(self) -> tuple[int, ...]:
        return ()

    def _padded_context(self) -> int:
        return 0

    # --- KV memory (with a KV budget) -----------------------------------------------------

    def _kv_parts(self) -> tuple:
        if self.kv is None:
            return ()
        return tuple(self._new_blocks), tuple(self._preempted_now), self.kv.num_used

    def _make_room(self) -> None:
        """Oldest first, each decode gets the blocks its new token needs (_grow)."""
        for seq in sorted(self._decoding.values(), key=lambda s: s.admission):
            if self._decoding.get(seq.slot) is not seq:
                continue  # preempted for an older request's blocks
            self._grow(seq, seq.request.prompt_tokens + seq.generated)  # with this step's token

    def _grow(self, seq: _Seq, tokens: int) -> bool:
        """Blocks for `tokens` tokens of seq; while the pool lacks them the most recently
        admitted running request is preempted, until they come free or seq is itself the one
        preempted (vLLM v1's order: the last of its running list). Whether seq got them."""
        while (new := self.kv.grow(seq.slot, tokens)) is None:
            running = (*self._prefilling.values(), *self._decoding.values())
            victim = max(running, key=lambda s: s.admission)
            self._preempt(victim)
            if victim is seq:
                return False
        self._record_blocks(seq.slot, new)
        return True

    def _preempt(self, seq: _Seq) -> None:
        """Free the request's blocks and slot and queue it first; it keeps the tokens it
        generated (a prefill under way loses what it had prefilled)."""
        running = self._decoding if seq.slot in self._decoding else self._prefilling
        del running[seq.slot]
        self.kv.free(seq.slot)
        heapq.heappush(self._free, seq.slot)
        self._resume[seq.request.id] = seq.generated
        self._queue.items.appendleft(seq.request)
        self._preempted_now.append(seq.request.id)
        self.preemptions += 1

    def _kv_admits(self, request: Request, tokens: int | None = None) -> bool:
        """The pool holds what the request takes at admission (no admission in a step that
        preempted: the memory is short). tokens: of its first chunk (None: all it prefills)."""
        if self.kv is None:
            return True
        if self._preempted_now:
            return False
        need = blocks_for(self._admission_tokens(request, tokens), self.kv.block_size)
        return need <= self.kv.num_free

    def _prompt_tokens(self, request: Request) -> int:
        """What admitting the request prefills: its prompt and any tokens to recompute."""
        return request.prompt_tokens + self._resume.get(request.id, 0)

    def _admission_tokens(self, request: Request, tokens: int | None = None) -> int:
        """Tokens the request's blocks hold at admission: paged, those it prefills first
        (`tokens`, else all of them); reserve, its prompt and whole output."""
        kv = self.config.kv
        if kv.policy == PAGED:
            return self._prompt_tokens(request) if tokens is None else tokens
        return kv.reservation(request.prompt_tokens, request.output_tokens)

    def _record_blocks(self, slot: int, new: list[tuple[int, int]]) -> None:
        self._new_blocks += [(slot, index, block) for index, block in new]

    # --- admission (policies) -----------------------------------------------------------

    def _can_admit(self) -> bool:
        raise NotImplementedError

    def _admit(self, budget_left: int) -> list[_Seq]:
        raise NotImplementedError

    def _admit_head(self, tokens: int | None = None) -> _Seq:
        """Move the head of the queue into the lowest free slot (with a KV budget, with the
        blocks of its first `tokens` tokens: _admission_tokens)."""
        request = self._queue.items.popleft()
        self._admissions += 1
        seq = _Seq(request, heapq.heappop(self._free), admission=self._admissions)
        if self.kv is not None:
            new = self.kv.grow(seq.slot, self._admission_tokens(request, tokens))
            assert new is not None, "admitted without the blocks it needs"
            self._record_blocks(seq.slot, new)
        if request.id in self._resume:  # preempted: its tokens so far are prefilled again
            seq.generated = seq.recompute = self._resume.pop(request.id)
        self._prefilling[seq.slot] = seq
        return seq

    # --- progress -----------------------------------------------------------------------

    def _advance_prefill(self, chunk: PrefillChunk, finished: list[int], stop: bool) -> None:
        seq = self._prefilling[chunk.slot]
        assert seq.request.id == chunk.request_id and seq.prefilled == chunk.start
        seq.prefilled += chunk.num_tokens
        if chunk.completes_prompt:
            assert seq.prompt_left == 0
            del self._prefilling[chunk.slot]
            self._decoding[chunk.slot] = seq
            self._emit(seq, finished, stop)

    def _emit(self, seq: _Seq, finished: list[int], stop: bool = False) -> None:
        """seq produced a token this step; retire it after its last one (or a stop token)."""
        seq.generated += 1
        rid = seq.request.id
        if self.recorder is not None:
            self.recorder.record(rid, self.step)
        if stop or seq.generated == seq.request.output_tokens:
            assert rid not in self._finished_ids, f"request {rid} finished twice"
            self._finished_ids.add(rid)
            self.finished.append(rid)
            finished.append(rid)
            del self._decoding[seq.slot]
            self._release(seq.slot, seq)

    def _release(self, slot: int, seq: _Seq) -> None:
        if self.kv is not None:
            self.kv.free(slot)
        heapq.heappush(self._free, slot)

    # --- checks -------------------------------------------------------------------------

    def _check_prompt_fits(self, r: Request) -> None:
        """Unchunked, a prompt must fit the budget whole; with a KV budget, so must its
        longest recompute (prompt and every output token but the last)."""
        budget = self.config.max_num_batched_tokens
        if budget is None or self.config.chunked_prefill:
            return
        longest = r.prompt_tokens + (r.output_tokens - 1 if self.config.kv else 0)
        if longest > budget:
            what = "prompt" if self.config.kv is None else "prompt and recompute"
            raise UserError(
                "max_num_batched_tokens",
                f"request {r.id} has a {longest}-token {what}, more than the budget "
                f"{budget}; raise the budget or use --chunked-prefill",
            )

    def _check_kv_fits(self, r: Request) -> None:
        """A request that cannot fit the whole budget alone would never finish."""
        kv = self.config.kv
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

    def _check_plan(self, plan: StepPlan) -> None:
        """Invariants: bugs if they fail, never user errors."""
        assert self.num_running <= self.config.seqs <= self.config.slots
        used = [*plan.active_slots, *plan.padded_slots]
        assert len(set(used)) == len(used), f"a slot used twice in step {plan.step}"
        assert all(0 <= slot < self.config.slots for slot in used), "no such slot"
        assert plan.num_tokens <= self.config.budget, f"token budget exceeded: {plan}"
        accounted = len(self._queue) + self.num_running + len(self.finished)
        assert accounted == self._submitted, "a request was lost or duplicated"
        if self.kv is not None:
            self._check_kv(plan)

    def _check_kv(self, plan: StepPlan) -> None:
        """Blocks within the budget, and every token the step writes has its block."""
        kv = self.kv
        assert 0 <= kv.num_used <= kv.num_blocks, "more blocks than the budget"
        for d in plan.decodes:
            assert kv.holds(d.slot) > d.context_len, f"request {d.request_id} has no block"
        for c in plan.prefills:
            assert kv.holds(c.slot) >= c.start + c.num_tokens, f"{c.request_id} has no block"


class ContinuousScheduler(Scheduler):
    """Iteration-level scheduling (ORCA): every step, free slots are refilled."""

    policy = "continuous"

    def _can_admit(self) -> bool:
        head = self._queue.head(self.step)
        return bool(self._free) and self.num_running < self.config.seqs and head is not None

    def _admit(self, budget_left: int) -> list[_Seq]:
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

    def _admit(self, budget_left: int) -> list[_Seq]:
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

    def _release(self, slot: int, seq: _Seq) -> None:
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
