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
from functools import cached_property
from itertools import pairwise

import numpy as np


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
        return _summary([m.ttft for m in self.requests], [m.e2e for m in self.requests], self)


def _summary(ttft, e2e, run: RunMetrics) -> dict[str, float]:
    return {
        **{f"ttft_{k}": v for k, v in summarize(ttft).items()},
        **{f"e2e_{k}": v for k, v in summarize(e2e).items()},
        "tbt_p50": counts_percentile(run.tbt_counts, 50),
        "tbt_p99": counts_percentile(run.tbt_counts, 99),
        "tbt_max": max(run.tbt_counts, default=math.nan),  # no gap at all: none (not 0)
    }


@dataclass(frozen=True, eq=False)
class RequestColumns:
    """RequestMetrics of many requests as arrays, one entry per request (same fields).

    The simulator's fast path fills these in closed form; in steps they are integers.
    """

    request_id: np.ndarray
    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    num_tokens: np.ndarray
    tbt_p50: np.ndarray
    tbt_p99: np.ndarray
    tbt_max: np.ndarray

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> np.ndarray:
        return self.finish - self.arrival

    def __len__(self) -> int:
        return len(self.request_id)

    def to_list(self) -> list[RequestMetrics]:
        """The same metrics as RequestMetrics objects (times as floats, as the scheduler's)."""
        times = (self.arrival, self.first_token, self.finish)
        tbts = (self.tbt_p50, self.tbt_p99, self.tbt_max)
        columns = (
            self.request_id.tolist(),
            *(c.astype(np.float64).tolist() for c in times),
            self.num_tokens.tolist(),
            *(c.astype(np.float64).tolist() for c in tbts),
        )
        return [RequestMetrics(*values) for values in zip(*columns, strict=True)]

    def equals(self, other: RequestColumns) -> bool:
        return all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in self.__dataclass_fields__
        )


class ColumnarRunMetrics(RunMetrics):
    """RunMetrics kept as columns: `requests` (a list of RequestMetrics) is built only when
    read, so a million-request simulation holds a few arrays, not a million objects."""

    def __init__(self, columns: RequestColumns, tbt_counts: Counter[float], unit: str = "steps"):
        self.columns = columns
        self.tbt_counts = tbt_counts
        self.unit = unit

    @cached_property
    def requests(self) -> list[RequestMetrics]:  # type: ignore[override]
        return self.columns.to_list()

    def summary(self) -> dict[str, float]:
        return _summary(self.columns.ttft, self.columns.e2e, self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunMetrics):
            return NotImplemented
        if (self.tbt_counts, self.unit) != (other.tbt_counts, other.unit):
            return False
        if isinstance(other, ColumnarRunMetrics):
            return self.columns.equals(other.columns)
        return self.requests == other.requests

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ColumnarRunMetrics({len(self.columns)} requests, unit={self.unit!r})"


# --- percentiles ----------------------------------------------------------------------------


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty.

    The rank arithmetic is counts_percentile()'s, so both give the same float bit for bit
    (np.percentile computes the interpolation differently and can differ in the last bit).
    """
    values = _as_array(values)
    if values.size == 0:
        return math.nan
    rank = q / 100 * (values.size - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    ordered = np.partition(values, (lo, hi))
    return _interpolate(ordered[lo], ordered[hi], rank - lo)


def _interpolate(lo_value, hi_value, fraction: float) -> float:
    return float(lo_value + (hi_value - lo_value) * fraction)


def _as_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.ravel()
    return np.asarray(values if isinstance(values, list) else list(values), dtype=np.float64)


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


def summarize(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """mean, p50 and p99 of a list or an array (nan when empty)."""
    if not isinstance(values, np.ndarray | list):
        values = list(values)
    array = _as_array(values)
    if array.size == 0:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan}
    mean = _sum(values, array) / array.size
    return {"mean": mean, "p50": percentile(array, 50), "p99": percentile(array, 99)}


def _sum(values: Sequence[float] | np.ndarray, array: np.ndarray) -> float:
    """sum(values) as Python adds them, left to right. An integer array's sum is exact in
    any order, so numpy's is the same number; floats are added as Python would."""
    if array.dtype.kind in "iu":
        return int(array.sum(dtype=np.int64))
    return sum(values.tolist() if isinstance(values, np.ndarray) else values)


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
