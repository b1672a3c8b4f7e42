"""The engine calibrated as it runs: a short run of the real engine itself (Engine, through
runs.engine_events, so a recorder keeps every step) over a workload made to produce the
steps a serving run takes (decode-only steps at several batch sizes and contexts, prefills
of a few lengths and of several prompts at once, unchunked prompts and chunks of a long
prompt beside decodes), each step's whole time (step_s: the engine's own work included, as
the serving loop pays it) kept for core/calibration.py's fit, beside the conditions it was
measured under (device, torch, dtype, threads, pinning, load).

The steps isolated by runtime/mixed.py time the model's forward alone; these time what the
engine pays per step, which is what the simulator must predict.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from benchbatch.core.machine import core_count
from benchbatch.core.plans import StepPlan
from benchbatch.core.saved_calibration import host_id, load_class
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import simulate
from benchbatch.core.workload import Request
from benchbatch.runtime.runs import EngineRun, Finished, engine_events

# An engine run's settings the scheduler does not take (the cache's layout: the engine's).
ENGINE_ONLY = ("kv_layout", "block_size")

# Steps of the first run taken once, unrecorded, before the calibration records: its
# prefill of every slot and decodes at the largest batch.
WARM_UP_STEPS = 8


@dataclass(frozen=True)
class Plan:
    """The calibration workload's shape: the batch sizes up to `slots`, the prompt length a
    serving run's requests have (`prompt`), the longest it has (`long_prompt`), the
    chunked policy's `chunk` and token budget, `decode_steps` steps per batch size."""

    slots: int
    prompt: int
    long_prompt: int
    chunk: int
    budget: int
    decode_steps: int = 8
    max_context: int = 4096


@dataclass(frozen=True)
class CalibrationRun:
    """One run of the calibration: its engine run and its own requests."""

    run: EngineRun
    requests: list[Request]


def plan_for(slots: int, prompts: Sequence[int], chunk: int, budget: int, max_context: int,
             decode_steps: int = 8) -> Plan:  # fmt: skip
    """A plan at a workload's operating points: its median and longest prompts."""
    ordered = sorted(prompts)
    prompt, longest = ordered[len(ordered) // 2], ordered[-1]
    return Plan(slots, max(1, prompt), max(prompt, longest), chunk, budget, decode_steps,
                max_context)  # fmt: skip


def _stagger(p: Plan) -> tuple[int, int, int]:
    """(steps a batch, short prompt, long prompt): each staggered group's longest output is
    slots x decode_steps, so fewer steps a batch where that leaves no room for a prompt
    (many slots, a short context)."""
    room = p.max_context - 1
    k = max(1, min(p.decode_steps, (room - 1) // p.slots))
    short = max(1, min(p.prompt, room - p.slots * k))
    return k, short, max(short, min(p.long_prompt, room - p.slots * k))


def runs(p: Plan, layout: dict | None = None, wake: bool = False) -> list[CalibrationRun]:
    """Four engine runs, each on the continuous scheduler:

    decode: `slots` requests admitted at once (one prefill of `slots` prompts), their
      outputs staggered so the decode batch steps down slots, slots - 1, ..., 1, every
      `decode_steps` steps; then as many again with the long prompt (longer contexts),
      admitted as the first finish (unchunked prompts beside decodes); then, once all are
      done, `slots` short prompts again, stepping down every half `decode_steps` (small
      batches at short contexts, as a serving run's are);
    scattered: `slots` long prompts, every other one finishing after `decode_steps`: the
      rest decode over scattered slots (the engine gathers their KV, a view no longer);
    prefill: prompts of a few lengths (a quarter, half, one and two prompts, the long one)
      arriving one step apart, alone and in twos and fours, each generating one token:
      prefill-only steps of one to four sequences;
    chunked: slots - 1 long decodes with long prompts prefilled in chunks of `chunk` beside
      them (mixed steps, each chunk re-reading the earlier ones' KV).
    wake (a serving run's calibration, whose engine waits idle between requests): then
      wake_runs, a lone prefill after idle waits of WAKE_IDLES_S.
    layout: the engine's kv_layout and block_size in every run (the runs it prices use them:
    a paged cache's steps cost what a contiguous one's do not)."""
    s, room = p.slots, p.max_context - 1
    k, short, long = _stagger(p)

    def out(prompt: int, n: int) -> int:  # outputs clipped to the context
        return max(1, min(n, room - prompt))

    decode = [Request(i, short, out(short, k * (i + 1))) for i in range(s)]
    decode += [Request(s + i, long, out(long, k * (i + 1))) for i in range(s)]
    # Then the short prompts again once those are done, stepping down alone: a serving
    # run's small batches are at short contexts, and the groups above reach them only long.
    done = len(plans(EngineRun("decode", s, key="calibration"), decode))
    half = max(2, k // 2)
    decode += [Request(2 * s + i, short, out(short, half * (i + 1)), arrival_step=done)
               for i in range(s)]  # fmt: skip
    # Every other slot finishing first: decodes over scattered slots (their KV gathered).
    scattered = [Request(i, long, out(long, k if i % 2 == 0 else 3 * k))
                 for i in range(max(3, s))]  # fmt: skip
    prefill = _prefills(short, long, room)
    chunked_prompt = max(long, min(3 * p.chunk, room - 8 * k))
    decodes = max(1, s - 1)
    steps = -(-chunked_prompt // p.chunk) * 2 + 2
    chunked = [Request(i, short, out(short, steps + 2 * k)) for i in range(decodes)]
    chunked += [Request(decodes + i, chunked_prompt, out(chunked_prompt, 2),
                        arrival_step=2 + i * steps // 2)
                for i in range(2)]  # fmt: skip
    chunk_settings = {"chunked_prefill": True, "chunk_size": p.chunk, "mixed": True,
                      "max_num_batched_tokens": max(p.budget, p.chunk + decodes)}  # fmt: skip
    kv = dict(layout or {})
    woken = wake_runs(s, short, kv) if wake else []
    return [
        CalibrationRun(EngineRun("decode", s, settings=kv, key="calibration"), decode),
        CalibrationRun(EngineRun("scattered", max(3, s), settings=kv, key="calibration"),
                       scattered),  # fmt: skip
        CalibrationRun(EngineRun("prefill", max(4, s), settings=kv, key="calibration"), prefill),
        CalibrationRun(
            EngineRun("chunked", s, settings=chunk_settings | kv, key="calibration"), chunked
        ),  # fmt: skip
        *woken,
    ]


def _prefills(short: int, long: int, room: int) -> list[Request]:
    """The prefill run's requests: prompts of a few lengths, alone, in twos and in fours,
    one step apart, each generating one token."""
    lengths = sorted({max(1, short // 4), max(1, short // 2), short, min(2 * short, room), long})
    prefill, t = [], 0
    for group in (1, 2, 4):
        for n in lengths:
            prefill += [Request(len(prefill) + j, n, 1, arrival_step=t) for j in range(group)]
            t += 1
    return prefill


# The idle waits (seconds) before the wake runs' lone prefills, each WAKE_ROUNDS times in
# turn: 0 (no wait) beside the others, so the steady fit prices the same step unwoken.
WAKE_IDLES_S = (0.0, 0.03, 0.1, 0.3, 1.0)
WAKE_ROUNDS = 2


def wake_runs(slots: int, prompt: int, kv: dict) -> list[CalibrationRun]:
    """A serving run's engine waits idle between requests, and the step after a wait costs
    more (core/wake.py): one request of `prompt` tokens and one output token, arriving
    after each wait of WAKE_IDLES_S (the engine sleeps until it arrives, as it does between
    a serving run's requests, and records the wait: idle_ms), WAKE_ROUNDS times."""
    return [CalibrationRun(EngineRun("wake", slots, settings=kv, key="calibration",
                                     arrivals_s=[idle]), [Request(0, prompt, 1)])
            for _ in range(WAKE_ROUNDS) for idle in WAKE_IDLES_S]  # fmt: skip


def plans(run: EngineRun, requests: Sequence[Request]) -> list[StepPlan]:
    """The steps the engine takes for these requests: the scheduler replayed (the engine
    runs exactly its plans): the calibration's step count before it runs, and each
    recorded step checked against its plan."""
    out: list[StepPlan] = []

    def keep(plan: StepPlan) -> float:
        out.append(plan)
        return 0.0

    scheduled = {k: v for k, v in run.settings.items() if k not in ENGINE_ONLY}
    sched = make_scheduler(run.policy, run.slots, **scheduled)
    simulate(list(requests), sched, keep, fast=False, with_metrics=False)
    return out


def events(
    model, calibration: Sequence[CalibrationRun], seed: int = 0, warm_up: bool = True
) -> Iterator:
    """Every calibration run's step rows, each with the step's features (the record's counts,
    checked against the replayed plan), then each run's Finished. warm_up:
    the first run's first WARM_UP_STEPS steps beforehand, unrecorded (a fresh model's first
    steps pay one-time costs, allocation and kernels' set-up, that a serving run after the
    calibration does not)."""
    if warm_up and calibration:
        first = calibration[0]
        for n, _ in enumerate(engine_events(model, first.requests, [first.run], seed), 1):
            if n >= WARM_UP_STEPS:
                break
    for c in calibration:
        steps = plans(c.run, c.requests)
        for event in engine_events(model, c.requests, [c.run], seed):
            if isinstance(event, Finished):
                yield event
                continue
            plan = steps[event["step"]]
            assert plan.num_decode_tokens == event["decode_tokens"], "the engine left the plan"
            assert plan.num_prefill_tokens == event["prefill_tokens"], "the engine left the plan"
            assert plan.num_active == event["active"], "the engine left the plan"
            # The record carries every other feature (context, gathered and masked tokens,
            # batched: runtime/engine.py from the plan); the fit's sequences are its active.
            yield event | {"sequences": event["active"]}


def total_steps(calibration: Sequence[CalibrationRun]) -> int:
    return sum(len(plans(c.run, c.requests)) for c in calibration)


def fit_rows(rows: Sequence[dict]) -> list[dict]:
    """The fit's rows from the recorded step rows (step_ms: the whole step)."""
    keys = ("calibration", "step", "sequences", "decode_tokens", "prefill_tokens",
            "context_tokens", "gathered_tokens", "masked_tokens", "batched", "prompt_pairs",
            "decode_only_rows", "prefill_step", "since_change",
            "step_ms", "gap_ms", "model_ms", "cpu_ms", "gap_cpu_ms", "idle_ms")  # fmt: skip
    return [{k: r[k] for k in keys if k in r} for r in rows]


def conditions(model, layout: dict | None = None, cores: int | None = None) -> dict:
    """What the calibration was measured under: read again when it is used. layout: the
    engine's kv_layout and block_size (contiguous by default); cores: the physical cores
    the run's load class counts (its metadata's, taken before its compute thread was
    pinned: pinned, this thread sees one)."""
    from benchbatch import __version__
    from benchbatch.runtime.device import device_name

    param = model.embed.weight
    n = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    pinned = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    state = getattr(model, "compiled", None)
    kv = dict(layout or {})
    return {
        "device": device_name(param.device),
        "device_type": param.device.type,
        "torch": torch.__version__,
        "dtype": str(param.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "pinned_cores": "all" if pinned is None or len(pinned) == n else pinned,
        "cores": n,
        "load_1min": load,
        "load_class": load_class(load, cores or core_count()),  # on physical cores, as the run's
        "benchbatch": __version__,
        "host_id": host_id(platform.node()),
        "model": model_shape(model.cfg),
        "weight_layout": getattr(getattr(model, "layout", None), "name", None),
        "compiled": state.mode if state is not None and state.applied else "eager",
        "kv_layout": kv.get("kv_layout", "contiguous")
        + (f", blocks of {kv.get('block_size', 16)}" if kv.get("kv_layout") == "paged" else ""),
    }


def model_shape(cfg) -> str:
    """A model's shape in one comparable line: what its steps' costs scale with."""
    return (f"hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads "
            f"({cfg.kv_heads or cfg.heads} KV), intermediate {cfg.intermediate}, "
            f"vocab {cfg.vocab}")  # fmt: skip
