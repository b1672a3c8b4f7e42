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
On CUDA every timed step (mixed steps, the whole chunked-prefill loop, the tiles) replays a
CUDA graph unless cuda_graphs is False: "nearly free" must compare GPU work, not launch
overhead. Everything else returns rows; nothing prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from benchbatch import accounting, backend, timing
from benchbatch.engines.model import Transformer
from benchbatch.telemetry import Slowdown
from benchbatch.timing import Measurement, TimingOptions, measure

DEFAULT_THRESHOLD = 0.10  # a step within 10% of the decode-only step counts as "nearly free"
PAPER_PREFILL_PER_DECODE_TOKEN = 128  # Sarathi-Serve: linear layers, one decode ~ 128 prefill


class Watch(Protocol):
    """A telemetry.ThrottleWatch: did the GPU slow its clocks since the last look? (Its
    look() tells power capping apart; a watch with throttled() alone is taken as is.)"""

    def throttled(self) -> bool: ...


def _slowed(watch: Watch | None) -> Slowdown:
    """One look after each measurement: was that measurement throttled or power-capped?"""
    if watch is None:
        return Slowdown()
    look = getattr(watch, "look", None)
    return look() if look is not None else Slowdown(throttled=bool(watch.throttled()))


def _slowdown(value: Slowdown | bool) -> Slowdown:
    return value if isinstance(value, Slowdown) else Slowdown(throttled=bool(value))


def _flags(*looks: Slowdown | bool) -> dict:
    """A row's flags: slowed if any step its numbers come from was."""
    s = Slowdown()
    for look in looks:
        s = s | _slowdown(look)
    return {"throttled": s.throttled, "power_capped": s.power_capped}


@dataclass(frozen=True)
class MixedStep:
    """One forward: `decode_batch` sequences holding `context` tokens decode one token each,
    and one prompt's chunk of `prefill_tokens` tokens, `prefill_start` of them already
    cached (0: a fresh prompt), rides along. decode_batch 0 is a prefill-only step,
    prefill_tokens 0 a decode-only one."""

    decode_batch: int
    context: int
    prefill_tokens: int = 0
    prefill_start: int = 0

    def __post_init__(self) -> None:
        assert self.decode_batch >= 0 and self.prefill_tokens >= 0 and self.prefill_start >= 0
        assert self.decode_batch or self.prefill_tokens, "an empty step"

    @property
    def kind(self) -> str:
        if not self.prefill_tokens:
            return "decode"
        return "mixed" if self.decode_batch else "prefill"

    @property
    def context_tokens(self) -> int:
        """KV entries read, counted as a scheduler StepPlan counts them."""
        chunk = self.prefill_start if self.prefill_tokens else 0
        return self.decode_batch * self.context + chunk

    @property
    def features(self) -> tuple[int, int, int]:
        """(decode tokens, prefill tokens, context tokens): the step-cost model's inputs."""
        return self.decode_batch, self.prefill_tokens, self.context_tokens

    @property
    def label(self) -> str:
        parts = []
        if self.decode_batch:
            parts.append(f"decode b={self.decode_batch} ctx={self.context}")
        if self.prefill_tokens:
            at = f" at {self.prefill_start}" if self.prefill_start else ""
            parts.append(f"chunk {self.prefill_tokens}{at}")
        return " + ".join(parts)


def time_mixed(
    model: Transformer,
    step: MixedStep,
    opts: TimingOptions,
    cuda_graphs: bool = True,
    seed: int = 0,
) -> Measurement:
    """Median-of-repeats time of one mixed step (one model.mixed_step, as the engine runs it:
    the prefill chunk's part first, then the decode batch). On CUDA the step can be replayed
    from a CUDA graph (shapes are static: every kv_len is given)."""
    dev = model.embed.weight.device
    timing.prepare(dev, opts)
    gen = torch.Generator(device=dev).manual_seed(seed)
    b, p, start = step.decode_batch, step.prefill_tokens, step.prefill_start
    cache = model.new_cache(b + (1 if p else 0), max(step.context + 1, start + p))
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    parts = []
    if p:
        chunk = torch.randint(0, model.cfg.vocab, (1, p), device=dev, generator=gen)
        parts.append((chunk, slice(b, b + 1), start + p))
    if b:
        tokens = torch.randint(0, model.cfg.vocab, (b, 1), device=dev, generator=gen)
        parts.append((tokens, slice(0, b), step.context + 1))

    @torch.inference_mode()
    def run() -> None:
        cache.lengths[:b].fill_(step.context)
        cache.lengths[b:].fill_(start)
        model.mixed_step(cache, parts)

    return _measure(run, dev, opts, cuda_graphs)


def time_chunked_prefill(
    model: Transformer,
    prompt: int,
    chunk: int,
    opts: TimingOptions,
    seed: int = 0,
    cuda_graphs: bool = True,
) -> Measurement:
    """Time to prefill one `prompt`-token prompt as consecutive steps of `chunk` tokens (the
    last may be shorter), each attending to the earlier chunks through the KV cache. On
    CUDA the whole loop is one graph: the chunks' launches would otherwise be timed too."""
    dev = model.embed.weight.device
    timing.prepare(dev, opts)
    gen = torch.Generator(device=dev).manual_seed(seed)
    cache = model.new_cache(1, prompt)
    tokens = torch.randint(0, model.cfg.vocab, (1, prompt), device=dev, generator=gen)
    bounds = [(s, min(s + chunk, prompt)) for s in range(0, prompt, chunk)]

    @torch.inference_mode()
    def run() -> None:
        cache.lengths.zero_()
        for s, e in bounds:
            model.step(tokens[:, s:e], cache, slice(0, 1), kv_len=e)

    return _measure(run, dev, opts, cuda_graphs)


def _measure(run, dev: torch.device, opts: TimingOptions, cuda_graphs: bool) -> Measurement:
    b = backend.of(dev)
    return measure(b.capture(run) if cuda_graphs and b.graphs else run, dev, opts)


# --- the piggyback curve ---------------------------------------------------------------------


def piggyback_plan(batch: int, context: int, prefill: Sequence[int]) -> list[MixedStep]:
    """A decode batch with 0, P1, P2, ... prefill tokens riding along, then each P alone."""
    with_decodes = [MixedStep(batch, context, p) for p in sorted({0, *prefill})]
    alone = [MixedStep(0, 0, p) for p in sorted(set(prefill)) if p]
    return with_decodes + alone


def run_piggyback(
    model: Transformer,
    plan: Sequence[MixedStep],
    opts: TimingOptions,
    cuda_graphs: bool = True,
    on_row: Callable[[], None] | None = None,
    watch: Watch | None = None,
) -> list[dict]:
    """Time every step of the plan; rows of the mixed steps (and the decode-only one)."""
    times, slowed = {}, {}
    for step in plan:
        times[step] = time_mixed(model, step, opts, cuda_graphs)
        slowed[step] = _slowed(watch)
        if on_row is not None:
            on_row()
    return piggyback_rows(times, slowed)


def piggyback_rows(
    times: dict[MixedStep, Measurement],
    slowed: dict[MixedStep, Slowdown | bool] | None = None,
) -> list[dict]:
    """piggyback.csv: per prefill size P, the mixed step against the decode-only step and
    against running the decode step and the prefill alone, one after the other. A row is
    throttled (power-capped) when any step its numbers come from was timed while the GPU
    slowed down (capped its power)."""
    slowed = slowed or {}
    decode_steps = [s for s in times if s.decode_batch]
    base = next(s for s in decode_steps if s.prefill_tokens == 0)
    base_ms = times[base].median_ms
    alone = {s.prefill_tokens: times[s].median_ms for s in times if not s.decode_batch}
    alone_slowed = {s.prefill_tokens: slowed.get(s, False) for s in times if not s.decode_batch}
    rows = []
    for step in sorted(decode_steps, key=lambda s: s.prefill_tokens):
        m, p = times[step], step.prefill_tokens
        separate = base_ms + alone[p] if p else base_ms
        flags = _flags(slowed.get(step, False), slowed.get(base, False), alone_slowed.get(p, False))
        rows.append(
            {
                "decode_batch": step.decode_batch,
                "context": step.context,
                "prefill_tokens": p,
                "prefill_per_decode_token": p / step.decode_batch,
                "step_ms": m.median_ms,
                "decode_only_ms": base_ms,
                "over_decode": m.median_ms / base_ms,
                "extra_ms": m.median_ms - base_ms,
                "extra_us_per_prefill_token": 1e3 * (m.median_ms - base_ms) / p if p else math.nan,
                "prefill_alone_ms": alone.get(p, 0.0),
                "separate_ms": separate,
                "saved_ms": separate - m.median_ms,
                **_timing(m),
                **flags,
            }
        )
    return rows


def free_prefill_tokens(rows: Sequence[dict], threshold: float) -> int:
    """The largest P whose mixed step, and every smaller one's, stays within `threshold`
    (0.1: 10%) of the decode-only step: the prefill tokens that ride nearly free."""
    free = 0
    for r in sorted(rows, key=lambda r: r["prefill_tokens"]):
        if r["over_decode"] > 1 + threshold:
            break
        free = r["prefill_tokens"]
    return free


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


def run_chunks(
    model: Transformer,
    dtype: str,
    prompt: int,
    chunks: Sequence[int],
    opts: TimingOptions,
    on_row: Callable[[], None] | None = None,
    watch: Watch | None = None,
    cuda_graphs: bool = True,
) -> list[dict]:
    """chunks.csv's 'chunked' rows: the prompt prefilled in chunks of C, against one prefill
    (C >= prompt is the one-prefill row, always measured)."""
    sizes = sorted({min(c, prompt) for c in chunks} | {prompt})
    times, slowed = {}, {}
    for c in sizes:
        times[c] = time_chunked_prefill(model, prompt, c, opts, cuda_graphs=cuda_graphs)
        slowed[c] = _slowed(watch)
        if on_row is not None:
            on_row()
    whole_ms = times[prompt].median_ms
    return [
        {
            **_chunk_row(model, dtype, prompt, c, times[c], whole_ms),
            **_flags(slowed[c], slowed[prompt]),  # the row is a ratio to one prefill
        }
        for c in sizes
    ]


def _chunk_row(model, dtype: str, prompt: int, chunk: int, m: Measurement, whole_ms: float):
    starts = range(0, prompt, chunk)
    costs = [accounting.step_cost(model.cfg, dtype, 1, min(chunk, prompt - s), s) for s in starts]
    return {
        "kind": "chunked",
        "prompt_tokens": prompt,
        "chunk_tokens": chunk,
        "chunks": len(costs),
        "total_ms": m.median_ms,
        "ms_per_token": m.median_ms / prompt,
        "over_one_prefill": m.median_ms / whole_ms,
        "extra_pct": 100 * (m.median_ms / whole_ms - 1),
        # What the extra time pays for: the weights read once per chunk, and every chunk's
        # attention re-reading the keys and values of the chunks before it.
        "weight_bytes": sum(c.weight_bytes for c in costs),
        "kv_read_bytes": sum(c.kv_read_bytes for c in costs),
        **_timing(m),
    }


def run_tiles(
    model: Transformer,
    tiles: Sequence[int],
    opts: TimingOptions,
    on_row: Callable[[], None] | None = None,
    watch: Watch | None = None,
    cuda_graphs: bool = True,
) -> list[dict]:
    """chunks.csv's 'tile' rows: one prefill step of each length (e.g. 256 against 257): a
    length just past a multiple of the kernels' tile pays for a mostly empty extra tile."""
    rows, previous, previous_slowed = [], None, Slowdown()
    for t in sorted(set(tiles)):
        m = time_mixed(model, MixedStep(0, 0, t), opts, cuda_graphs)
        slowed = _slowed(watch)
        if on_row is not None:
            on_row()
        rows.append(
            {
                "kind": "tile",
                "prompt_tokens": t,
                "chunk_tokens": t,
                "chunks": 1,
                "total_ms": m.median_ms,
                "ms_per_token": m.median_ms / t,
                "over_previous": m.median_ms / previous if previous else math.nan,
                **_timing(m),
                **_flags(slowed, previous_slowed),  # the row is a ratio to the previous
            }
        )
        previous, previous_slowed = m.median_ms, slowed
    return rows


def _timing(m: Measurement) -> dict:
    s = m.summary()
    return {
        "step_ms_min": s["step_ms_min"],
        "step_ms_iqr": s["step_ms_iqr"],
        "cv": s["cv"],
        "repeats": s["repeats"],
        "noisy": s["noisy"],
        "host_ms": s["host_ms"],
        "launch_bound": s["launch_bound"],
    }
