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

Tensor parallelism (a sharded model, under torchrun): every rank runs this same loop; the
scheduler is deterministic and each rank picks greedy tokens from the same gathered
logits, so every rank schedules the same steps without being told, and each request gets
the tokens it gets on one device. A step's times are its slowest rank's.

KV memory: by default each slot is a contiguous KV-cache row as long as the longest request.
kv_layout "paged" keeps the cache in blocks read through block tables (PagedKVCache): with a
KV budget in the settings (kv=KVBudget) the blocks are the ones the scheduler hands out, so
the run lives in exactly that memory and a preempted request is prefilled again (its prompt
and the tokens it had generated) when readmitted; without one, each slot gets its own
scattered blocks, the contiguous cache's memory read the paged way.

The steps themselves (cache, inputs, forward, greedy pick, record) are runtime/run_state.py's
RunState, which the live engine (runtime/live.py) runs too.

Timing: each step is timed on the host clock with a device synchronize before each reading;
model_s is the time of the model's forward and the greedy pick of the next tokens; the rest
of step_s is the engine's own work (scheduling, building inputs, bookkeeping): the
scheduling overhead.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace

import torch

from benchbatch.core.arrivals import ArrivalFeed, GatedFeed
from benchbatch.core.fits import check_fits, check_prompt_ids
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.serving import timed_run_metrics
from benchbatch.core.workload import Request
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.records import EngineResult, OnStep, StepRecord
from benchbatch.runtime.run_state import RunState, prompt_ids


class Engine:
    """Runs requests to completion under one policy, on one model and a per-slot KV cache."""

    def __init__(
        self,
        model: Transformer,
        policy: str,
        slots: int,
        seed: int = 0,
        stop_tokens: Collection[int] | None = None,
        kv_layout: str = "contiguous",
        block_size: int = 16,
        **settings,
    ) -> None:
        """stop_tokens: end a request at the first of these it generates (the checkpoint's
        end-of-sequence ids); None forces every request to its output_tokens. kv_layout:
        "contiguous" or "paged" (blocks of block_size tokens, unless a KV budget in the
        settings sets them)."""
        self.model, self.policy, self.slots, self.seed = model, policy, slots, seed
        self.kv_layout, self.block_size = kv_layout, block_size
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
    def steps(
        self,
        requests: Sequence[Request],
        arrivals_s: Sequence[float] | None = None,
        client_limit: int | None = None,
    ) -> Iterator[StepRecord]:
        """Every request to its last token, one record per step as it ends. `self.result`
        holds the run so far (an interrupted run keeps its steps); complete once exhausted.

        arrivals_s: each request's arrival in seconds on the wall clock from the start of the
        run: a request joins the queue of the first step that starts after its time has
        passed, and with nothing to run the engine sleeps until the next arrival. Without
        it every request is queued at once, at its arrival_step.

        client_limit (with arrivals_s): a client that keeps at most this many requests in
        flight (core/arrivals.GatedFeed, as the simulation's): an arrival waits for one of
        them to finish, and its metrics count from when it was sent, as a client's do."""
        requests = list(requests)
        check_fits(self.model.cfg.max_context, requests)
        check_prompt_ids(self.model.cfg.vocab, requests)
        sched = make_scheduler(self.policy, self.slots, **self.settings)
        if arrivals_s is None:
            assert client_limit is None, "a client's cap needs arrival times"
            feed = None
        elif client_limit is None:
            feed = ArrivalFeed(requests, arrivals_s)
        else:
            feed = GatedFeed(requests, arrivals_s, client_limit)
        if feed is None:
            sched.add_requests(requests)
        state = RunState(self, requests)
        self.result = result = EngineResult(self.policy, self.slots, len(requests))
        origin = time.perf_counter()  # prompts are ready: the clock of the arrivals starts
        since = None  # the previous step's end, while the loop has not idled since
        while not sched.done or (feed is not None and not feed.empty):
            idle = 0.0 if feed is None else _release(feed, sched, origin)
            if idle:
                since = None
            record = state.step(sched, result, None if feed is None else origin, since)
            if idle:  # the wait before it: the step-cost model prices the core's wake
                record = replace(record, idle_s=idle)
            since = state.last_end
            if client_limit is not None:  # their client slots free as their last tokens come
                feed.finish(state.finished, record.end_s)
            result.steps.append(record)
            yield record
        if feed is None:
            result.metrics = sched.recorder.metrics(result.step_end_times())
            result.metrics.unit = "s"
        else:
            ends = result.step_end_times()
            sent = feed.arrival_s | getattr(feed, "sent_s", {})  # behind a cap: from sending
            result.metrics = timed_run_metrics(sched.recorder.token_steps, ends, sent)
        result.complete = True


def _release(feed: ArrivalFeed | GatedFeed, sched, origin: float) -> float:
    """Queue every request whose arrival time has passed; with nothing to run, sleep until
    the next one arrives (an idle server waits; it does not spin steps). The seconds it
    waited (0.0 where it did not)."""
    feed.release(sched, time.perf_counter() - origin)
    began = None
    while sched.done and not feed.empty:
        began = time.perf_counter() if began is None else began
        time.sleep(max(0.0, feed.next_arrival - (time.perf_counter() - origin)))
        feed.release(sched, time.perf_counter() - origin)
    return 0.0 if began is None else max(time.perf_counter() - began, 1e-9)


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
