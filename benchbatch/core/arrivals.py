"""Arrivals in seconds: Poisson (or gamma) processes, a trace's own times, and the feed that
hands each request to a scheduler once its arrival time has passed (no torch here).

The occupancy and ablation commands count arrivals in scheduler steps (Request.arrival_step).
A serving benchmark counts them in seconds, and then a step has a duration: a request that
arrives at t seconds is first seen by the first step that starts at or after t. The
simulator (a step-cost model gives each step its duration) and the real engine (the wall
clock does) both drive the scheduler through ArrivalFeed, so they place arrivals alike.
"""

from __future__ import annotations

import csv
import dataclasses
import heapq
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchbatch.core.workload import Request
from benchbatch.errors import UserError

TRACE_OPTION = "trace"


def unit_poisson(requests: int, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """Arrival times of a Poisson process of rate 1 per second, the first at 0: divided by
    a rate r they are a Poisson process of rate r. Every rate of a sweep scales the same
    draws (common random numbers), so the curve is not jagged by a new draw at each rate.

    burstiness (vLLM's bench serve --burstiness): the gaps are gamma-distributed with this
    shape and mean 1 (scale 1 / burstiness), so their coefficient of variation is
    1 / sqrt(burstiness): 1 is the Poisson process (exponential gaps, drawn as such, the
    same draws as without it), below 1 requests come in bursts and lulls, above 1 more
    evenly spaced than Poisson."""
    assert burstiness > 0 and math.isfinite(burstiness), burstiness
    # A stream of its own: the lengths of a seed do not change when arrivals are drawn.
    rng = np.random.default_rng([seed, 17])
    if burstiness == 1.0:
        gaps = rng.exponential(1.0, requests)
    else:
        gaps = rng.gamma(burstiness, 1.0 / burstiness, requests)
    times = np.concatenate(([0.0], np.cumsum(gaps[:-1]))) if requests else np.zeros(0)
    return times


def at_rate(unit_times: np.ndarray, rate: float) -> np.ndarray:
    """unit_times (a rate-1 process, or a trace scaled to rate 1) at `rate` requests per
    second; an infinite rate queues every request at time 0 (the 'max' point)."""
    if math.isinf(rate):
        return np.zeros_like(unit_times, dtype=np.float64)
    return np.asarray(unit_times, dtype=np.float64) / rate


def mean_rate(times: np.ndarray) -> float:
    """Requests per second of a set of arrival times: (n - 1) gaps over their span."""
    span = float(np.max(times) - np.min(times)) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else math.inf


def to_unit_rate(times: np.ndarray) -> np.ndarray:
    """A trace's arrival times shifted to start at 0 and scaled to 1 request per second, so
    at_rate() replays its shape (bursts and lulls) at any rate."""
    times = np.asarray(times, dtype=np.float64) - np.min(times)
    rate = mean_rate(times)
    return np.zeros_like(times) if math.isinf(rate) else times * rate


# --- the feed ---------------------------------------------------------------------------------


def in_arrival_order(
    requests: Sequence[Request], arrivals_s: Sequence[float]
) -> list[tuple[Request, float]]:
    """(request, arrival time) pairs by arrival time; ties keep the given order. ValueError
    for a count that does not match, or a time that is not finite or is negative."""
    requests, times = list(requests), [float(t) for t in arrivals_s]
    if len(times) != len(requests):
        raise ValueError(f"{len(times)} arrival times for {len(requests)} requests")
    if any(not math.isfinite(t) or t < 0 for t in times):
        raise ValueError("arrival times must be finite and not negative")
    order = sorted(range(len(times)), key=lambda i: times[i])  # stable: ties keep order
    return [(requests[i], times[i]) for i in order]


class ArrivalFeed:
    """Requests with arrival times in seconds, given to a scheduler as time passes.

    release(sched, now) adds every request that has arrived by `now` (the start of the step
    about to be planned) to the scheduler's queue, its arrival_step set to that step, so the
    queue's first-come-first-served order is the order of arrival (ties: the given order).
    """

    def __init__(self, requests: Sequence[Request], arrivals_s: Sequence[float]) -> None:
        ordered = in_arrival_order(requests, arrivals_s)
        self._requests = [r for r, _ in ordered]
        self._times = [t for _, t in ordered]
        self._next = 0
        self.arrival_s = {r.id: t for r, t in ordered}

    @property
    def empty(self) -> bool:
        """Every request has been handed over."""
        return self._next == len(self._times)

    @property
    def next_arrival(self) -> float:
        return self._times[self._next]

    def release(self, sched, now: float) -> int:
        """Hand the scheduler every request arrived by `now`; returns how many."""
        end = bisect_right(self._times, now, self._next)
        if end == self._next:
            return 0
        step = sched.step
        arrived = self._requests[self._next : end]
        sched.add_requests([dataclasses.replace(r, arrival_step=step) for r in arrived])
        count, self._next = end - self._next, end
        return count


class GatedFeed:
    """An ArrivalFeed behind a client that keeps at most `limit` requests in flight (vLLM's
    bench serve --max-concurrency, serve-sweep --endpoint's): a request is sent when it has
    arrived and a client slot is free, at max(its arrival, when the slot it takes freed),
    in arrival order; it reaches the scheduler delay_s after it was sent (a server's
    latency outside its steps), and holds its slot until it finishes (finish(ids, now):
    its last token came at now). sent_s: when each request was sent, the time its
    latencies count from, as the client's do."""

    def __init__(self, requests: Sequence[Request], arrivals_s: Sequence[float], limit: int,
                 delay_s: float = 0.0) -> None:  # fmt: skip
        assert limit >= 1 and delay_s >= 0, (limit, delay_s)
        ordered = in_arrival_order(requests, arrivals_s)
        self._waiting = deque(ordered)  # not sent yet
        self._sent: deque[tuple[Request, float]] = deque()  # sent, (request, due), by due
        self._free = [0.0] * limit  # when each free client slot freed (a heap)
        self._delay = delay_s
        self.arrival_s = {r.id: t for r, t in ordered}
        self.sent_s: dict[int, float] = {}

    @property
    def empty(self) -> bool:
        """Every request has been handed to the scheduler."""
        return not self._waiting and not self._sent

    @property
    def next_arrival(self) -> float:
        """When the next request can reach an idle scheduler: the next one sent, or the
        next one waiting once it has arrived and a slot is free (one is, when the
        scheduler is idle and nothing sent is due)."""
        due = [self._sent[0][1]] if self._sent else []
        if self._waiting and self._free:
            due.append(max(self._waiting[0][1], self._free[0]) + self._delay)
        return min(due)

    def release(self, sched, now: float) -> int:
        """Send what has arrived by `now` while a slot is free, then hand the scheduler
        every sent request due by `now`; returns how many were handed over."""
        while self._waiting and self._free and self._waiting[0][1] <= now:
            request, arrived = self._waiting.popleft()
            sent = max(arrived, heapq.heappop(self._free))
            self.sent_s[request.id] = sent
            self._sent.append((request, sent + self._delay))
        ready = []
        while self._sent and self._sent[0][1] <= now:
            ready.append(self._sent.popleft()[0])
        if ready:
            step = sched.step
            sched.add_requests([dataclasses.replace(r, arrival_step=step) for r in ready])
        return len(ready)

    def finish(self, ids: Sequence[int], now: float) -> None:
        """These requests' last tokens came at `now`: their client slots are free."""
        for _ in ids:
            heapq.heappush(self._free, now)


# --- a trace's arrival times ----------------------------------------------------------------------


def read_arrivals(path: str | Path) -> np.ndarray | None:
    """The arrival_s column of a trace (seconds, in row order), or None when it has none.

    Every value must be a finite number of seconds, zero or more; the first problem is a
    UserError naming the file and line. Lengths are read by trace.read_trace_columns.
    """
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            names = [n.strip() for n in reader.fieldnames or ()]
            if "arrival_s" not in names:
                return None
            column = reader.fieldnames[names.index("arrival_s")]
            times = [_seconds(row.get(column), path, reader.line_num) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise UserError(TRACE_OPTION, f"cannot read {path}: {reason}") from None
    return np.asarray(times, dtype=np.float64)


def _seconds(text: str | None, path: Path, line: int) -> float:
    text = (text or "").strip()
    where = f"{path} line {line}"
    if not text:
        raise UserError(TRACE_OPTION, f"{where}: arrival_s is empty (give every row a time)")
    try:
        value = float(text)
    except ValueError:
        raise UserError(TRACE_OPTION, f"{where}: arrival_s {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(
            TRACE_OPTION, f"{where}: arrival_s must be a finite number of seconds >= 0, got {text}"
        )
    return value
