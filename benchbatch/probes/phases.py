"""Prefill against decode: the same model, one step of each, timed and accounted.

Prefill multiplies every weight by hundreds of tokens at once (compute-bound); a decode step
multiplies every weight by one token per sequence (memory-bound: the weights and the KV
cache are read for very few FLOPs). The rows show the gap in achieved TFLOP/s.
"""

from __future__ import annotations

from collections.abc import Iterator

from benchbatch.engines.model import Transformer
from benchbatch.probes import steps
from benchbatch.timing import TimingOptions


def plan(
    prefill: list[int], decode_batch: list[int], context: int, prefill_batch: int = 1
) -> list[steps.Step]:
    """The steps phases measures: each prompt length, then each decode batch size."""
    return [steps.prefill(prefill_batch, p) for p in prefill] + [
        steps.decode(b, context) for b in decode_batch
    ]


def run(
    model: Transformer,
    dtype: str,
    plan: list[steps.Step],
    opts: TimingOptions,
    cuda_graphs: bool = True,
) -> Iterator[dict]:
    """One row per step, yielded as soon as it is measured."""
    for step in plan:
        yield steps.run_step(model, dtype, step, opts, cuda_graphs)
