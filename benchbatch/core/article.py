"""The article's rule over arrays: n output tokens hold a slot for exactly n steps.

Under that rule (the scheduler's default settings, no cost model) a static or continuous
run is fixed by the step at which each request is admitted; one event-driven pass over the
requests finds those steps (a heap of slot free times for continuous batching, one group at
a time for static), and the timeline and every request's metrics follow in closed form:
no object and no Python iteration per step. The step-by-step scheduler gives the same
numbers (tests/test_simulate.py checks both against brute-force references).
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections import Counter

import numpy as np

from benchbatch.core.metrics import ColumnarRunMetrics, RequestColumns
from benchbatch.core.workload import Workload

POLICIES = ("static", "continuous")


def admission_steps(policy: str, workload: Workload, slots: int) -> np.ndarray:
    """The step at which each request (in workload order) takes its slot."""
    pass_ = _continuous if policy == "continuous" else _static
    order = fcfs_order(workload.arrival_step)
    if order is None:  # already first come, first served
        return pass_(workload.arrival_step, workload.output_tokens, slots)
    starts = np.empty(len(workload), np.int64)
    starts[order] = pass_(workload.arrival_step[order], workload.output_tokens[order], slots)
    return starts


def fcfs_order(arrivals: np.ndarray) -> np.ndarray | None:
    """First come, first served: by arrival step, then workload order (the queue's order);
    None when that is the workload's order."""
    if arrivals.size < 2 or (arrivals[1:] >= arrivals[:-1]).all():
        return None
    return np.argsort(arrivals, kind="stable")


def _continuous(arrivals: np.ndarray, outputs: np.ndarray, slots: int) -> np.ndarray:
    """Each request (in FCFS order) takes the earliest free slot, never before it arrives nor
    before an earlier request; a slot freed at the end of step t is free at step t + 1."""
    head = min(slots, arrivals.size)  # these find a slot free: they start as they arrive
    first = np.maximum.accumulate(arrivals[:head])
    if head == arrivals.size:
        return first
    free = (first + outputs[:head]).tolist()  # the step at which each slot is next free
    heapq.heapify(free)
    rest_outputs = outputs[head:].tolist()
    if arrivals[0] == arrivals[-1]:
        # All arrived together: the earliest free slot never precedes the previous start
        # (the heap's minimum only grows), so the start is simply that slot's free step.
        rest = _earliest_free(free, rest_outputs)
    else:
        rest = _earliest_free_after(free, arrivals[head:].tolist(), rest_outputs, int(first[-1]))
    return np.concatenate((first, np.frombuffer(rest, np.int64)))


# Starts go to an array of int64 rather than a list: 8 bytes each, not an int object.


def _earliest_free(free: list[int], outputs: list[int]) -> array:
    starts = array("q")
    take, keep = heapq.heapreplace, starts.append
    for n in outputs:
        start = free[0]
        take(free, start + n)
        keep(start)
    return starts


def _earliest_free_after(
    free: list[int], arrivals: list[int], outputs: list[int], previous: int
) -> array:
    starts = array("q")
    take, keep = heapq.heapreplace, starts.append
    for a, n in zip(arrivals, outputs, strict=True):
        start = free[0]
        if start < a:
            start = a
        if start < previous:
            start = previous
        take(free, start + n)
        keep(start)
        previous = start
    return starts


def _static(arrivals: np.ndarray, outputs: np.ndarray, slots: int) -> np.ndarray:
    """Groups of up to `slots` arrived requests (FCFS); the next group starts when the longest
    request of this one ends, or when its first request arrives if that is later."""
    n = arrivals.size
    if n and arrivals[0] == arrivals[-1]:  # all arrived together: groups of `slots` in order
        firsts = np.arange(0, n, slots)
        longest = np.maximum.reduceat(outputs, firsts)
        begins = arrivals[0] + np.concatenate(([0], np.cumsum(longest)[:-1]))
    else:
        firsts, begins = _groups(arrivals.tolist(), outputs.tolist(), slots)
    return np.repeat(np.asarray(begins, np.int64), np.diff(firsts, append=n))


def _groups(arrivals: list[int], outputs: list[int], slots: int) -> tuple[list[int], list[int]]:
    """Index of each group's first request and its start step, group by group."""
    firsts, begins = [], []
    i, now = 0, 0
    while i < len(arrivals):
        now = max(now, arrivals[i])
        j = min(i + slots, bisect_right(arrivals, now, i))  # arrivals are sorted
        firsts.append(i)
        begins.append(now)
        now += max(outputs[i:j])
        i = j
    return firsts, begins


def metrics(workload: Workload, starts: np.ndarray) -> ColumnarRunMetrics:
    """Token k of a request admitted at step s comes at the end of step s + k - 1 (time
    s + k in steps), so every gap between tokens is one step."""
    outputs = workload.output_tokens
    tbt = (outputs > 1).astype(np.float64)  # 0 for a request with a single token
    columns = RequestColumns(
        workload.id, workload.arrival_step, starts + 1, starts + outputs, outputs, tbt, tbt, tbt
    )
    gaps = int(outputs.sum()) - len(workload)
    return ColumnarRunMetrics(columns, Counter({1.0: gaps}) if gaps else Counter())
