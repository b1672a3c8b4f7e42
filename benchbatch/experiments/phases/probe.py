"""Prefill against decode: the same model, one step of each, timed and accounted.

Prefill multiplies every weight by hundreds of tokens at once (compute-bound); a decode step
multiplies every weight by one token per sequence (memory-bound: the weights and the KV
cache are read for very few FLOPs). The rows show the gap in achieved TFLOP/s.
"""

from __future__ import annotations

from collections.abc import Iterator

from benchbatch.core.noise import time_ratio_range
from benchbatch.experiments.phases.options import PhasesOptions as Options
from benchbatch.runtime import steps
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.tensor_parallel import tp_of
from benchbatch.runtime.timing import TimingOptions

__all__ = ["Options", "plan", "rows", "summary"]


def plan(opts: Options, prefill_batch: int = 1) -> list[steps.Step]:
    """The steps phases measures: each prompt length, then each decode batch at each context."""
    prefills = [steps.prefill(prefill_batch, p) for p in opts.prefill]
    return prefills + [steps.decode(b, c) for c in opts.context for b in opts.decode_batch]


def rows(
    model: Transformer, dtype: str, opts: Options, timing: TimingOptions, cuda_graphs: bool = True
) -> Iterator[dict]:
    """One row per step. The steps are compared with each other (prefill against decode,
    batch against batch), so they are timed together, their repeats interleaved, as many at
    once as memory holds; a group's rows are yielded when it is measured."""
    budget = steps.group_budget(model.embed.weight.device)
    layout = {"kv_layout": opts.kv_layout, "block_size": opts.block_size}
    for group in steps.groups(plan(opts), model.cfg, dtype, budget, tp_of(model)):
        yield from steps.run_group(model, dtype, group, timing, cuda_graphs, **layout)


def summary(rows: list[dict]) -> dict:
    """The article's two claims as measured: the TFLOP/s gap and the batching factor."""
    ok = [r for r in rows if r["status"] == "ok"]
    pre = [r for r in ok if r["phase"] == "prefill"]
    dec = [r for r in ok if r["phase"] == "decode"]
    first = min((r["context"] for r in dec), default=None)  # several contexts: the first
    dec = sorted((r for r in dec if r["context"] == first), key=lambda r: r["batch"])
    out: dict = {}
    if pre and dec:
        best = max(pre, key=lambda r: r["tflops"])
        ratio = best["tflops"] / dec[0]["tflops"]  # as decode's time over prefill's
        out["prefill_over_decode_tflops"] = ratio
        low, high = time_ratio_range(ratio, dec[0], best)
        out["prefill_over_decode_tflops_low"], out["prefill_over_decode_tflops_high"] = low, high
        out["prefill_label"], out["decode_label"] = best["label"], dec[0]["label"]
    if dec:
        out["decode_context"] = first  # the decode ratios' context (the first of several)
    if len(dec) > 1:
        ratio = dec[0]["us_per_token"] / dec[-1]["us_per_token"]
        out["decode_token_cost_ratio"] = ratio
        low, high = time_ratio_range(ratio, dec[0], dec[-1])
        out["decode_token_cost_ratio_low"], out["decode_token_cost_ratio_high"] = low, high
        out["decode_batches"] = [dec[0]["batch"], dec[-1]["batch"]]
    return out
