"""Per-request latency metrics: time to first token, time between tokens, end-to-end.

The scheduler records at which step each request got each token (TokenRecorder); the
simulator and the real engine then turn steps into seconds with a list of step end
times. Without that list, times are in steps: step s ends at time s + 1, and a request
arriving at step a arrives at time a (the start of that step).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass(slots=True)  # not frozen: a million of these are built per run, frozen is 2x slower
class RequestMetrics:
    """Latencies of one request; tbt_* are 0 for a request with a single token."""

    request_id: int
    arrival: float
    first_token: float
    finish: float
    num_tokens: int
    tbt_p50: float
    tbt_p99: float
    tbt_max: float

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival


@dataclass
class RunMetrics:
    """All requests of a run. TBTs are pooled over every token gap of every request, as a
    histogram (gap -> count), so a million-request run does not keep 100M floats."""

    requests: list[RequestMetrics]
    tbt_counts: Counter[float]
    unit: str = "steps"

    def summary(self) -> dict[str, float]:
        ttft = [m.ttft for m in self.requests]
        e2e = [m.e2e for m in self.requests]
        return {
            **{f"ttft_{k}": v for k, v in summarize(ttft).items()},
            **{f"e2e_{k}": v for k, v in summarize(e2e).items()},
            "tbt_p50": counts_percentile(self.tbt_counts, 50),
            "tbt_p99": counts_percentile(self.tbt_counts, 99),
            "tbt_max": max(self.tbt_counts, default=0.0),
        }


# --- percentiles ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    return counts_percentile(Counter(values), q)


def counts_percentile(counts: Mapping[float, int], q: float) -> float:
    """percentile() of the multiset {value: count}, without expanding it."""
    total = sum(counts.values())
    if total == 0:
        return math.nan
    rank = q / 100 * (total - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    lo_value = hi_value = math.nan
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if math.isnan(lo_value) and seen > lo:
            lo_value = value
        if seen > hi:
            hi_value = value
            break
    return lo_value + (hi_value - lo_value) * (rank - lo)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """mean, p50 and p99 of a list (nan when empty)."""
    mean = sum(values) / len(values) if values else math.nan
    counts = Counter(values)
    p50, p99 = counts_percentile(counts, 50), counts_percentile(counts, 99)
    return {"mean": mean, "p50": p50, "p99": p99}


# --- recording tokens -----------------------------------------------------------------------


@dataclass
class TokenRecorder:
    """The step of every token each request produced, in order."""

    arrival_steps: dict[int, int] = field(default_factory=dict)
    token_steps: dict[int, list[int]] = field(default_factory=dict)

    def add(self, request_id: int, arrival_step: int) -> None:
        self.arrival_steps[request_id] = arrival_step
        self.token_steps[request_id] = []

    def record(self, request_id: int, step: int) -> None:
        self.token_steps[request_id].append(step)

    def metrics(self, step_end_times: Sequence[float] | None = None) -> RunMetrics:
        """Metrics of every request that produced at least one token."""
        clock = StepClock(step_end_times)
        run = RunMetrics([], Counter(), clock.unit)
        for rid, steps in self.token_steps.items():
            if steps:
                add_request(run, rid, self.arrival_steps[rid], steps, clock)
        return run


@dataclass(frozen=True)
class StepClock:
    """Converts step indices to times: step ends given, or one unit per step."""

    step_end_times: Sequence[float] | None = None

    @property
    def unit(self) -> str:
        return "steps" if self.step_end_times is None else "s"

    def end(self, step: int) -> float:
        return float(step + 1) if self.step_end_times is None else self.step_end_times[step]

    def start(self, step: int) -> float:
        return 0.0 if step == 0 else self.end(step - 1)


def add_request(
    run: RunMetrics,
    request_id: int,
    arrival_step: int,
    token_steps: Iterable[int],
    clock: StepClock,
) -> None:
    """Append one request's metrics to run and pool its token gaps."""
    times = [clock.end(s) for s in token_steps]
    gaps = [b - a for a, b in pairwise(times)]
    run.tbt_counts.update(gaps)
    counts = Counter(gaps)
    run.requests.append(
        RequestMetrics(
            request_id=request_id,
            arrival=clock.start(arrival_step),
            first_token=times[0],
            finish=times[-1],
            num_tokens=len(times),
            tbt_p50=counts_percentile(counts, 50) if gaps else 0.0,
            tbt_p99=counts_percentile(counts, 99) if gaps else 0.0,
            tbt_max=max(gaps, default=0.0),
        )
    )
