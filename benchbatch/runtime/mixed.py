"""Mixed steps, timed alone: decodes with a prompt's chunk riding along (one model.mixed_step,
as the engine runs it), a prompt prefilled in chunks, and the steps a step-cost model is
fitted to (benchbatch/core/stepcost.py fits them). The piggyback experiment, the ablation
and the serving curve time their steps here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from benchbatch.core.workload import Request
from benchbatch.runtime import backend, timing
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import Measurement, TimingOptions, measure


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
    return measure(prepare_mixed(model, step, opts, cuda_graphs, seed), dev, opts)


def prepare_mixed(
    model: Transformer,
    step: MixedStep,
    opts: TimingOptions,
    cuda_graphs: bool = True,
    seed: int = 0,
):
    """The call that runs one mixed step on its own KV cache (random values), its cache
    lengths reset inside the call; a CUDA graph replay when asked."""
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

    return graphed(run, dev, cuda_graphs)


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
    return measure(prepare_chunked(model, prompt, chunk, opts, seed, cuda_graphs), dev, opts)


def prepare_chunked(
    model: Transformer,
    prompt: int,
    chunk: int,
    opts: TimingOptions,
    seed: int = 0,
    cuda_graphs: bool = True,
):
    """The call that prefills one prompt in chunks on its own cache (see time_chunked_prefill)."""
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

    return graphed(run, dev, cuda_graphs)


def graphed(run, dev: torch.device, cuda_graphs: bool):
    b = backend.of(dev)
    return b.capture(run) if cuda_graphs and b.graphs else run


def fit_points(b, requests: Sequence[Request], max_context: int) -> list[MixedStep]:
    """Steps to time for the fit (b: the budgets, max_num_seqs, chunk_size and
    max_num_batched_tokens), at the workload's operating points: decode batches, the
    prompts and chunks alone, a chunk late in a long prompt (KV re-read), and the mixed
    steps each scheme runs (decodes + a chunk, decodes + a whole long prompt)."""
    seqs, chunk, budget = b.max_num_seqs, b.chunk_size, b.max_num_batched_tokens
    prompts = sorted(r.prompt_tokens for r in requests)
    outputs = sorted(r.output_tokens for r in requests)
    short, longest = prompts[len(prompts) // 2], prompts[-1]
    ctx = min(short + outputs[len(outputs) // 2], max_context - 1)
    ctx_long = min(longest + outputs[len(outputs) // 2], max_context - 1)
    late = max(0, min(longest, max_context) - chunk)
    points = [
        *(MixedStep(n, ctx) for n in sorted({1, max(1, seqs // 2), seqs})),
        MixedStep(seqs, ctx_long),
        *(MixedStep(0, 0, p) for p in sorted({short, chunk, budget, longest})),
        MixedStep(0, 0, chunk, late),
        MixedStep(seqs, ctx, chunk),
        MixedStep(seqs, ctx, max(1, budget - seqs)),
        MixedStep(max(1, seqs - 1), ctx, short),
        MixedStep(max(1, seqs - 1), ctx, longest),
    ]
    fits = [p for p in points if p.prefill_start + p.prefill_tokens <= max_context]
    return list(dict.fromkeys(fits))


def cost_rows(model, points: Sequence[MixedStep], opts: TimingOptions) -> Iterator[dict]:
    """step_cost.csv's rows: every fit point timed through the shared harness, yielded as
    it is measured; eagerly, since the fit predicts the real engine, which runs eagerly."""
    for p in points:
        m = time_mixed(model, p, opts, cuda_graphs=False)  # the fit predicts the eager engine
        d, n, c = p.features
        yield (
            {
                "source": "measured",
                "label": p.label,
                "kind": p.kind,
                "decode_tokens": d,
                "prefill_tokens": n,
                "context_tokens": c,
                "step_ms": m.median_ms,
                "step_ms_min": m.min_ms,
                "cv": m.cv,
                "repeats": m.repeats,
                "noisy": m.noisy,
            }
        )
