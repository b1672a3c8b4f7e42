"""Serving metrics as the serving benchmarks define them (vLLM's bench serve, GuideLLM,
AIPerf, MLPerf's server scenario); pure Python and numpy, no torch.

Per request, times in seconds from its arrival:
- TTFT: arrival to first output token;
- TPOT: (E2E - TTFT) / (output tokens - 1): the mean gap after the first token, one number
  per request (requests with a single token have none);
- ITL: every gap between two consecutive tokens of a request, pooled over all requests (a
  request with uneven gaps has the TPOT of an even one but a longer ITL tail);
- E2E: arrival to last token.
Per run: mean, p50, p90 and p99 of each; the run's duration (first arrival to last token);
request and output-token throughput over it; goodput, the requests per second meeting every
limit of an SLO (TTFT and TPOT; a single-token request's TPOT counts as 0, as in vLLM).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from benchbatch.core.metrics import (
    RequestMetrics,
    RunMetrics,
    counts_percentile,
    percentile,
)

PERCENTILES = (50, 90, 99)
P99_MIN_REQUESTS = 100  # below this a p99 is the largest value or near it: say so


def tpot(m: RequestMetrics) -> float | None:
    """Time per output token after the first; None for a request with one token."""
    if m.num_tokens < 2:
        return None
    return (m.e2e - m.ttft) / (m.num_tokens - 1)


@dataclass(frozen=True)
class ServingSLO:
    """Per-request latency limits (seconds): time to first token and time per output token."""

    ttft_s: float
    tpot_s: float

    def met(self, m: RequestMetrics) -> bool:
        """Both limits held (inclusive); a single-token request has TPOT 0 (vLLM's rule)."""
        return bool(m.ttft <= self.ttft_s and (tpot(m) or 0.0) <= self.tpot_s)  # numpy times too

    def within(self, row: Mapping) -> bool:
        """A point meets the SLO: p99 TTFT and p99 TPOT within the limits (MLPerf's server
        scenario judges p99s)."""
        return row["ttft_p99_s"] <= self.ttft_s and _le(row["tpot_p99_s"], self.tpot_s)


def _le(value: float, limit: float) -> bool:
    return math.isnan(value) or value <= limit  # no TPOT at all: nothing breaks the limit


def stats(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p99 (nan when empty)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return {"mean": math.nan, **{f"p{q}": math.nan for q in PERCENTILES}}
    return {"mean": float(array.mean()), **{f"p{q}": percentile(array, q) for q in PERCENTILES}}


def counts_stats(counts: Mapping[float, int]) -> dict[str, float]:
    """stats() of a multiset {value: count} (the pooled gaps), without expanding it."""
    total = sum(counts.values())
    if total == 0:
        return {"mean": math.nan, **{f"p{q}": math.nan for q in PERCENTILES}}
    mean = sum(v * c for v, c in counts.items()) / total
    return {"mean": mean, **{f"p{q}": counts_percentile(counts, q) for q in PERCENTILES}}


def latency_columns(run: RunMetrics) -> dict[str, float]:
    """ttft_*, tpot_*, itl_*, e2e_* (mean, p50, p90, p99), in the run's unit."""
    ms = run.requests
    tpots = [t for t in (tpot(m) for m in ms) if t is not None]
    out = {}
    for name, s in (
        ("ttft", stats([m.ttft for m in ms])),
        ("tpot", stats(tpots)),
        ("itl", counts_stats(run.tbt_counts)),
        ("e2e", stats([m.e2e for m in ms])),
    ):
        out |= {f"{name}_{k}_s": v for k, v in s.items()}
    return out


def throughput_columns(
    run: RunMetrics, prompt_tokens: Mapping[int, int], slo: ServingSLO | None,
    duration: float | None = None,
) -> dict[str, float]:
    """Duration (first arrival to last token), request, output-token and total-token
    throughput over it, the mean number of requests in the system (Little's law: the sum
    of E2E over the duration), tokens/s per user (output throughput over that measured
    concurrency; vLLM's sweep plots its Pareto axis over the concurrency it was given), and
    with an SLO the requests meeting it and the goodput. prompt_tokens: each served
    request's prompt length, as the total-token throughput counts it. duration: the span the
    rates are over where the served requests' is not the point's (a measured server's point
    with failures: core/streamed.span_s)."""
    ms = run.requests
    duration = duration_s(ms) if duration is None else duration
    output = sum(m.num_tokens for m in ms)
    prompt = sum(prompt_tokens[m.request_id] for m in ms)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    concurrency = per_s(sum(m.e2e for m in ms))
    out = {
        "requests": len(ms),
        "output_tokens": output,
        "duration_s": duration,
        "request_throughput_rps": per_s(len(ms)),
        "output_throughput_tps": per_s(output),
        "total_token_throughput_tps": per_s(output + prompt),
        "mean_concurrency": concurrency,
        "tokens_per_s_per_user": per_s(output) / concurrency if concurrency else math.nan,
        "p99_uncertain": len(ms) < P99_MIN_REQUESTS,
    }
    if slo is not None:
        good = goodput_count(ms, slo)
        out |= {"slo_met": good, "slo_met_fraction": good / len(ms) if ms else math.nan,
                "goodput_rps": per_s(good)}  # fmt: skip
    return out


def duration_s(ms: Sequence[RequestMetrics]) -> float:
    if not ms:
        return 0.0
    return max(m.finish for m in ms) - min(m.arrival for m in ms)


def goodput_count(ms: Iterable[RequestMetrics], slo: ServingSLO) -> int:
    return int(sum(slo.met(m) for m in ms))


# --- building the metrics of a run whose arrivals are in seconds ------------------------------


def timed_run_metrics(
    token_steps: Mapping[int, Sequence[int]],
    step_end_times: Sequence[float],
    arrival_s: Mapping[int, float],
) -> RunMetrics:
    """RunMetrics in seconds: request r arrived at arrival_s[r] and got token k at the end
    of step token_steps[r][k]. (TokenRecorder.metrics places arrivals at the start of a
    step; with arrivals in seconds the arrival is the request's own time, which may fall in
    an idle wait or inside the step before the one that admits it.)"""
    run = RunMetrics([], Counter(), "s")
    for rid, steps in token_steps.items():
        if not steps:
            continue
        times = [step_end_times[s] for s in steps]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        run.tbt_counts.update(gaps)
        own = Counter(gaps)
        run.requests.append(
            RequestMetrics(
                request_id=rid,
                arrival=arrival_s[rid],
                first_token=times[0],
                finish=times[-1],
                num_tokens=len(times),
                tbt_p50=counts_percentile(own, 50) if gaps else 0.0,
                tbt_p99=counts_percentile(own, 99) if gaps else 0.0,
                tbt_max=max(gaps, default=0.0),
            )
        )
    return run


# --- what the scheduler did: slots and batches ------------------------------------------------


def scheduler_columns(
    step_starts: Sequence[float],
    step_ends: Sequence[float],
    active: Sequence[int],
    slots: int,
    duration: float,
) -> dict[str, float]:
    """steps; mean_batch, the sequences a step computed on average (decoding or
    prefilling); busy_fraction, the share of the run's duration spent in steps (the rest
    waited for arrivals); slot_occupancy, the time-weighted share of slots doing useful work
    over the whole duration (idle waits count as empty slots). Near the knee the occupancy
    approaches 1 and the queue, not the steps, makes TTFT."""
    starts = np.asarray(step_starts, dtype=np.float64)
    lengths = np.asarray(step_ends, dtype=np.float64) - starts
    active = np.asarray(active, dtype=np.float64)
    busy = float(lengths.sum())
    return {
        "steps": int(active.size),
        "mean_batch": float(active.mean()) if active.size else math.nan,
        "busy_fraction": busy / duration if duration > 0 else math.nan,
        "slot_occupancy": float((active * lengths).sum()) / (slots * duration)
        if duration > 0
        else math.nan,
    }


# --- a concurrency sweep (serve-sweep --max-concurrency 1,4,16) ---------------------------------


def cap_label(cap: int | None) -> str:
    """A point's client cap (--max-concurrency) as its label says it: '' without one."""
    return "" if cap is None else f", {cap} in flight"


def concurrency_sweep(rows: Sequence[Mapping]) -> bool:
    """The rows are a concurrency sweep's: points at more than one client cap (a row without
    one: None, or NaN as read back from a CSV)."""
    caps = {r.get("max_concurrency") for r in rows}
    return len({int(c) for c in caps if isinstance(c, int | float) and c == c}) > 1
