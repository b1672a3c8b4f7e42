"""Batch size against decode step: throughput, step latency, the knee and the memory ceiling.

A decode step reads every weight once whatever the batch, so while the step is bound by that
read, more sequences per step cost almost nothing: throughput grows with the batch and each
user's wait (the step time) barely moves. The knee is where the step time starts to grow:
compute (or, on CPUs, poor skinny-matmul kernels) takes over. The KV cache each sequence
reads grows with batch and context, so the arithmetic intensity of a decode step levels off
instead of growing without bound, and memory caps the batch before or after the knee.

Everything here but `run` is pure arithmetic on configs and rows (no timing, no device).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from benchbatch.core import accounting, energy
from benchbatch.core.config import DTYPE_BYTES, ModelConfig
from benchbatch.core.noise import time_ratio_range
from benchbatch.core.units import figure
from benchbatch.experiments.sweep.options import SweepOptions as Options
from benchbatch.runtime import energy_meter, steps
from benchbatch.runtime.tensor_parallel import tp_of
from benchbatch.runtime.timing import TimingOptions

__all__ = ["Options", "plan", "ceilings", "rows", "summarize"]


def plan(contexts, batches) -> list[steps.Step]:
    """One decode step per (context, batch): context outer, so each curve is measured whole."""
    return [steps.decode(b, c) for c in contexts for b in batches]


def ceilings(
    cfg: ModelConfig, dtype: str, contexts: list[int], free_bytes: int, tp: int = 1,
    block_size: int | None = None,
) -> dict[int, int]:
    """Largest batch that fits at each context, from memory free before the model is built
    (with tp: on each rank, beside its shard, from the least free on any rank); block_size:
    a paged cache's, whose sequences hold whole blocks.

    `max_batch` subtracts the weights itself, so `free_bytes` must be read before the model
    exists. A decode step at context c holds c + 1 tokens per sequence (the new one too).
    """
    return {c: accounting.max_batch(cfg, dtype, c + 1, free_bytes, tp=tp, block_size=block_size)
            for c in contexts}  # fmt: skip


def rows(
    model,
    dtype: str,
    plan: list[steps.Step],
    timing: TimingOptions,
    ceiling: dict[int, int],
    try_oom: bool = False,
    cuda_graphs: bool = True,
    kv_layout: str = "contiguous",
    block_size: int = 16,
) -> Iterator[dict]:
    """One row per step, in plan order. The batches of one context are compared with each
    other, so they are timed together, their repeats interleaved, as many at once as memory
    holds; batches over the ceiling are skipped, or with `try_oom` timed alone (a real out
    of memory is recorded by run_step as status 'oom' and the sweep goes on)."""
    budget = steps.group_budget(model.embed.weight.device)
    layout = {"kv_layout": kv_layout, "block_size": block_size}
    paged = block_size if kv_layout == "paged" else None  # whole blocks a sequence
    tp = tp_of(model)
    # joules per token: the energy counter around each group's measurement (core/energy.py)
    meter = energy_meter.EnergyMeter(model.embed.weight.device)
    for context in dict.fromkeys(s.context for s in plan):
        limit = ceiling[context]
        mine = [s for s in plan if s.context == context]
        fits = [s for s in mine if s.batch <= limit]
        for group in steps.groups(fits, model.cfg, dtype, budget, tp):
            with meter.span() as span:
                measured = steps.run_group(model, dtype, group, timing, cuda_graphs, **layout)
            for step, row in zip(group, measured, strict=True):
                row = energy.with_step_energy(row, span.reading)
                yield _memory_columns(row, model.cfg, dtype, step, limit, tp, paged)
        for step in (s for s in mine if s.batch > limit):
            span = None
            if try_oom:
                with meter.span() as span:
                    row = steps.run_step(model, dtype, step, timing, cuda_graphs, **layout)
            else:
                row = {**steps.step_row(model, dtype, step, None), "status": "skipped",
                       "kv_layout": kv_layout}  # fmt: skip
            row = energy.with_step_energy(row, span.reading if span else None)
            yield _memory_columns(row, model.cfg, dtype, step, limit, tp, paged)
    meter.close()


def _memory_columns(row: dict, cfg, dtype: str, step: steps.Step, limit: int, tp: int,
                    block_size: int | None = None) -> dict:  # fmt: skip
    kv = accounting.kv_cache_bytes(cfg, dtype, step.batch, step.context + 1, tp, block_size)
    return {**row, "kv_cache_bytes": kv, "predicted_max_batch": limit}


def measured_knee(points: Iterable[tuple[int, float]], threshold: float) -> int | None:
    """First batch whose step time exceeds the smallest batch's by more than `threshold`
    (0.25: 25%). Points are (batch, step_ms); NaN times (oom, skipped) are ignored."""
    valid = sorted((b, ms) for b, ms in points if math.isfinite(ms))
    if len(valid) < 2:
        return None
    base = valid[0][1]
    for batch, ms in valid[1:]:
        if ms > base * (1 + threshold):
            return batch
    return None


@dataclass(frozen=True)
class RooflineKnee:
    """Where the roofline says a decode step turns compute-bound."""

    batch: int | None  # smallest batch whose intensity reaches the ridge; None: no such batch
    ridge_flop_per_byte: float | None
    limit_flop_per_byte: float  # the intensity a decode step tends to as the batch grows
    fits: bool  # batch is at or below the memory ceiling
    note: str


def intensity_limit(cfg: ModelConfig, dtype: str, context: int, tp: int = 1) -> float:
    """FLOP/byte of a decode step as batch grows without bound: per-sequence FLOPs over
    per-sequence bytes (its KV cache, activations, token), once the weight read is shared."""
    one = accounting.decode_cost(cfg, dtype, 1, context, tp)
    two = accounting.decode_cost(cfg, dtype, 2, context, tp)
    return (two.flops - one.flops) / (two.bytes - one.bytes)


def predicted_knee(
    cfg: ModelConfig,
    dtype: str,
    context: int,
    ridge_flop_per_byte: float | None,
    ceiling: int | None = None,
    tp: int = 1,
    no_ridge: str = "unknown device",
) -> RooflineKnee:
    """The smallest batch whose accounted arithmetic intensity reaches the ridge point.

    The ridge is a datasheet FLOP/byte today; a measured ceiling of the device can be passed
    instead. Intensity = a*B / (W + g*B) grows with B towards a/g, so it is solved exactly.
    Without a ridge the note says why (`no_ridge`: the device, or --no-roofline).
    """
    limit = intensity_limit(cfg, dtype, context, tp)
    ridge = ridge_flop_per_byte
    if ridge is None:
        return RooflineKnee(None, None, limit, False, f"no prediction ({no_ridge})")
    if limit <= ridge:
        note = (
            f"never: intensity tends to {figure(limit)} FLOP/B, not above the ridge "
            f"{figure(ridge)} "
            "(KV-cache reads grow with batch)"
        )
        return RooflineKnee(None, ridge, limit, False, note)
    batch = _first_batch_reaching(cfg, dtype, context, ridge, tp)
    fits = ceiling is None or batch <= ceiling
    note = f"batch {batch:,} (intensity reaches the ridge, {figure(ridge)} FLOP/B)"
    if not fits:
        note = f"batch {batch:,}, above the memory ceiling {ceiling:,}: memory runs out first"
    return RooflineKnee(batch, ridge, limit, fits, note)


def matmul_knee(dtype: str, ridge_flop_per_byte: float | None) -> int | None:
    """The batch at which the weight matmuls alone reach the ridge: each weight read
    (DTYPE_BYTES bytes) serves 2 x batch FLOPs. Attention over the KV cache never gets there
    (its FLOPs and bytes both grow with batch), so this is where step time grows in practice
    when the weights dominate the step."""
    if ridge_flop_per_byte is None:
        return None
    return max(1, math.ceil(ridge_flop_per_byte * DTYPE_BYTES[dtype] / 2))


def _intensity(cfg: ModelConfig, dtype: str, context: int, batch: int, tp: int = 1) -> float:
    return accounting.decode_cost(cfg, dtype, batch, context, tp).arithmetic_intensity


def _first_batch_reaching(
    cfg: ModelConfig, dtype: str, context: int, ridge: float, tp: int = 1
) -> int:
    """Solve a*B >= ridge * (W + g*B); the caller has checked a > ridge * g."""
    one = accounting.decode_cost(cfg, dtype, 1, context, tp)
    two = accounting.decode_cost(cfg, dtype, 2, context, tp)
    per_flops, per_bytes = two.flops - one.flops, two.bytes - one.bytes
    fixed_bytes = one.bytes - per_bytes  # the weights: read once whatever the batch
    batch = max(1, math.ceil(ridge * fixed_bytes / (per_flops - ridge * per_bytes)))
    # Guard against float rounding of the closed form with the accounting itself.
    while batch > 1 and _intensity(cfg, dtype, context, batch - 1, tp) >= ridge:
        batch -= 1
    while _intensity(cfg, dtype, context, batch, tp) < ridge:
        batch += 1
    return batch


def claim(rows: list[dict]) -> dict | None:
    """The article's claim for one context: from the smallest to the largest measured batch,
    how much throughput grew and how much each user's wait (the step time) grew."""
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["batch"])
    if len(ok) < 2:
        return None
    first, last = ok[0], ok[-1]
    best = max(ok, key=lambda r: r["tokens_per_s"])
    throughput = last["tokens_per_s"] / first["tokens_per_s"]  # as first's time over last's
    latency = last["step_ms"] / first["step_ms"]
    t_low, t_high = time_ratio_range(throughput, first, last)
    l_low, l_high = time_ratio_range(latency, last, first)
    return {
        "batch_from": first["batch"],
        "batch_to": last["batch"],
        "throughput_ratio": throughput,
        "throughput_ratio_low": t_low,
        "throughput_ratio_high": t_high,
        "step_latency_ratio": latency,
        "step_latency_ratio_low": l_low,
        "step_latency_ratio_high": l_high,
        "best_batch": best["batch"],
        "best_tokens_per_s": best["tokens_per_s"],
    }


def summarize(
    rows: list[dict],
    cfg: ModelConfig,
    dtype: str,
    ceiling: dict[int, int],
    ridge_flop_per_byte: float | None,
    threshold: float,
    tp: int = 1,
    no_ridge: str = "unknown device",
) -> list[dict]:
    """Per context: memory ceiling, measured knee, roofline knee and the article's claim
    (with tp: one rank's, as the rows are); `no_ridge` says why a ridge is None."""
    out = []
    for context, limit in ceiling.items():
        mine = [r for r in rows if r["context"] == context]
        ok = dict((r["batch"], r["step_ms"]) for r in mine if r["status"] == "ok")
        knee_at = measured_knee(ok.items(), threshold)
        knee = predicted_knee(cfg, dtype, context, ridge_flop_per_byte, limit, tp, no_ridge)
        out.append(
            {
                "context": context,
                "predicted_max_batch": limit,
                "measured_knee": knee_at,
                "measured_knee_step_ratio": ok[knee_at] / ok[min(ok)] if knee_at else None,
                "knee_threshold": threshold,
                "predicted_knee": knee.batch,
                "predicted_knee_fits": knee.fits,
                "predicted_knee_note": knee.note,
                "matmul_knee": matmul_knee(dtype, ridge_flop_per_byte),
                "ridge_flop_per_byte": knee.ridge_flop_per_byte,
                "intensity_limit_flop_per_byte": knee.limit_flop_per_byte,
                "statuses": {s: sum(r["status"] == s for r in mine) for s in _statuses(mine)},
                **(claim(mine) or {}),
            }
        )
    return out


def _statuses(rows: list[dict]) -> list[str]:
    return sorted({r["status"] for r in rows})
