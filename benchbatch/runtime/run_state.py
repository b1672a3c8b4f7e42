"""The device side of a run's steps: the KV cache, each slot's next input token, the prompts,
and one step executed from its StepPlan and timed. The in-process engine (runtime/engine.py)
and the live one (runtime/live.py) run their steps through the same RunState, so a request
gets the same tokens from either.

A step is built as calls (one per length of prefill chunks, then one decode batch over the
decoding slots and, for static, the padded ones), run as one forward (model.mixed_step),
then the greedy pick of each row's next token; its record counts what the model was fed
(padding included), not what the plan said.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from benchbatch.core import step_model
from benchbatch.core.fits import cache_len
from benchbatch.core.kvblocks import PAGED
from benchbatch.core.plans import PrefillChunk, StepPlan
from benchbatch.core.workload import Request
from benchbatch.runtime.distributed import each
from benchbatch.runtime.records import EngineResult, StepRecord
from benchbatch.runtime.timing import synchronize

PAD_TOKEN = 0  # what a finished slot of a static group is fed while it waits for the group


def prompt_ids(request: Request, vocab: int, seed: int = 0) -> torch.Tensor:
    """The request's prompt on the CPU: its own token ids, or random ones seeded by
    (seed, request id)."""
    if request.prompt_ids is not None:
        return torch.tensor(request.prompt_ids, dtype=torch.long)
    rng = np.random.default_rng([seed, request.id])
    return torch.from_numpy(rng.integers(0, vocab, request.prompt_tokens, dtype=np.int64))


class RunState:
    """The device side of one run: the cache, each slot's next input token, the prompts."""

    def __init__(self, engine, requests: list[Request], max_len: int | None = None) -> None:
        """engine: the Engine (runtime/engine.py) whose model, slots and settings it runs.
        max_len: tokens a slot holds (default: the requests' longest prompt plus output);
        a live engine (runtime/live.py) sizes it once and adds requests as they come."""
        model, dev = engine.model, engine.device
        self.model, self.device, self.policy = model, dev, engine.policy
        self.stop_tokens = engine.stop_tokens
        self.cache, self.scheduled_blocks = _cache(engine, max_len or cache_len(requests))
        kv = engine.settings.get("kv")
        self.keep_prompts = kv is not None and kv.policy == PAGED  # preempted: prefill again
        self.next_token = torch.full((engine.slots,), PAD_TOKEN, dtype=torch.long, device=dev)
        self.lengths = [0] * engine.slots  # host copy of cache.lengths: no device reads
        # Prompts are the workload's input, made before the clock starts (like tokenized text).
        self.prompts = {r.id: prompt_ids(r, model.cfg.vocab, engine.seed) for r in requests}
        self.output_tokens = {r.id: r.output_tokens for r in requests}
        self.last_end: float | None = None  # perf_counter at the end of the last step
        self.last_cpu_end: float | None = None  # and the thread's CPU clock then
        self.finished: list[int] = []  # the requests the last step ended

    def add(self, request: Request) -> None:
        """A request that came while the run runs (runtime/live.py): its prompt and length."""
        self.prompts[request.id] = prompt_ids(request, self.model.cfg.vocab)
        self.output_tokens[request.id] = request.output_tokens

    def drop(self, request_id: int) -> None:
        """A request finished or cancelled (Scheduler.cancel) in a live run: let go of it."""
        self.prompts.pop(request_id, None)
        self.output_tokens.pop(request_id, None)

    def step(
        self, sched, result: EngineResult, origin: float | None = None, since: float | None = None
    ) -> StepRecord:
        """One step, timed; origin: the run's clock, for steps stamped with their start and
        end (arrivals in seconds); since: the previous step's end (perf_counter), for the
        host gap before this one (StepRecord.gap_s)."""
        synchronize(self.device)
        start, cpu_start = time.perf_counter(), time.thread_time()
        gap_s = None if since is None else max(0.0, start - since)
        gap_cpu_s = None
        if gap_s is not None and since == self.last_end and self.last_cpu_end is not None:
            gap_cpu_s = max(0.0, cpu_start - self.last_cpu_end)
        plan = sched.schedule()
        calls = self._prepare(plan, result)
        synchronize(self.device)
        model_start = time.perf_counter()
        chosen = self._forward(calls)
        synchronize(self.device)
        model_s = time.perf_counter() - model_start
        stopped = self._collect(plan, calls, chosen, result)
        self.finished = sched.update(plan, stopped)  # the requests this step ended
        cpu_end = time.thread_time()
        end = time.perf_counter()  # the CPU clock's interval within the wall clock's
        step_s = end - start
        ranks = each(step_s, model_s)  # under torchrun: every rank's; a step is its slowest's
        step_s, model_s = max(r[0] for r in ranks), max(r[1] for r in ranks)
        per_rank = tuple(r[0] for r in ranks) if len(ranks) > 1 else ()
        self.last_end, self.last_cpu_end = end, cpu_end
        record = replace(_record(self.policy, plan, calls, step_s, model_s, per_rank),
                         gap_s=gap_s, cpu_s=cpu_end - cpu_start, gap_cpu_s=gap_cpu_s)  # fmt: skip
        if origin is None:
            return record
        return replace(record, start_s=start - origin, end_s=end - origin)  # this rank's clock

    # --- inputs -------------------------------------------------------------------------

    def _prepare(self, plan: StepPlan, result: EngineResult) -> list[_Call]:
        """The step's parts, run as one forward (model.mixed_step: every matmul once over all
        the step's tokens): a group per length of prefill chunks, then one decode batch over
        the decoding slots (and, for static, the padded ones)."""
        fresh = [c.slot for c in plan.prefills if c.start == 0]
        if fresh:  # a reused slot starts empty; its old keys are masked out by the length
            self.cache.reset(self._index(fresh))
            if self.scheduled_blocks:  # and its old blocks may be someone else's now
                self.cache.clear(self._index(fresh))
            for slot in fresh:
                self.lengths[slot] = 0
        if plan.new_blocks and self.scheduled_blocks:
            new = torch.tensor(plan.new_blocks, dtype=torch.long).to(self.device)
            self.cache.assign(new[:, 0], new[:, 1], new[:, 2])  # (slot, index, block) rows
        calls = [self._prefill_call(group, result) for group in _groups(plan.prefills)]
        decode_slots = sorted([d.slot for d in plan.decodes] + list(plan.padded_slots))
        if decode_slots:
            calls.append(self._decode_call(decode_slots, set(plan.padded_slots)))
        return calls

    def _prefill_call(self, chunks: list[PrefillChunk], result: EngineResult) -> _Call:
        rows = [self._tokens(c, result)[c.start : c.start + c.num_tokens] for c in chunks]
        tokens = torch.stack(rows).to(self.device, non_blocking=True)
        slots = [c.slot for c in chunks]
        return _Call(tokens, self._slots(slots), self._kv_len(slots, tokens.shape[1]), chunks)

    def _tokens(self, chunk: PrefillChunk, result: EngineResult) -> torch.Tensor:
        """What a chunk prefills: the prompt, and after a preemption the tokens the request
        had generated too (recomputed, as vLLM does)."""
        prompt = self.prompts[chunk.request_id]
        if chunk.start + chunk.num_tokens <= len(prompt):
            return prompt
        done = torch.tensor(result.tokens[chunk.request_id], dtype=torch.long)
        return torch.cat((prompt, done))

    def _decode_call(self, slots: list[int], padded: set[int]) -> _Call:
        index = self._slots(slots)
        tokens = self.next_token[index][:, None]
        rows_padded = sum(s in padded for s in slots)
        return _Call(tokens, index, self._kv_len(slots, 1), None, slots, rows_padded)

    def _kv_len(self, slots: list[int], t: int) -> int:
        """Keys the call attends to, from the host's lengths (reading the device's would
        wait for it), and the lengths advanced."""
        kv_len = max(self.lengths[s] for s in slots) + t
        for s in slots:
            self.lengths[s] += t
        return kv_len

    def _slots(self, slots: list[int]) -> slice | torch.Tensor:
        """A slice when the slots are contiguous and ascending (cache views, no gather)."""
        if slots == list(range(slots[0], slots[0] + len(slots))):
            return slice(slots[0], slots[0] + len(slots))
        return self._index(slots)

    def _index(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)

    # --- the model and its outputs -------------------------------------------------------

    def _forward(self, calls: list[_Call]) -> torch.Tensor | None:
        """One forward over every part, then the greedy pick of each row's next token."""
        if not calls:
            return None  # nothing has arrived yet: an idle step
        parts = [(c.tokens, c.slots, c.kv_len) for c in calls]
        logits = self.model.mixed_step(self.cache, parts)
        return torch.cat([part[:, -1].argmax(-1) for part in logits])

    def _collect(
        self, plan: StepPlan, calls: list[_Call], chosen, result: EngineResult
    ) -> list[int]:
        """Greedy next tokens: recorded per request and fed back as the slots' next inputs.
        Returns the requests that generated a stop token before their forced length."""
        slot_request = {d.slot: d.request_id for d in plan.decodes}
        emitted: list[tuple[int, int | None]] = []  # (slot, request id or None if padded)
        for call in calls:
            if call.chunks is not None:  # a chunk short of the prompt's end yields nothing
                emitted += [
                    (c.slot, c.request_id if c.completes_prompt else None) for c in call.chunks
                ]
            else:
                emitted += [(s, slot_request.get(s)) for s in call.slot_list]
        stopped = self._emit(emitted, chosen.tolist(), result) if emitted else []
        for chunk in plan.prefills:
            if chunk.completes_prompt and not self.keep_prompts:
                del self.prompts[chunk.request_id]
        return stopped

    def _emit(self, emitted: list[tuple[int, int | None]], chosen: list[int], result) -> list[int]:
        """A finished request's slot is fed PAD_TOKEN from now on (static keeps computing it);
        a padded slot's output is discarded. Returns the requests a stop token ended early."""
        slots, feeds, stopped = [], [], []
        for (slot, rid), token in zip(emitted, chosen, strict=True):
            if rid is None:
                continue
            result.tokens[rid].append(token)
            finished = len(result.tokens[rid]) == self.output_tokens[rid]
            if not finished and token in self.stop_tokens:
                stopped.append(rid)
                finished = True
            slots.append(slot)
            feeds.append(PAD_TOKEN if finished else token)
        if slots:
            feed = torch.tensor(feeds, dtype=torch.long).to(self.device, non_blocking=True)
            self.next_token[self._index(slots)] = feed
        return stopped


@dataclass
class _Call:
    """One part of a step's forward: its inputs, and what its rows stand for."""

    tokens: torch.Tensor
    slots: slice | torch.Tensor
    kv_len: int
    chunks: list[PrefillChunk] | None = None  # a prefill call: its chunks in row order
    slot_list: list[int] | None = None  # a decode call: its slots in row order
    padded: int = 0  # rows of a decode call fed padding (finished slots of a static group)


def _record(
    policy: str,
    plan: StepPlan,
    calls: list[_Call],
    step_s: float,
    model_s: float,
    rank_step_s: tuple[float, ...] = (),
) -> StepRecord:
    """The step's record, its counts taken from the tensors the model was fed (not from the
    plan): what the step computed, padding included, is what its time paid for. The KV
    blocks held and the preemptions are the scheduler's."""
    prefill_rows = prefill_tokens = decode_tokens = padded = 0
    for call in calls:
        rows = call.tokens.shape[0]
        if call.chunks is not None:
            prefill_rows += rows
            prefill_tokens += call.tokens.numel()
        else:
            decode_tokens += rows - call.padded
            padded += call.padded
    active = prefill_rows + decode_tokens
    return StepRecord(
        policy,
        plan.step,
        active,
        decode_tokens,
        prefill_tokens,
        padded,
        step_s,
        model_s,
        rank_step_s,
        plan.kv_blocks,
        plan.kv_tokens if plan.kv_blocks else 0,
        len(plan.preempted),
        context_tokens=plan.num_context_tokens,
        gathered_tokens=step_model.gathered_tokens(plan),
        masked_tokens=step_model.masked_tokens(plan),
        batched=step_model.batched(plan),
        prompt_pairs=step_model.prompt_pairs(plan),
        decode_only_rows=step_model.decode_only_rows(plan),
        prefill_step=step_model.prefill_step(plan),
        since_change=plan.since_change,
    )


def _cache(engine, max_len: int):
    """The run's KV cache, and whether its block tables follow the scheduler's blocks."""
    kv, model = engine.settings.get("kv"), engine.model
    if engine.kv_layout != "paged":
        return model.new_cache(engine.slots, max_len), False
    if kv is None:  # each slot its own blocks: the contiguous cache's memory, paged
        return model.new_cache(engine.slots, max_len, "paged", engine.block_size), False
    return model.new_cache(engine.slots, max_len, "paged", kv.block_size, kv.blocks), True


def _groups(chunks: Sequence[PrefillChunk]) -> list[list[PrefillChunk]]:
    """Chunks of equal length share one call: the model appends each at its slot's length."""
    by_len: dict[int, list[PrefillChunk]] = {}
    for c in chunks:
        by_len.setdefault(c.num_tokens, []).append(c)
    return list(by_len.values())
