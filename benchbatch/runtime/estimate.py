"""How long a run of timed steps will take, from two small steps timed first.

A decode step of one sequence is mostly its bytes (every weight read for one token), a
short prefill mostly its FLOPs; timing one of each gives what a FLOP and a byte cost on
this device for this model, and every planned step is priced from its own FLOPs and bytes.
A short prefill runs fewer FLOP/s than a long one, so the estimate errs long. A step is
then called as timing.py calls it: the warm-up, and repeats until --min-time (at least
--repeats).

`shorter` says which of the command's own lists to cut for a run that fits a limit: the
costliest values go first, keeping what the command's claims need (two decode batches to
compare, one prefill, one context).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from benchbatch.core import accounting
from benchbatch.runtime import steps
from benchbatch.runtime.timing import MAX_WARMUP_CALLS, TimingOptions, repeat_count

PREFILL_TOKENS = 32  # long enough to be mostly FLOPs, short enough to time in seconds


@dataclass(frozen=True)
class Rates:
    """This device's cost of a FLOP and of a byte for this model, from two small steps:
    a step is priced at flops x s_per_flop + bytes x s_per_byte, which gives both timed
    steps their measured time."""

    s_per_flop: float
    s_per_byte: float
    decode_ms: float  # the decode step of one sequence they came from
    prefill_ms: float  # and the PREFILL_TOKENS-token prefill
    prefill_tokens: int
    context: int

    def step_s(self, cfg, dtype: str, step: steps.Step) -> float:
        cost = accounting.step_cost(cfg, dtype, step.batch, step.tokens, step.context)
        return cost.flops * self.s_per_flop + cost.bytes * self.s_per_byte


def solve(decode: tuple[int, int, float], prefill: tuple[int, int, float]) -> tuple[float, float]:
    """(s per FLOP, s per byte) from two steps' (FLOPs, bytes, seconds). When noise makes
    either cost negative (or the steps too alike to tell apart), each step's time is put
    on what bounds it: the decode's on its bytes, the prefill's on its FLOPs."""
    (f1, b1, t1), (f2, b2, t2) = decode, prefill
    det = f1 * b2 - f2 * b1
    if det:
        per_flop, per_byte = (t1 * b2 - t2 * b1) / det, (f1 * t2 - f2 * t1) / det
        if per_flop > 0 and per_byte > 0:
            return per_flop, per_byte
    return t2 / f2, t1 / b1


def measure_rates(model, dtype: str, context: int) -> Rates:
    """Time one decode step (one sequence at `context`) and one short prefill, eager, two
    calls each (the first warms up): seconds, even for a large model on a CPU."""
    cfg = model.cfg
    prompt = max(1, min(PREFILL_TOKENS, cfg.max_context))
    context = min(context, cfg.max_context - 1)
    quick = TimingOptions(min_repeats=1, min_time_s=0.0, warmup=1, warmup_s=0.0, l2_flush=False)
    decode, prefill = steps.decode(1, context), steps.prefill(1, prompt)
    d_s = steps.time_step(model, decode, quick, cuda_graphs=False).min_ms / 1e3
    p_s = steps.time_step(model, prefill, quick, cuda_graphs=False).min_ms / 1e3
    d = accounting.step_cost(cfg, dtype, 1, 1, context)
    p = accounting.step_cost(cfg, dtype, 1, prompt, 0)
    per_flop, per_byte = solve((d.flops, d.bytes, d_s), (p.flops, p.bytes, p_s))
    return Rates(per_flop, per_byte, d_s * 1e3, p_s * 1e3, prompt, context)


def call_s(step_s: float, opts: TimingOptions) -> float:
    """Seconds timing.py spends on one step of step_s: its warm-up calls and its repeats
    (a noisy step measured again doubles them; not counted)."""
    warm = min(MAX_WARMUP_CALLS, max(1, opts.warmup, math.ceil(opts.warmup_s / step_s)))
    return (warm + repeat_count([step_s * 1e3], opts)) * step_s


def run_s(plan: list[steps.Step], price: Callable[[steps.Step], float], opts) -> float:
    return sum(call_s(price(s), opts) for s in plan)


@dataclass(frozen=True)
class Cut:
    """A shorter run: the lists to pass instead (option field -> values) and its estimate."""

    lists: dict[str, tuple[int, ...]]
    seconds: float


def shorter(
    lists: dict[str, tuple[int, ...]],
    keep: dict[str, int],
    seconds: Callable[[dict[str, tuple[int, ...]]], float],
    limit_s: float,
) -> Cut | None:
    """Drop, one at a time, the value whose going saves the most time, until the run fits
    `limit_s` or nothing more may go (each list keeps at least keep[field] values). None
    when nothing can be cut; the last cut otherwise, even if still over the limit."""
    current, cut = dict(lists), None
    while seconds(current) > limit_s:
        options = [
            {**current, name: tuple(v for v in values if v != drop)}
            for name, values in current.items()
            if len(values) > keep.get(name, 1)
            for drop in values
        ]
        if not options:
            break
        current = min(options, key=seconds)
        cut = Cut(current, seconds(current))
    return cut


def fewest_layers(cfg, seconds: Callable[[object], float], limit_s: float) -> int | None:
    """The most layers under cfg's that bring the run within limit_s (run time grows with
    the layers), else two (one for a two-layer model): a shorter run of the same widths.
    None for a one-layer model."""
    if cfg.layers <= 1:
        return None
    for n in range(cfg.layers - 1, 0, -1):
        if seconds(cfg.replace(layers=n)) <= limit_s:
            return n
    return max(1, min(2, cfg.layers - 1))


def smaller_models(cfg, seconds: Callable[[object], float], limit_s: float, small=None):
    """Shorter runs with a smaller model, each as (flags, estimated seconds): fewer layers
    (fewest_layers), and `small` (a preset's config, e.g. cpu-small on a CPU) when it is
    smaller than cfg. Priced with the same per-FLOP and per-byte rates as the run."""
    out = []
    n = fewest_layers(cfg, seconds, limit_s)
    if n is not None:
        out.append((f"--layers {n}", seconds(cfg.replace(layers=n))))
    if small is not None:
        out.append((f"--preset {small.name}", seconds(small)))
    return out
