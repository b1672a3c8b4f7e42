"""Drive the scheduler with the real model: the simulator's steps, executed and timed.

The engine runs exactly the StepPlan the scheduler hands out, so a real run takes the same
steps as the simulation of the same requests; only what a step costs is measured instead of
assumed. One engine serves both policies:

- continuous: each step prefills the requests admitted into free slots (their first token
  comes from the prompt's last logits) and decodes every running request, all in one
  forward (model.mixed_step: the matmuls run once over the step's tokens, attention per part);
- static: the same, but a group's finished slots keep decoding a padding token until the
  group's longest request ends, as Transformers' generate() does for a padded batch. That
  work is real (it is timed) but its outputs are thrown away.

Output lengths are forced by the scheduler (end-of-sequence is ignored), unless the engine
is given stop tokens (a checkpoint's end-of-sequence ids): then a request ends at the first
one it generates, its forced length a cap, and the lengths that came out are recorded
(observed_requests) for the simulator to replay. Prompts are a request's real token ids
when it carries them (workload.with_prompts), else random ids seeded per request, so the
same request gets the same prompt in any engine and in the one-request-at-a-time reference.
Generation is greedy (argmax).

Timing: each step is timed on the host clock with a device synchronize before each reading;
model_s is the time of the model's forward and the greedy pick of the next tokens; the rest
of step_s is the engine's own work (scheduling, building inputs, bookkeeping): the
scheduling overhead.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from benchbatch.engines.metrics import RunMetrics
from benchbatch.engines.model import Transformer
from benchbatch.engines.scheduler import PrefillChunk, StepPlan, make_scheduler
from benchbatch.engines.workload import Request, Workload
from benchbatch.errors import UserError
from benchbatch.timing import synchronize

PAD_TOKEN = 0  # what a finished slot of a static group is fed while it waits for the group


@dataclass(frozen=True)
class StepRecord:
    """One executed step: what it computed and what it cost."""

    policy: str
    step: int
    active: int  # slots doing useful work (decoding or prefilling)
    decode_tokens: int
    prefill_tokens: int
    padded: int  # finished slots of a static group that still computed a padding token
    step_s: float
    model_s: float

    def row(self) -> dict:
        return {
            "policy": self.policy,
            "step": self.step,
            "active": self.active,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "padded": self.padded,
            "step_ms": self.step_s * 1e3,
            "model_ms": self.model_s * 1e3,
        }


@dataclass
class EngineResult:
    """A run of one policy; filled step by step, so an interrupted run keeps what it did."""

    policy: str
    slots: int
    requests: int
    steps: list[StepRecord] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    metrics: RunMetrics | None = None  # in seconds; set when the run completes
    complete: bool = False

    @property
    def total_steps(self) -> int:
        return len(self.steps)

    @property
    def wall_s(self) -> float:
        return sum(s.step_s for s in self.steps)

    @property
    def model_s(self) -> float:
        return sum(s.model_s for s in self.steps)

    @property
    def useful_slot_steps(self) -> int:
        """Slot-steps that produced or prefilled something (= output tokens, unchunked)."""
        return sum(s.active for s in self.steps)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens.values())

    @property
    def output_lengths(self) -> dict[int, int]:
        """Tokens each request generated (its forced length, or fewer if it stopped)."""
        return {rid: len(t) for rid, t in self.tokens.items()}

    @property
    def occupancy(self) -> float:
        steps = self.total_steps
        return self.useful_slot_steps / (steps * self.slots) if steps else float("nan")

    @property
    def overhead(self) -> float:
        """Time outside the model (forward and greedy pick) over the whole step time."""
        wall = self.wall_s
        return (wall - self.model_s) / wall if wall else float("nan")

    def step_end_times(self) -> list[float]:
        ends, now = [], 0.0
        for s in self.steps:
            now += s.step_s
            ends.append(now)
        return ends


OnStep = Callable[[StepRecord], None]


def prompt_ids(request: Request, vocab: int, seed: int = 0) -> torch.Tensor:
    """The request's prompt on the CPU: its own token ids, or random ones seeded by
    (seed, request id)."""
    if request.prompt_ids is not None:
        return torch.tensor(request.prompt_ids, dtype=torch.long)
    rng = np.random.default_rng([seed, request.id])
    return torch.from_numpy(rng.integers(0, vocab, request.prompt_tokens, dtype=np.int64))


def check_prompt_ids(vocab: int, requests: Sequence[Request]) -> None:
    """A user error if a real prompt holds a token the model has no embedding for (a
    tokenizer from another model)."""
    if isinstance(requests, Workload):
        return  # columns: random prompts, no ids to check
    for r in requests:
        if r.prompt_ids is not None and (max(r.prompt_ids) >= vocab or min(r.prompt_ids) < 0):
            bad = max(r.prompt_ids) if max(r.prompt_ids) >= vocab else min(r.prompt_ids)
            raise UserError(
                "prompts",
                f"prompt {r.id} holds token id {bad}, outside the model's vocabulary of "
                f"{vocab:,}: is the tokenizer the checkpoint's?",
            )


def observed_requests(requests: Sequence[Request], result: EngineResult) -> list[Request]:
    """The requests with the output lengths the run produced (with stop tokens, the real
    distribution): workload.write_trace saves them for `occupancy --trace` to replay."""
    lengths = result.output_lengths
    missing = [r.id for r in requests if not lengths.get(r.id)]
    if missing:
        raise ValueError(f"requests {missing[:5]} produced no tokens: the run did not finish")
    return [dataclasses.replace(r, output_tokens=lengths[r.id]) for r in requests]


def cache_len(requests: Sequence[Request]) -> int:
    """Tokens a slot must hold: the longest prompt plus the longest output. A padded static
    slot grows for as long as its group runs, which never passes this either."""
    if isinstance(requests, Workload):  # columns: no Request built for each
        return int(requests.prompt_tokens.max()) + int(requests.output_tokens.max())
    return max(r.prompt_tokens for r in requests) + max(r.output_tokens for r in requests)


def check_fits(max_context: int, requests: Sequence[Request]) -> None:
    """A user error if some request would outgrow the model's rotary table."""
    need = cache_len(requests)
    if need > max_context:
        raise UserError(
            "max_output",
            f"the longest prompt plus the longest output is {need:,} tokens, more than the "
            f"model's --max-context {max_context:,}",
        )


class Engine:
    """Runs requests to completion under one policy, on one model and a per-slot KV cache."""

    def __init__(
        self,
        model: Transformer,
        policy: str,
        slots: int,
        seed: int = 0,
        stop_tokens: Collection[int] | None = None,
        **settings,
    ) -> None:
        """stop_tokens: end a request at the first of these it generates (the checkpoint's
        end-of-sequence ids); None forces every request to its output_tokens."""
        self.model, self.policy, self.slots, self.seed = model, policy, slots, seed
        self.stop_tokens = frozenset(stop_tokens or ())
        self.settings = settings
        self.device = model.embed.weight.device
        self.result: EngineResult | None = None  # the run in progress, or the last one

    def run(self, requests: Sequence[Request], on_step: OnStep | None = None) -> EngineResult:
        """Every request to its last token. on_step sees each step's record as it ends."""
        for record in self.steps(requests):
            if on_step is not None:
                on_step(record)
        return self.result

    @torch.no_grad()
    def steps(self, requests: Sequence[Request]) -> Iterator[StepRecord]:
        """Every request to its last token, one record per step as it ends. `self.result`
        holds the run so far (an interrupted run keeps its steps); complete once exhausted."""
        requests = list(requests)
        check_fits(self.model.cfg.max_context, requests)
        check_prompt_ids(self.model.cfg.vocab, requests)
        sched = make_scheduler(self.policy, self.slots, **self.settings)
        sched.add_requests(requests)
        state = _RunState(self, requests)
        self.result = result = EngineResult(self.policy, self.slots, len(requests))
        while not sched.done:
            record = state.step(sched, result)
            result.steps.append(record)
            yield record
        result.metrics = sched.recorder.metrics(result.step_end_times())
        result.metrics.unit = "s"
        result.complete = True


class _RunState:
    """The device side of one run: the cache, each slot's next input token, the prompts."""

    def __init__(self, engine: Engine, requests: list[Request]) -> None:
        model, dev = engine.model, engine.device
        self.model, self.device, self.policy = model, dev, engine.policy
        self.stop_tokens = engine.stop_tokens
        self.cache = model.new_cache(engine.slots, cache_len(requests))
        self.next_token = torch.full((engine.slots,), PAD_TOKEN, dtype=torch.long, device=dev)
        self.lengths = [0] * engine.slots  # host copy of cache.lengths: no device reads
        # Prompts are the workload's input, made before the clock starts (like tokenized text).
        self.prompts = {r.id: prompt_ids(r, model.cfg.vocab, engine.seed) for r in requests}
        self.output_tokens = {r.id: r.output_tokens for r in requests}

    def step(self, sched, result: EngineResult) -> StepRecord:
        synchronize(self.device)
        start = time.perf_counter()
        plan = sched.schedule()
        calls = self._prepare(plan)
        synchronize(self.device)
        model_start = time.perf_counter()
        chosen = self._forward(calls)
        synchronize(self.device)
        model_s = time.perf_counter() - model_start
        stopped = self._collect(plan, calls, chosen, result)
        sched.update(plan, stopped)
        step_s = time.perf_counter() - start
        return StepRecord(
            self.policy,
            plan.step,
            plan.num_active,
            plan.num_decode_tokens,
            plan.num_prefill_tokens,
            len(plan.padded_slots),
            step_s,
            model_s,
        )

    # --- inputs -------------------------------------------------------------------------

    def _prepare(self, plan: StepPlan) -> list[_Call]:
        """The step's parts, run as one forward (model.mixed_step: every matmul once over all
        the step's tokens): a group per length of prefill chunks, then one decode batch over
        the decoding slots (and, for static, the padded ones)."""
        fresh = [c.slot for c in plan.prefills if c.start == 0]
        if fresh:  # a reused slot starts empty; its old keys are masked out by the length
            self.cache.reset(self._index(fresh))
            for slot in fresh:
                self.lengths[slot] = 0
        calls = [self._prefill_call(group) for group in _groups(plan.prefills)]
        decode_slots = sorted([d.slot for d in plan.decodes] + list(plan.padded_slots))
        if decode_slots:
            calls.append(self._decode_call(decode_slots))
        return calls

    def _prefill_call(self, chunks: list[PrefillChunk]) -> _Call:
        rows = [self.prompts[c.request_id][c.start : c.start + c.num_tokens] for c in chunks]
        tokens = torch.stack(rows).to(self.device, non_blocking=True)
        slots = [c.slot for c in chunks]
        return _Call(tokens, self._slots(slots), self._kv_len(slots, tokens.shape[1]), chunks)

    def _decode_call(self, slots: list[int]) -> _Call:
        index = self._slots(slots)
        tokens = self.next_token[index][:, None]
        return _Call(tokens, index, self._kv_len(slots, 1), None, slots)

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
            if chunk.completes_prompt:
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


def _groups(chunks: Sequence[PrefillChunk]) -> list[list[PrefillChunk]]:
    """Chunks of equal length share one call: the model appends each at its slot's length."""
    by_len: dict[int, list[PrefillChunk]] = {}
    for c in chunks:
        by_len.setdefault(c.num_tokens, []).append(c)
    return list(by_len.values())


def run_alone(
    model: Transformer, request: Request, seed: int = 0, stop_tokens: Collection[int] = ()
) -> list[int]:
    """The reference: one request through a 1-slot cache, no batching at all."""
    with torch.no_grad():
        dev = model.embed.weight.device
        cache = model.new_cache(1, request.prompt_tokens + request.output_tokens)
        prompt = prompt_ids(request, model.cfg.vocab, seed).to(dev)[None]
        token = model.step(prompt, cache, slice(0, 1))[:, -1].argmax(-1)
        out = [int(token)]
        while len(out) < request.output_tokens and out[-1] not in stop_tokens:
            token = model.step(token[:, None], cache, slice(0, 1))[:, -1].argmax(-1)
            out.append(int(token))
        return out
