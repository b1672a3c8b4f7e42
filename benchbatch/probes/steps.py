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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchbatch import accounting, backend, device, timing
from benchbatch.engines.model import Transformer
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
        cache.lengths.fill_(step.context)
        model.step(tokens, cache, slots, kv_len=kv_len)

    b = backend.of(dev)
    return measure(b.capture(run) if cuda_graphs and b.graphs else run, dev, opts)


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


def run_step(
    model: Transformer,
    dtype: str,
    step: Step,
    opts: TimingOptions,
    cuda_graphs: bool = True,
    kv_layout: str = "contiguous",
    block_size: int = 16,
) -> dict:
    """Time a step and return its row; out of memory is recorded as such, not raised."""
    dev = model.embed.weight.device
    try:
        m = time_step(model, step, opts, cuda_graphs, kv_layout=kv_layout, block_size=block_size)
        status = "ok"
    except (RuntimeError, MemoryError) as e:
        if not device.is_out_of_memory(e):
            raise
        m, status = None, "oom"
    finally:
        device.release_memory(dev)
    return {**step_row(model, dtype, step, m), "status": status, "kv_layout": kv_layout}
