"""Time one prefill or decode step of the model and turn it into a row of numbers.

Shared by every probe that times model steps (phases, sweep, ...). A step is
(batch, tokens, context): `tokens` new tokens for each of `batch` sequences that already
hold `context` tokens. Each step gets its own KV cache, sized to the step and filled with
random values (never time on zeros), and is repeated in place: the cache lengths are reset
inside the timed call, so every repeat (and every replay of its CUDA graph) does exactly
the same work.

On CUDA both phases replay a CUDA graph by default: a prefill step of a 1-2 ms GPU workload
takes a few ms of host launches, so an eager prefill would time the launch gaps. Every row
keeps the host's enqueue time (`host_ms`) beside the device time and flags `launch_bound`.

Steps a verdict compares are prepared together (each its own cache and graph) and timed as a
group, their repeats interleaved (`run_group`), as many at once as memory holds (`groups`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchbatch import accounting, backend, device, timing
from benchbatch.engines.model import Transformer
from benchbatch.timing import Measurement, TimingOptions, measure, measure_interleaved


@dataclass(frozen=True)
class Step:
    phase: str  # "prefill" or "decode"
    batch: int
    tokens: int
    context: int

    @property
    def label(self) -> str:
        if self.phase == "prefill":
            return f"prefill {self.tokens}" + (f" x{self.batch}" if self.batch > 1 else "")
        return f"decode b={self.batch}"


def prefill(batch: int, prompt: int) -> Step:
    return Step("prefill", batch, prompt, 0)


def decode(batch: int, context: int) -> Step:
    return Step("decode", batch, 1, context)


def prepare(
    model: Transformer, step: Step, opts: TimingOptions, cuda_graphs: bool = True, seed: int = 0
) -> Callable[[], None]:
    """The call that runs one step, with its own KV cache and inputs (kept alive by the
    call); on CUDA a replay of the step's CUDA graph when asked."""
    dev = model.embed.weight.device
    timing.prepare(dev, opts)
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = model.new_cache(step.batch, step.context + step.tokens)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    tokens = torch.randint(0, model.cfg.vocab, (step.batch, step.tokens), device=dev, generator=gen)
    slots, kv_len = slice(0, step.batch), step.context + step.tokens

    @torch.inference_mode()
    def run() -> None:
        cache.lengths.fill_(step.context)
        model.step(tokens, cache, slots, kv_len=kv_len)

    b = backend.of(dev)
    return b.capture(run) if cuda_graphs and b.graphs else run


def time_step(
    model: Transformer, step: Step, opts: TimingOptions, cuda_graphs: bool = True, seed: int = 0
) -> Measurement:
    """Median-of-repeats time of one step, timed alone; on CUDA it replays a CUDA graph when
    asked (the graph is captured for this step's shape and dropped with it)."""
    dev = model.embed.weight.device
    return measure(prepare(model, step, opts, cuda_graphs, seed), dev, opts)


def step_row(model: Transformer, dtype: str, step: Step, m: Measurement | None) -> dict:
    """Everything a table, CSV or plot needs about one step: time, FLOPs, bytes, rates."""
    cost = accounting.step_cost(model.cfg, dtype, step.batch, step.tokens, step.context)
    stats = m.summary() if m is not None else timing.unmeasured()
    seconds = stats.pop("step_ms") / 1e3
    new_tokens = step.batch * step.tokens
    detail = {k: v for k, v in cost.to_dict().items() if k not in ("batch", "tokens", "context")}
    return {
        "phase": step.phase,
        "label": step.label,
        "batch": step.batch,
        "tokens": step.tokens,
        "context": step.context,
        "step_ms": seconds * 1e3,
        "us_per_token": seconds * 1e6 / new_tokens,
        "tokens_per_s": new_tokens / seconds,
        "tflops": cost.flops / seconds / 1e12,
        "gbps": cost.bytes / seconds / 1e9,
        **detail,
        **stats,
    }


def held_bytes(cfg, dtype: str, step: Step) -> int:
    """Memory a prepared step holds while its group is timed: its KV cache and a step's
    workspace (a CUDA graph keeps its own pool)."""
    cache = accounting.kv_cache_bytes(cfg, dtype, step.batch, step.context + step.tokens)
    return cache + accounting.step_workspace_bytes(cfg, dtype, step.batch * step.tokens)


def groups(plan: list[Step], cfg, dtype: str, budget: int) -> list[list[Step]]:
    """Consecutive steps to time together, as many as `budget` bytes hold at once; a step
    that does not fit with others is timed alone."""
    out: list[list[Step]] = []
    held = budget + 1
    for step in plan:
        need = held_bytes(cfg, dtype, step)
        if out and held + need <= budget:
            out[-1].append(step)
            held += need
        else:
            out.append([step])
            held = need
    return out


def group_budget(dev: torch.device) -> int:
    """Bytes the steps of one group may hold together: most of the memory free now (the
    model built), some left for the allocator and the runtime."""
    return int(0.8 * device.free_memory_bytes(dev))


_group_ids = itertools.count(1)


def run_group(
    model: Transformer,
    dtype: str,
    group: list[Step],
    opts: TimingOptions,
    cuda_graphs: bool = True,
) -> list[dict]:
    """Time the steps of a group together, their repeats interleaved (timing.py), and return
    their rows in order; timing_group numbers the rows timed together. A step that runs out
    of memory while being prepared is an oom row; the others are timed without it."""
    dev = model.embed.weight.device
    makers = [functools.partial(prepare, model, step, opts, cuda_graphs) for step in group]
    measured = measure_prepared(makers, dev, opts)
    if measured is None:  # out of memory while timing them together: time each alone
        return [run_step(model, dtype, step, opts, cuda_graphs) for step in group]
    number = next_group()
    return [
        {**step_row(model, dtype, step, m), "status": "oom" if m is None else "ok",
         "timing_group": number}
        for step, m in zip(group, measured, strict=True)
    ]  # fmt: skip


def next_group() -> int:
    """A new timing_group number: rows that share one were timed together."""
    return next(_group_ids)


def measure_prepared(
    makers: list[Callable[[], Callable[[], object]]], dev: torch.device, opts: TimingOptions
) -> list[Measurement | None] | None:
    """Prepare every call (a maker that runs out of memory gives None in its place), then
    time the prepared ones together, interleaved. None when timing them together ran out
    of memory: the caller times each alone. Their memory is released either way."""
    calls: dict[int, Callable[[], object]] = {}
    try:
        for i, make in enumerate(makers):
            try:
                calls[i] = make()
            except (RuntimeError, MemoryError) as e:
                if not device.is_out_of_memory(e):
                    raise
        times = measure_interleaved(list(calls.values()), dev, opts) if calls else []
        measured = dict(zip(calls, times, strict=True))
    except (RuntimeError, MemoryError) as e:
        if not device.is_out_of_memory(e):
            raise
        return None
    finally:
        calls.clear()
        device.release_memory(dev)
    return [measured.get(i) for i in range(len(makers))]


def run_step(
    model: Transformer, dtype: str, step: Step, opts: TimingOptions, cuda_graphs: bool = True
) -> dict:
    """Time a step and return its row; out of memory is recorded as such, not raised."""
    dev = model.embed.weight.device
    try:
        m = time_step(model, step, opts, cuda_graphs)
        status = "ok"
    except (RuntimeError, MemoryError) as e:
        if not device.is_out_of_memory(e):
            raise
        m, status = None, "oom"
    finally:
        device.release_memory(dev)
    return {**step_row(model, dtype, step, m), "status": status}
