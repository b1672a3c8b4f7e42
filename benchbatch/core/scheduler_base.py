"""The machinery both scheduling policies share (no torch here): the queue, the slots, the
token budget, chunked prefill, KV blocks and preemption. core/scheduler.py states the
contract and holds the policies, which only choose admission."""

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


@dataclass
class Seq:
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
        self._prefilling: dict[int, Seq] = {}  # slot -> seq, in admission order
        self._decoding: dict[int, Seq] = {}  # slot -> seq
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
            self.config.check_request(r)
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

    def _plan_chunks(self, seqs: list[Seq], budget_left: int) -> list[PrefillChunk]:
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

    def _grow(self, seq: Seq, tokens: int) -> bool:
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

    def _preempt(self, seq: Seq) -> None:
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

    def _admit(self, budget_left: int) -> list[Seq]:
        raise NotImplementedError

    def _admit_head(self, tokens: int | None = None) -> Seq:
        """Move the head of the queue into the lowest free slot (with a KV budget, with the
        blocks of its first `tokens` tokens: _admission_tokens)."""
        request = self._queue.items.popleft()
        self._admissions += 1
        seq = Seq(request, heapq.heappop(self._free), admission=self._admissions)
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

    def _emit(self, seq: Seq, finished: list[int], stop: bool = False) -> None:
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

    def _release(self, slot: int, seq: Seq) -> None:
        if self.kv is not None:
            self.kv.free(slot)
        heapq.heappush(self._free, slot)

    # --- checks -------------------------------------------------------------------------

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
