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

Under torchrun every rank times the step (its shard of it, collectives included); the row
is the slowest rank's (a step ends when its last rank does), each rank's time beside it
(step_ms_rankN), and the step's all-reduces and logits gather timed again on their own at
its message sizes (allreduce_ms, allgather_ms, allreduce_share of the step). FLOPs and
bytes are one rank's (accounting with tp), so mfu and mbu are against one device's roof.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from benchbatch import accounting, backend, device, distributed, timing
from benchbatch.engines import compiled
from benchbatch.engines.model import Transformer
from benchbatch.engines.tensor_parallel import tp_of
from benchbatch.timing import Measurement, TimingOptions, measure


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


def time_step(
    model: Transformer,
    step: Step,
    opts: TimingOptions,
    cuda_graphs: bool = True,
    seed: int = 0,
    kv_layout: str = "contiguous",
    block_size: int = 16,
) -> Measurement:
    """Median-of-repeats time of one step; on CUDA it replays a CUDA graph when asked (the
    graph is captured for this step's shape and dropped with it). kv_layout "paged": the
    cache is blocks of block_size tokens in a shuffled pool, read through block tables."""
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
    return measure(b.capture(run) if replays_graph(dev, step, cuda_graphs) else run, dev, opts)


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
        **detail,
        **stats,
    }


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
    before = compiled.compile_seconds(model)
    m, status = device.measured_or_oom(timed, model.embed.weight.device)
    extra = {"kv_layout": kv_layout}
    if getattr(model, "compiled", None) is not None:
        extra["compile_s"] = compiled.compile_seconds(model) - before
    if distributed.current().distributed:
        row = across_ranks(model, dtype, step, m, status, opts, cuda_graphs)
        return {**row, **extra}
    return {**step_row(model, dtype, step, m), "status": status, **extra}


def across_ranks(model, dtype: str, step: Step, m, status: str, opts, graphs: bool) -> dict:
    """The row under torchrun: the slowest rank's time, every rank's beside it, and the
    step's collectives timed on their own (every rank takes part)."""
    from benchbatch.probes import interconnect

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
        "allreduce_bytes": message,
        "allreduce_count": count,
        "allreduce_busbw_gbps": busbw,
    }
    for i, r in enumerate(ranks):
        out[f"step_ms_rank{i}"] = r["stats"]["step_ms"]
        out[f"allreduce_ms_rank{i}"] = r["allreduce_ms"]
    return out
