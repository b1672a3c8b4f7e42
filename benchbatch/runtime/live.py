"""The engine fed online: the in-process engine's scheduler, cache and model step, with
requests that come while it runs (`benchbatch serve`, net/server.py, puts HTTP in front).

One thread, the model's, owns the scheduler, the KV cache and the model; every other
thread talks to it through a thread-safe inbox (submit, cancel, close). Between two steps
the model thread takes everything in the inbox: new requests join the scheduler's queue
before its next schedule(), exactly as the in-process engine queues arrivals, so a request
that came while a step ran is first seen by the next step; a cancelled one (its client went
away) leaves the queue if waiting, or its slot before the next step if running. With
nothing to run the thread blocks on the inbox (no spinning). The tokens of each step are
handed to each request's `deliver` callback as the step ends, on the model thread (the
server turns them into SSE chunks on its own event loop).

The steps are the in-process engine's own (runtime/run_state.py's RunState: the same
prefill, decode and padding, the same greedy pick), so a request gets the tokens Engine.run
and run_alone give it. Outputs are forced to max_tokens unless a request names stop tokens
(a checkpoint's end-of-sequence ids, the server's ignore_eos false): it then ends at the
first one it generates once it has min_tokens (the token is kept: vLLM masks it out
instead), and its slot is freed before the next step, as the scheduler frees a stopped
request's.

The KV cache is sized once, every slot max_len tokens (vLLM's max_model_len); a request
whose prompt and max_tokens do not fit is refused when submitted.

Threads (issue 26 item 7, as vLLM splits them): the model thread and the HTTP loop each
pinned to their own cores where the platform allows (os.sched_setaffinity on the calling
thread: Linux), the model's torch threads set on its own thread (runtime/cores.py's
plan_cores says what was chosen, and why).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Collection, Sequence

import torch

from benchbatch.core.plans import StepPlan
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.workload import Request
from benchbatch.runtime.cores import CorePlan, pin_this_thread
from benchbatch.runtime.engine import Engine, run_alone
from benchbatch.runtime.live_request import (
    ABORT,
    ABORTED,
    CANCELLED,
    FINISHED,
    LENGTH,
    RUNNING,
    STOP,
    WAITING,
    Deliver,
    LiveRequest,
    Refused,
)
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.records import EngineResult
from benchbatch.runtime.run_state import RunState


def _ids(ids: Sequence[int]) -> str:
    return " ".join(map(str, ids))


class _Watched:
    """The scheduler as RunState.step sees it, keeping the plan and the finished ids."""

    def __init__(self, sched) -> None:
        self.sched, self.plan, self.finished = sched, None, []

    def schedule(self) -> StepPlan:
        self.plan = self.sched.schedule()
        return self.plan

    def update(self, plan: StepPlan, stopped: Collection[int] = ()) -> list[int]:
        self.finished = self.sched.update(plan, stopped)
        return self.finished


class LiveEngine:
    """The engine with an inbox. submit/cancel/close from any thread; run() on the model's."""

    def __init__(
        self,
        model: Transformer,
        policy: str,
        slots: int,
        max_len: int,
        settings: dict | None = None,
        stop_tokens: Collection[int] = (),
        name: str | None = None,
    ) -> None:
        """settings: SchedulerConfig's fields (chunked prefill, budgets); name: the policy as
        the step rows call it (default: the scheduler's, "continuous" for chunked prefill)."""
        settings = dict(settings or {})
        self.name, self.settings = name or policy, settings
        self.model, self.policy, self.slots, self.max_len = model, policy, slots, max_len
        self.stop_tokens = frozenset(stop_tokens)  # the checkpoint's end-of-sequence ids
        self.vocab = model.cfg.vocab
        self.sched = make_scheduler(policy, slots, record_tokens=False, **settings)
        self._state = RunState(Engine(model, policy, slots, **settings), [], max_len)
        self._result = EngineResult(policy, slots, 0)
        self.requests: list[LiveRequest] = []  # every one submitted, in order (the CSV)
        self.step_rows: list[dict] = []  # a row per step (the steps CSV)
        self.origin = time.perf_counter()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # submit/close: nothing is put after the stop
        self._closed = False
        self._next_id = itertools.count()
        self._live: dict[int, LiveRequest] = {}  # in the scheduler (waiting or running)
        self._received: list[int] = []  # of the step about to run
        self._cancelled: list[int] = []
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # what ended the model thread, if not close
        self.ready = threading.Event()  # set once the model thread is warm (or has failed)
        self.warmup_s: float | None = None

    def now(self) -> float:
        return time.perf_counter() - self.origin

    # --- any thread -------------------------------------------------------------------------

    def check(self, prompt_ids: Sequence[int], max_tokens: int) -> None:
        """Refused unless the request fits one slot of the cache and the vocabulary."""
        if not prompt_ids:
            raise Refused("the prompt holds no tokens", "prompt")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab]
        if bad:
            raise Refused(
                f"token id {bad[0]} is outside the model's vocabulary of {self.vocab:,}", "prompt"
            )
        if max_tokens < 1:
            raise Refused(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
        need = len(prompt_ids) + max_tokens
        if need > self.max_len:
            raise Refused(
                f"This model's maximum context length is {self.max_len} tokens. However, you "
                f"requested {need} tokens ({len(prompt_ids)} in the prompt, {max_tokens} for "
                "max_tokens): reduce the prompt length or max_tokens",
                "max_tokens" if len(prompt_ids) < self.max_len else "prompt",
            )
        settings = self.sched.config
        budget = settings.max_num_batched_tokens
        if budget is not None and not settings.chunked_prefill and len(prompt_ids) > budget:
            raise Refused(f"a {len(prompt_ids)}-token prompt exceeds the {budget}-token "
                          "budget per step (max_num_batched_tokens)", "prompt")  # fmt: skip

    def submit(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        deliver: Deliver,
        *,
        stop: bool = False,
        min_tokens: int = 0,
    ) -> LiveRequest:
        """Queue a request for the next step. stop: end it at the checkpoint's end-of-sequence
        (once it has min_tokens), else it runs to max_tokens. Refused if it cannot run."""
        self.check(prompt_ids, max_tokens)
        with self._lock:
            if self._closed or self.error is not None:
                raise Refused("the server is stopping", status=503)
            request = LiveRequest(
                next(self._next_id), tuple(int(t) for t in prompt_ids), max_tokens, deliver,
                self.stop_tokens if stop else frozenset(), min_tokens, self.now(),
            )  # fmt: skip
            self.requests.append(request)
            self._inbox.put(("add", request))
        return request

    def cancel(self, request_id: int) -> None:
        """Drop a request before the next step (nothing if it has finished already)."""
        self._inbox.put(("cancel", request_id))

    def close(self) -> None:
        """Stop after the step under way; requests still live end as aborted."""
        with self._lock:
            self._closed = True
            self._inbox.put(("stop", None))

    def start(self, cores: CorePlan | None = None) -> threading.Thread:
        """run() on its own thread (the model's), pinned and threaded as planned."""
        self._thread = threading.Thread(
            target=self._serve, args=(cores,), name="benchbatch-model", daemon=True
        )
        self._thread.start()
        return self._thread

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _serve(self, cores: CorePlan | None) -> None:
        try:
            if cores is not None:
                pin_this_thread(cores.model_cores)
                torch.set_num_threads(cores.threads)  # the intra-op threads of this thread
            self.warmup_s = self._warm_up()
        except BaseException as e:  # noqa: BLE001 - kept for the server to report
            self.error = e
        self.ready.set()
        if self.error is not None:
            return
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def _warm_up(self) -> float:
        """One short request through a cache of its own, on this thread, before the first
        client's: torch's first calls (kernels chosen, memory allocated) are not served."""
        start = time.perf_counter()
        prompt = max(1, min(16, self.max_len - 2))
        run_alone(self.model, Request(0, prompt, 2))
        return time.perf_counter() - start

    # --- the model's thread -----------------------------------------------------------------

    @torch.no_grad()
    def run(self) -> None:
        """Steps while there is work, blocking on the inbox while there is none, until
        close(). Whatever is live then ends as aborted (its deliver told)."""
        try:
            while self._take(block=self.sched.done):
                if not self.sched.done:
                    self._step()
        finally:
            self._abort_all()

    def _take(self, block: bool) -> bool:
        """Everything in the inbox, waiting for the first item if block; False at the stop."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while item[0] != "stop":
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True
        return False

    def _handle(self, kind: str, value) -> None:
        if kind == "add":
            r: LiveRequest = value
            r.queued_s, r.queued_step = self.now(), self.sched.step
            request = Request(r.id, len(r.prompt_ids), r.max_tokens, self.sched.step, r.prompt_ids)
            self.sched.add_requests([request])
            self._state.add(request)
            self._live[r.id] = r
            self._received.append(r.id)
        elif kind == "cancel":
            r = self._live.pop(value, None)
            if r is None:
                return  # finished (or cancelled) already
            self._drop(r.id)
            self._end(r, CANCELLED, None)
            self._cancelled.append(r.id)

    def _drop(self, request_id: int) -> None:
        self.sched.cancel(request_id)
        self._state.drop(request_id)
        self._result.tokens.pop(request_id, None)

    def _step(self) -> None:
        watched = _Watched(self.sched)
        record = self._state.step(watched, self._result, self.origin)
        plan, finished = watched.plan, set(watched.finished)
        ended = []
        ran = [*(c.request_id for c in plan.prefills), *(d.request_id for d in plan.decodes)]
        for rid in dict.fromkeys(ran):
            r = self._live.get(rid)
            if r is not None and self._advance(r, finished, record.step, record.end_s):
                ended.append(rid)
        self.step_rows.append({
            **record.row(),
            "policy": self.name,
            "running": self.sched.num_running,
            "waiting": self.sched.num_waiting,
            "received": _ids(self._received),
            "cancelled": _ids(self._cancelled),
            "admitted": _ids(plan.admitted),
            "prefills": _ids(c.request_id for c in plan.prefills),
            "decodes": _ids(d.request_id for d in plan.decodes),
            "prefill_slots": _ids(c.slot for c in plan.prefills),
            "decode_slots": _ids(d.slot for d in plan.decodes),
            "finished": _ids(ended),
        })  # fmt: skip
        self._received, self._cancelled = [], []

    def _advance(self, r: LiveRequest, finished: set[int], step: int, end_s: float) -> bool:
        """Hand the request its token of this step (none if its prompt is not all in);
        True if that ended it."""
        tokens = self._result.tokens.get(r.id, [])
        new = tokens[r.output_tokens :]
        if not new:
            if r.status == WAITING:
                r.status = RUNNING
            return False
        r.status = RUNNING
        r.output_tokens += len(new)
        if r.first_token_s is None:
            r.first_token_s, r.first_token_step = end_s, step
        reason = LENGTH if r.id in finished else STOP if r.stops(new[-1]) else None
        if reason == STOP:  # ended by its own stop token: the slot frees now
            self._drop(r.id)
        elif reason == LENGTH:  # the scheduler has freed its slot
            self._state.drop(r.id)
            self._result.tokens.pop(r.id, None)
        if reason is not None:
            del self._live[r.id]
            r.finish_step = step
            self._end(r, FINISHED, reason, new, end_s)
        else:
            self._tell(r, new, None)
        return reason is not None

    def _end(self, r: LiveRequest, status: str, reason: str | None, new=(), at=None) -> None:
        r.status, r.finish_reason = status, reason
        r.finish_s = self.now() if at is None else at
        self._tell(r, list(new), reason if reason is not None else ABORT)

    @staticmethod
    def _tell(r: LiveRequest, tokens: list[int], reason: str | None) -> None:
        try:
            r.deliver(tokens, reason)
        except Exception:  # noqa: BLE001 - a consumer gone (its loop closed) must not stop the model
            pass

    def _abort_all(self) -> None:
        """The engine stops: every live request, and any submitted after the stop's message
        (none can be, submit holds the lock), ends as aborted."""
        for r in list(self._live.values()):
            self._end(r, ABORTED, ABORT)
        self._live.clear()
        while True:
            try:
                kind, value = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._end(value, ABORTED, ABORT)
