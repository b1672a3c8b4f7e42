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

Under torchrun every rank times the step (one at a time: groups would need every rank to
agree on what fits and what ran out of memory) (its shard of it, collectives included); the row
is the slowest rank's (a step ends when its last rank does), each rank's time beside it
(step_ms_rankN), and the step's all-reduces and logits gather timed again on their own at
its message sizes (allreduce_ms, allgather_ms, allreduce_share of the step). FLOPs and
bytes are one rank's (accounting with tp), so mfu and mbu are against one device's roof.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchbatch.core import accounting
from benchbatch.runtime import backend, compiled, device, distributed, timing
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.tensor_parallel import tp_of
from benchbatch.runtime.timing import Measurement, TimingOptions, measure, measure_interleaved


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
    model: Transformer,
    step: Step,
    opts: TimingOptions,
    cuda_graphs: bool = True,
    seed: int = 0,
    kv_layout: str = "contiguous",
    block_size: int = 16,
) -> Callable[[], None]:
    """The call that runs one step, with its own KV cache and inputs (kept alive by the
    call: on CUDA a replay of the step's CUDA graph when asked, captured for this step's
    shape, which owns the eager call and so its tensors until released). kv_layout
    "paged": the cache is blocks of block_size tokens in a shuffled pool, read through
    block tables."""
    dev = model.embed.weight.device
    timing.prepare(dev, opts)
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = model.new_cache(step.batch, step.context + step.tokens, kv_layout, block_size)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    tokens = torch.randint(0, model.cfg.vocab, (step.batch, step.tokens), device=dev, generator=gen)
    slots, kv_len = slice(0, step.batch), step.context + step.tokens

    @torch.inference_mode()
    def run() -> None:
        cache.lengths.fill_(step.context)  # every slot at the context: decode needs no mask
        model.step(tokens, cache, slots, kv_len=kv_len, dense=step.tokens == 1)

    b = backend.of(dev)
    return b.capture(run) if replays_graph(dev, step, cuda_graphs) else run


def time_step(
    model: Transformer,
    step: Step,
    opts: TimingOptions,
    cuda_graphs: bool = True,
    seed: int = 0,
    kv_layout: str = "contiguous",
    block_size: int = 16,
) -> Measurement:
    """Median-of-repeats time of one step, timed alone (see prepare)."""
    dev = model.embed.weight.device
    call = prepare(model, step, opts, cuda_graphs, seed, kv_layout=kv_layout, block_size=block_size)
    try:
        return measure(call, dev, opts)
    finally:
        backend.release_calls([call])


def replays_graph(dev: torch.device, step: Step, cuda_graphs: bool) -> bool:
    """Every step on CUDA, when asked (shapes are static): a decode step is many small
    kernels whose launches would otherwise be timed, and at the article's sizes a prefill
    step's GPU work (1-2 ms) is no longer than the host's launches of its ~500 kernels."""
    return cuda_graphs and backend.of(dev).graphs


def step_row(
    model: Transformer, dtype: str, step: Step, m: Measurement | None, stats: dict | None = None
) -> dict:
    """Everything a table, CSV or plot needs about one step: time, FLOPs, bytes, rates (a
    measurement's, or its summary `stats`; one rank's FLOPs and bytes when sharded)."""
    tp = tp_of(model)
    cost = accounting.step_cost(model.cfg, dtype, step.batch, step.tokens, step.context, tp=tp)
    if stats is None:
        stats = m.summary() if m is not None else timing.unmeasured()
    stats = dict(stats)
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
        "sdpa_backend": _sdpa_backend(model, step),
        **detail,
        **stats,
    }


def _sdpa_backend(model: Transformer, step: Step) -> str:
    """The attention kernel torch picks for this step's shape (benchbatch/runtime/sdpa.py)."""
    from benchbatch.runtime import sdpa

    w = model.embed.weight
    cfg = getattr(model, "local_cfg", model.cfg)  # a rank's own heads under tensor parallel
    return sdpa.for_step(cfg, step.phase, step.tokens, step.context, w.device, w.dtype)


MAX_GROUP = 16  # steps timed together: more than any verdict compares


def held_bytes(cfg, dtype: str, step: Step, tp: int = 1) -> int:
    """Memory a prepared step holds while its group is timed: its KV cache and a step's
    workspace (a CUDA graph keeps its own pool); one rank's under tensor parallelism."""
    cache = accounting.kv_cache_bytes(cfg, dtype, step.batch, step.context + step.tokens, tp)
    return cache + accounting.step_workspace_bytes(cfg, dtype, step.batch * step.tokens, tp)


def groups(plan: list[Step], cfg, dtype: str, budget: int, tp: int = 1) -> list[list[Step]]:
    """Consecutive steps to time together, as many as `budget` bytes hold at once and at
    most MAX_GROUP (a group's rows are written when it ends: a Ctrl-C loses the group under
    way, never more); a step that does not fit with others is timed alone. Under torchrun
    every step alone (ranks would have to agree on every group and every out-of-memory)."""
    if distributed.current().distributed:
        return [[step] for step in plan]
    out: list[list[Step]] = []
    held = budget + 1
    for step in plan:
        need = held_bytes(cfg, dtype, step, tp)
        if out and held + need <= budget and len(out[-1]) < MAX_GROUP:
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
    kv_layout: str = "contiguous",
    block_size: int = 16,
) -> list[dict]:
    """Time the steps of a group together, their repeats interleaved (timing.py), and return
    their rows in order; timing_group numbers the rows timed together. A step that runs out
    of memory while being prepared is an oom row; the others are timed without it."""
    layout = {"kv_layout": kv_layout, "block_size": block_size}
    if len(group) == 1 or distributed.current().distributed:
        number = next_group()
        rows = [run_step(model, dtype, step, opts, cuda_graphs, **layout) for step in group]
        return [{**row, "timing_group": number} for row in rows]
    dev = model.embed.weight.device
    spent: dict[int, dict] = {}  # each step's compile columns, when compiled
    makers = [
        functools.partial(_prepared, model, step, opts, cuda_graphs, layout, spent, i)
        for i, step in enumerate(group)
    ]
    measured = measure_prepared(makers, dev, opts)
    if measured is None:  # out of memory while timing them together: time each alone
        return [run_step(model, dtype, step, opts, cuda_graphs, **layout) for step in group]
    number = next_group()
    rows = []
    for i, (step, m) in enumerate(zip(group, measured, strict=True)):
        row = {**step_row(model, dtype, step, m), "status": "oom" if m is None else "ok",
               "kv_layout": kv_layout, "timing_group": number}  # fmt: skip
        rows.append({**row, **spent.get(i, {})})
    return rows


def _prepared(model, step: Step, opts, cuda_graphs: bool, layout: dict, spent: dict, i: int):
    """prepare(), and for a compiled model one call first: torch compiles for the step's
    shape then, outside the group's timing; spent[i] keeps its compile columns (seconds,
    recompiles, calls run eagerly past dynamo's recompile limit: compiled.row_columns)."""
    before = compiled.counts(model)
    call = prepare(model, step, opts, cuda_graphs, 0, **layout)
    if before is not None:
        call()
        spent[i] = compiled.row_columns(model, before)
    return call


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
        backend.release_calls(calls.values())  # the group is done: graphs and their inputs
        calls.clear()
        device.release_memory(dev)
    return [measured.get(i) for i in range(len(makers))]


def run_step(
    model: Transformer,
    dtype: str,
    step: Step,
    opts: TimingOptions,
    cuda_graphs: bool = True,
    kv_layout: str = "contiguous",
    block_size: int = 16,
) -> dict:
    """Time a step and return its row; out of memory is recorded as such, not raised. A
    compiled model's row has compile_s: the seconds torch spent compiling for this step (in
    its untimed warm-up calls), apart from step_ms."""
    timed = lambda: time_step(model, step, opts, cuda_graphs, kv_layout=kv_layout,  # noqa: E731
                              block_size=block_size)  # fmt: skip
    before = compiled.counts(model)
    m, status = device.measured_or_oom(timed, model.embed.weight.device)
    extra = {"kv_layout": kv_layout, **compiled.row_columns(model, before)}
    if distributed.current().distributed:
        row = across_ranks(model, dtype, step, m, status, opts, cuda_graphs)
        return {**row, **extra}
    return {**step_row(model, dtype, step, m), "status": status, **extra}


def across_ranks(model, dtype: str, step: Step, m, status: str, opts, graphs: bool) -> dict:
    """The row under torchrun: the slowest rank's time, every rank's beside it, and the
    step's collectives timed on their own (every rank takes part)."""
    from benchbatch.runtime import interconnect

    world = distributed.current()
    status = next((s for s in distributed.gather(status) if s != "ok"), "ok")
    comm = {"allreduce_ms": 0.0, "allgather_ms": 0.0}
    if status == "ok" and world.tp > 1:
        rows = step.batch * step.tokens
        comm = interconnect.step_collectives(model, dtype, rows, step.batch, opts, graphs)
    ranks = distributed.gather({"stats": m.summary() if m is not None else None, **comm})
    if status != "ok":
        return {**step_row(model, dtype, step, None), "status": status, "tp": world.tp}
    slow = max(ranks, key=lambda r: r["stats"]["step_ms"])
    row = {**step_row(model, dtype, step, None, slow["stats"]), "status": status}
    return {**row, **collective_columns(model.cfg, dtype, step, world, ranks, row["step_ms"])}


def collective_columns(cfg, dtype: str, step: Step, world, ranks: list[dict], step_ms: float):
    """tp, the slowest rank's all-reduce and gather times, their share of the step, the
    all-reduce's message and bus bandwidth (nccl-tests'), and every rank's times."""
    reduce_ms = max(r["allreduce_ms"] for r in ranks)
    message = accounting.allreduce_bytes(cfg, dtype, step.batch * step.tokens)
    count = accounting.allreduces_per_step(cfg, world.tp)
    seconds = reduce_ms / 1e3
    busbw = accounting.bus_bytes(message, world.tp) * count / seconds / 1e9 if count else math.nan
    out = {
        "tp": world.tp,
        "allreduce_ms": reduce_ms,
        "allgather_ms": max(r["allgather_ms"] for r in ranks),
        "allreduce_share": reduce_ms / step_ms,
        # timed apart, the all-reduces took longer than the whole step holding them: their
        # own timing met other work (ranks sharing cores), not a share of this step
        "allreduce_over_step": reduce_ms > step_ms,
        "allreduce_bytes": message,
        "allreduce_count": count,
        "allreduce_busbw_gbps": busbw,
    }
    for i, r in enumerate(ranks):
        out[f"step_ms_rank{i}"] = r["stats"]["step_ms"]
        out[f"allreduce_ms_rank{i}"] = r["allreduce_ms"]
    return out
