"""Prefill tokens riding on a decode step, and what splitting a prompt into chunks costs.

A decode step reads every weight for one token per sequence, so the device idles on
arithmetic; prefill tokens added to the same forward (a mixed step, Sarathi-Serve's
"piggybacking") use that idle arithmetic and may cost almost nothing until the step turns
compute-bound. The paper puts the crossover in linear layers at about 128 prefill tokens per
decode token. Chunking a prompt has a price: every chunk reads the weights again and attends
to the keys and values of all earlier chunks (the KV re-read), and an odd chunk length can
fall off the kernels' tiles (the paper: a 257-token chunk ran 32% slower than 256).

`time_mixed` is the one way a mixed step is timed (the ablation's cost fit uses it too):
like steps.time_step, each step gets its own KV cache filled with random values and is
repeated in place through the shared harness, the cache lengths reset inside the timed call.
`rows` times every step of the plan and yields one raw row per step as it is measured
(steps.csv); the relative rows (piggyback.csv, chunks.csv) are derived from those at the end,
so an interrupted run keeps every step it timed. On CUDA every timed step (mixed steps, the
whole chunked-prefill loop, the tiles) replays a CUDA graph unless cuda_graphs is False:
"nearly free" must compare GPU work, not launch overhead. Nothing here prints.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from benchbatch.core import accounting
from benchbatch.experiments.piggyback.options import PiggybackOptions as Options
from benchbatch.runtime import device, timing
from benchbatch.runtime.mixed import (  # noqa: F401  (the steps this experiment times)
    MixedStep,
    graphed,
    prepare_chunked,
    prepare_mixed,
    time_chunked_prefill,
    time_mixed,
)
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import Measurement, TimingOptions, measure

__all__ = ["Options", "MixedStep", "plan", "rows", "piggyback_rows", "chunk_rows", "tile_rows"]

PAPER_PREFILL_PER_DECODE_TOKEN = 128  # Sarathi-Serve: linear layers, one decode ~ 128 prefill


# --- the plan and its raw rows ---------------------------------------------------------------


@dataclass(frozen=True)
class Chunked:
    """A `prompt`-token prompt prefilled as consecutive steps of `chunk` tokens."""

    prompt: int
    chunk: int

    @property
    def label(self) -> str:
        return f"{self.prompt}-token prompt in chunks of {self.chunk}"


@dataclass(frozen=True)
class Timed:
    """One timed step of the plan and the table it feeds: piggyback, chunked or tile."""

    part: str
    step: MixedStep | Chunked


def plan(opts: Options) -> list[Timed]:
    """Per decode batch and context, the decode step with 0, P1, P2, ... prefill tokens riding
    along; each P alone; the prompt in chunks of each size (and whole); each tile length."""
    tokens = sorted(set(opts.piggyback_tokens))
    out = [
        Timed("piggyback", MixedStep(b, c, p))
        for b in opts.decode_batch
        for c in opts.context
        for p in [0, *tokens]
    ]
    out += [Timed("piggyback", MixedStep(0, 0, p)) for p in tokens]
    sizes = sorted({min(c, opts.chunk_prompt) for c in opts.chunks} | {opts.chunk_prompt})
    out += [Timed("chunked", Chunked(opts.chunk_prompt, c)) for c in sizes]
    return out + [Timed("tile", MixedStep(0, 0, t)) for t in sorted(set(opts.tiles))]


def rows(
    model: Transformer, opts: Options, timed: TimingOptions, cuda_graphs: bool = True
) -> Iterator[dict]:
    """steps.csv: one row per timed step. The steps of each table are compared with each
    other (a mixed step with the decode-only one, chunks with one prefill, 257 tokens with
    256), so each table's steps are timed together, their repeats interleaved, and yielded
    when measured; a step too large for memory is an oom row and the rest go on."""
    from benchbatch.runtime import steps

    dev = model.embed.weight.device
    items = plan(opts)
    for part in dict.fromkeys(t.part for t in items):
        group = [t for t in items if t.part == part]
        makers = [functools.partial(_prepare, model, t, timed, cuda_graphs) for t in group]
        measured = steps.measure_prepared(makers, dev, timed)
        if measured is None:  # out of memory while timed together: each alone
            measured = [_alone(model, t, timed, cuda_graphs) for t in group]
        number = steps.next_group()
        for item, m in zip(group, measured, strict=True):
            cost = _cost(model.cfg, dtype_of(model), item.step)
            row = raw_row(item, m, "ok" if m is not None else "oom", cost)
            yield {**row, "sdpa_backend": sdpa_backends(model, item.step), "timing_group": number}


def sdpa_backends(model: Transformer, step: MixedStep | Chunked) -> str:
    """The SDPA backend of each kind of attention call the step makes (engines/sdpa.py):
    its decode rows (no mask), a fresh prompt's chunk (causal), a chunk over cached
    tokens (masked); e.g. "decode: flash; prefill: flash"."""
    from benchbatch.runtime import sdpa

    w, cfg = model.embed.weight, getattr(model, "local_cfg", model.cfg)
    calls = []  # (kind, new tokens, keys)
    if isinstance(step, Chunked):
        calls.append(("prefill", min(step.chunk, step.prompt), min(step.chunk, step.prompt)))
        if step.chunk < step.prompt:
            calls.append(("masked", step.chunk, step.prompt))
    else:
        if step.decode_batch:
            calls.append(("decode", 1, step.context + 1))
        if step.prefill_tokens:
            end = step.prefill_start + step.prefill_tokens
            calls.append(
                ("prefill" if step.prefill_start == 0 else "masked", step.prefill_tokens, end)
            )
    names = [f"{k}: {sdpa.for_kind(cfg, k, t, n, w.device, w.dtype)}" for k, t, n in calls]
    return "; ".join(names)


def _alone(model, item: Timed, opts: TimingOptions, cuda_graphs: bool) -> Measurement | None:
    dev = model.embed.weight.device
    try:
        return measure(_prepare(model, item, opts, cuda_graphs), dev, opts)
    except (RuntimeError, MemoryError) as e:
        if not device.is_out_of_memory(e):
            raise
        return None
    finally:
        device.release_memory(dev)


def _prepare(model, item: Timed, opts: TimingOptions, cuda_graphs: bool):
    if isinstance(item.step, Chunked):
        step = item.step
        return prepare_chunked(model, step.prompt, step.chunk, opts, cuda_graphs=cuda_graphs)
    return prepare_mixed(model, item.step, opts, cuda_graphs)


def dtype_of(model: Transformer) -> str:
    from benchbatch.runtime.device import DTYPES

    return next(name for name, dt in DTYPES.items() if dt == model.embed.weight.dtype)


def _cost(cfg, dtype: str, step: MixedStep | Chunked) -> tuple[int, int]:
    """(FLOPs, bytes) of a timed step: a mixed step reads the weights once; a prompt in
    chunks is one step per chunk, each reading the weights and the chunks before it."""
    if isinstance(step, Chunked):
        starts = range(0, step.prompt, step.chunk)
        costs = [accounting.step_cost(cfg, dtype, 1, min(step.chunk, step.prompt - s), s)
                 for s in starts]  # fmt: skip
        return sum(c.flops for c in costs), sum(c.bytes for c in costs)
    return accounting.mixed_cost(
        cfg, dtype, step.decode_batch, step.context, step.prefill_tokens, step.prefill_start
    )


def raw_row(
    item: Timed, m: Measurement | None, status: str = "ok", cost: tuple[int, int] | None = None
) -> dict:
    """One timed step as steps.csv keeps it; with its (FLOPs, bytes) it also carries the
    rates and the intensity that place it on the roofline."""
    s = item.step
    chunked = isinstance(s, Chunked)
    ms = m.median_ms if m is not None else math.nan
    row = {
        "part": item.part,
        "phase": "prefill" if chunked else s.kind,
        "label": s.label,
        "decode_batch": 0 if chunked else s.decode_batch,
        "context": 0 if chunked else s.context,
        "prefill_tokens": s.prompt if chunked else s.prefill_tokens,
        "prefill_start": 0 if chunked else s.prefill_start,
        "chunk_tokens": s.chunk if chunked else s.prefill_tokens,
        "step_ms": ms,
    }
    if cost is not None:
        flops, nbytes = cost
        row |= {
            "flops": flops,
            "bytes": nbytes,
            "arithmetic_intensity": flops / nbytes,
            "tflops": flops / ms / 1e9,
            "gbps": nbytes / ms / 1e6,
        }
    return {**row, **_timing(m), "status": status}


# --- the piggyback curves ----------------------------------------------------------------------


def piggyback_rows(raw: Sequence[dict]) -> list[dict]:
    """piggyback.csv: per decode batch and context and per prefill size P, the mixed step
    against the decode-only step and against running the decode step and the prefill alone,
    one after the other. A row is throttled when any step its numbers come from was."""
    steps = [r for r in raw if r["part"] == "piggyback" and r["status"] == "ok"]
    alone = {r["prefill_tokens"]: r for r in steps if not r["decode_batch"]}
    out = []
    for key in dict.fromkeys((r["decode_batch"], r["context"]) for r in steps if r["decode_batch"]):
        curve = [r for r in steps if (r["decode_batch"], r["context"]) == key]
        base = next((r for r in curve if r["prefill_tokens"] == 0), None)
        if base is not None:
            out += [_curve_row(r, base, alone.get(r["prefill_tokens"])) for r in curve]
    return out


def _curve_row(r: dict, base: dict, alone: dict | None) -> dict:
    p, base_ms, ms = r["prefill_tokens"], base["step_ms"], r["step_ms"]
    alone_ms = alone["step_ms"] if alone else (0.0 if not p else math.nan)
    separate = base_ms + alone_ms
    flags = [r, base] + ([alone] if alone else [])
    return {
        "decode_batch": r["decode_batch"],
        "context": r["context"],
        "prefill_tokens": p,
        "prefill_per_decode_token": p / r["decode_batch"],
        "step_ms": ms,
        "decode_only_ms": base_ms,
        "over_decode": ms / base_ms,
        "extra_ms": ms - base_ms,
        "extra_us_per_prefill_token": 1e3 * (ms - base_ms) / p if p else math.nan,
        "prefill_alone_ms": alone_ms,
        "separate_ms": separate,
        "saved_ms": separate - ms,
        **{k: r[k] for k in TIMING_KEYS},
        **_flags(*flags),
    }


def free_prefill_tokens(rows: Sequence[dict], threshold: float) -> int:
    """The largest P whose mixed step, and every smaller one's, stays within `threshold`
    (0.1: 10%) of the decode-only step: the prefill tokens that ride nearly free."""
    free = 0
    for r in sorted(rows, key=lambda r: r["prefill_tokens"]):
        if r["over_decode"] > 1 + threshold:
            break
        free = r["prefill_tokens"]
    return free


def summaries(rows: Sequence[dict], threshold: float) -> list[dict]:
    """One summary per decode batch and context."""
    keys = dict.fromkeys((r["decode_batch"], r["context"]) for r in rows)
    return [
        piggyback_summary([r for r in rows if (r["decode_batch"], r["context"]) == k], threshold)
        for k in keys
    ]


def piggyback_summary(rows: Sequence[dict], threshold: float) -> dict:
    """How many prefill tokens ride free; what one decode step is worth in prefill tokens."""
    free = free_prefill_tokens(rows, threshold)
    batch = rows[0]["decode_batch"]
    largest = max(rows, key=lambda r: r["prefill_tokens"])
    slope_ms = largest["extra_ms"] / largest["prefill_tokens"] if largest["prefill_tokens"] else 0
    equivalent = rows[0]["decode_only_ms"] / slope_ms if slope_ms > 0 else math.inf
    return {
        "threshold": threshold,
        "decode_batch": batch,
        "context": rows[0]["context"],
        "decode_only_ms": rows[0]["decode_only_ms"],
        "free_prefill_tokens": free,
        "free_prefill_per_decode_token": free / batch,
        "prefill_tokens_per_decode_step": equivalent,
        "prefill_tokens_per_decode_token": equivalent / batch,
        "paper_prefill_per_decode_token": PAPER_PREFILL_PER_DECODE_TOKEN,
        "largest_prefill_tokens": largest["prefill_tokens"],
        "largest_over_decode": largest["over_decode"],
    }


# --- chunk sizes and tiles -----------------------------------------------------------------------


def chunk_rows(raw: Sequence[dict], cfg, dtype: str) -> list[dict]:
    """chunks.csv's 'chunked' rows: the prompt prefilled in chunks of C, against one prefill
    (C = the prompt is the one-prefill row); throttled with the one prefill too."""
    steps = [r for r in raw if r["part"] == "chunked" and r["status"] == "ok"]
    whole = next((r for r in steps if r["chunk_tokens"] == r["prefill_tokens"]), None)
    if whole is None:
        return []
    return [
        {
            **_chunk_row(cfg, dtype, r, whole["step_ms"]),
            **_flags(r, whole),
        }
        for r in steps
    ]


def _chunk_row(cfg, dtype: str, r: dict, whole_ms: float) -> dict:
    prompt, chunk, ms = r["prefill_tokens"], r["chunk_tokens"], r["step_ms"]
    starts = range(0, prompt, chunk)
    costs = [accounting.step_cost(cfg, dtype, 1, min(chunk, prompt - s), s) for s in starts]
    return {
        "kind": "chunked",
        "prompt_tokens": prompt,
        "chunk_tokens": chunk,
        "chunks": len(costs),
        "total_ms": ms,
        "ms_per_token": ms / prompt,
        "over_one_prefill": ms / whole_ms,
        "extra": ms / whole_ms - 1,  # a fraction: 0.2 is 20% longer than one prefill
        # What the extra time pays for: the weights read once per chunk, and every chunk's
        # attention re-reading the keys and values of the chunks before it.
        "weight_bytes": sum(c.weight_bytes for c in costs),
        "kv_read_bytes": sum(c.kv_read_bytes for c in costs),
        **{k: r[k] for k in TIMING_KEYS},
    }


def tile_rows(raw: Sequence[dict]) -> list[dict]:
    """chunks.csv's 'tile' rows: one prefill step of each length (e.g. 256 against 257): a
    length just past a multiple of the kernels' tile pays for a mostly empty extra tile.
    Each row is a ratio to the previous length, and throttled if either was."""
    out, previous = [], None
    for r in (r for r in raw if r["part"] == "tile" and r["status"] == "ok"):
        t, ms = r["prefill_tokens"], r["step_ms"]
        out.append(
            {
                "kind": "tile",
                "prompt_tokens": t,
                "chunk_tokens": t,
                "chunks": 1,
                "total_ms": ms,
                "ms_per_token": ms / t,
                "over_previous": ms / previous["step_ms"] if previous else math.nan,
                **{k: r[k] for k in TIMING_KEYS},
                **_flags(r, previous),
            }
        )
        previous = r
    return out


TIMING_KEYS = (
    *("step_ms_min", "step_ms_iqr", "step_ms_p10", "step_ms_p90", "cv", "repeats", "noisy"),
    *("attempts", "interleaved", "host_ms", "launch_bound"),
)
FLAGS = ("throttled", "power_capped")  # the recorder's look at the GPU after each step


def _timing(m: Measurement | None) -> dict:
    s = m.summary() if m is not None else timing.unmeasured()
    return {k: s[k] for k in TIMING_KEYS}


def _flags(*steps: dict | None) -> dict:
    """A derived row is slowed if any step its numbers come from was."""
    return {f: any(bool(r and r.get(f)) for r in steps) for f in FLAGS}
