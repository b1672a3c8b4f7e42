"""Drive a scheduler without a model: each step costs one unit, or what a cost model says.

The simulator and the real engine drive the same scheduler, so a simulated run and a
measured one differ only in what a step costs.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from benchbatch.engines.metrics import RequestMetrics, RunMetrics
from benchbatch.engines.scheduler import Scheduler, StepPlan, make_scheduler
from benchbatch.engines.workload import Request

StepCost = Callable[[StepPlan], float]


@dataclass
class Timeline:
    """Per step, column-wise (a long static run has millions of steps)."""

    active_slots: list[int] = field(default_factory=list)  # slots doing useful work
    decode_tokens: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)

    def append(self, plan: StepPlan) -> None:
        self.active_slots.append(plan.num_active)
        self.decode_tokens.append(plan.num_decode_tokens)
        self.prefill_tokens.append(plan.num_prefill_tokens)


@dataclass
class SimResult:
    policy: str
    slots: int
    requests: int
    total_steps: int
    useful_slot_steps: int  # sum of output tokens: one slot-step per token
    total_time: float  # in steps without a cost model, else seconds
    timeline: Timeline
    metrics: RunMetrics | None
    step_end_times: list[float] | None = None  # only with a cost model

    @property
    def idle_slot_steps(self) -> int:
        return self.total_steps * self.slots - self.useful_slot_steps

    @property
    def occupancy(self) -> float:
        return self.useful_slot_steps / (self.total_steps * self.slots)


def simulate(
    requests: Iterable[Request],
    scheduler: Scheduler,
    step_cost: StepCost | None = None,
    *,
    fast: bool = True,
    with_metrics: bool = True,
) -> SimResult:
    """Run every request to completion on a fresh scheduler.

    With the article's rule (default settings, no cost model) static and continuous runs
    take an event-driven fast path that never builds step plans: it gives the same steps,
    timeline and metrics (tested) and leaves `scheduler` untouched.
    """
    requests = list(requests)
    assert scheduler.done and scheduler.step == 0, "simulate() needs a fresh scheduler"
    fast_path = _FAST_PATHS.get(scheduler.policy)
    if fast and step_cost is None and scheduler.config.article_rule and fast_path:
        slots = scheduler.config.slots
        starts = fast_path(requests, slots)
        return _fast_result(scheduler.policy, requests, starts, slots, with_metrics)
    return _simulate_steps(requests, scheduler, step_cost, with_metrics)


def _simulate_steps(
    requests: list[Request], sched: Scheduler, step_cost: StepCost | None, with_metrics: bool
) -> SimResult:
    sched.add_requests(requests)
    timeline, ends, now = Timeline(), [], 0.0
    # Each non-idle step does at least one token of work; idle steps wait for arrivals.
    max_steps = 1 + max((r.arrival_step for r in requests), default=0)
    max_steps += sum(r.prompt_tokens + r.output_tokens for r in requests)
    while not sched.done:
        assert sched.step < max_steps, "the scheduler stopped making progress"
        plan = sched.schedule()
        now += 1.0 if step_cost is None else step_cost(plan)
        sched.update(plan)
        timeline.append(plan)
        ends.append(now)
    times = None if step_cost is None else ends
    metrics = sched.recorder.metrics(times) if with_metrics and sched.recorder else None
    return SimResult(
        sched.policy,
        sched.config.slots,
        len(requests),
        sched.step,
        sum(r.output_tokens for r in requests),
        now,
        timeline,
        metrics,
        times,
    )


# --- fast paths (article rule: n output tokens hold a slot for exactly n steps) -------------


def _fcfs(requests: list[Request]) -> list[int]:
    """Indices in first-come-first-served order (arrival, then list order), as the queue."""
    return sorted(range(len(requests)), key=lambda i: requests[i].arrival_step)


def _continuous_starts(requests: list[Request], slots: int) -> list[int]:
    """Admission step of each request: the earliest free slot, never before an earlier
    request (FCFS) nor before arrival; a slot freed at the end of step t is free at t + 1."""
    free_at = [0] * slots  # a heap of the steps at which each slot is next free
    starts, previous = [0] * len(requests), 0
    for i in _fcfs(requests):
        r = requests[i]
        start = max(r.arrival_step, free_at[0], previous)
        heapq.heapreplace(free_at, start + r.output_tokens)
        starts[i] = previous = start
    return starts


def _static_starts(requests: list[Request], slots: int) -> list[int]:
    """Groups of up to `slots` arrived requests; the next group starts when the longest
    request of this one ends (or when the next request arrives, if later)."""
    order, starts = _fcfs(requests), [0] * len(requests)
    i, now = 0, 0
    while i < len(order):
        now = max(now, requests[order[i]].arrival_step)
        j = i
        while j < len(order) and j - i < slots and requests[order[j]].arrival_step <= now:
            starts[order[j]] = now
            j += 1
        now += max(requests[k].output_tokens for k in order[i:j])
        i = j
    return starts


_FAST_PATHS: dict[str, Callable[[list[Request], int], list[int]]] = {
    "continuous": _continuous_starts,
    "static": _static_starts,
}


def _fast_result(
    policy: str, requests: list[Request], starts: list[int], slots: int, with_metrics: bool
) -> SimResult:
    ends = (s + r.output_tokens for r, s in zip(requests, starts, strict=True))
    total_steps = max(ends, default=0)
    timeline = _fast_timeline(requests, starts, total_steps)
    metrics = _fast_metrics(requests, starts) if with_metrics else None
    useful = sum(r.output_tokens for r in requests)
    return SimResult(
        policy, slots, len(requests), total_steps, useful, float(total_steps), timeline, metrics
    )


def _fast_timeline(requests: list[Request], starts: list[int], total_steps: int) -> Timeline:
    delta, admitted, prefill = [0] * (total_steps + 1), [0] * total_steps, [0] * total_steps
    for r, s in zip(requests, starts, strict=True):
        delta[s] += 1
        delta[s + r.output_tokens] -= 1
        admitted[s] += 1
        prefill[s] += r.prompt_tokens
    active = list(accumulate(delta[:total_steps]))
    decode = [a - n for a, n in zip(active, admitted, strict=True)]
    return Timeline(active, decode, prefill)


def _fast_metrics(requests: list[Request], starts: list[int]) -> RunMetrics:
    """Token k of a request admitted at step s comes at the end of step s + k - 1."""
    run = RunMetrics([], Counter({1.0: sum(r.output_tokens - 1 for r in requests)}))
    for r, s in zip(requests, starts, strict=True):
        tbt = 1.0 if r.output_tokens > 1 else 0.0
        run.requests.append(
            RequestMetrics(
                r.id,
                float(r.arrival_step),
                float(s + 1),
                float(s + r.output_tokens),
                r.output_tokens,
                tbt,
                tbt,
                tbt,
            )
        )
    if not run.tbt_counts[1.0]:
        del run.tbt_counts[1.0]
    return run


# --- tables for the occupancy command ------------------------------------------------------


def run_policies(
    requests: Sequence[Request],
    slots: int,
    policies: Sequence[str] = ("static", "continuous"),
    step_cost: StepCost | None = None,
    **settings,
) -> dict[str, SimResult]:
    """Simulate the same requests under each policy."""
    return {
        p: simulate(requests, make_scheduler(p, slots, **settings), step_cost) for p in policies
    }


def occupancy_table(requests: Sequence[Request], slots: int) -> list[dict]:
    """One row per policy: steps, slot-steps, occupancy (fraction) and speedup vs static."""
    return occupancy_rows(run_policies(requests, slots))


def occupancy_rows(results: dict[str, SimResult]) -> list[dict]:
    static_time = results["static"].total_time if "static" in results else None
    return [
        {
            "policy": policy,
            "requests": r.requests,
            "slots": r.slots,
            "total_steps": r.total_steps,
            "useful_slot_steps": r.useful_slot_steps,
            "idle_slot_steps": r.idle_slot_steps,
            "occupancy": r.occupancy,
            "speedup_vs_static": static_time / r.total_time if static_time else None,
        }
        for policy, r in results.items()
    ]


def timeline_rows(results: dict[str, SimResult]) -> list[dict]:
    """(policy, step, active_slots) for every step of every policy: the article's figure."""
    return [
        {"policy": policy, "step": step, "active_slots": active}
        for policy, r in results.items()
        for step, active in enumerate(r.timeline.active_slots)
    ]


# --- step cost -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCostModel:
    """Linear model of one step's time. An idle step (nothing arrived yet) costs base_s.

    per_context_token_s prices KV entries read: decode contexts and the earlier chunks a
    prefill chunk attends to (the re-read cost of chunked prefill).
    """

    base_s: float
    per_decode_token_s: float
    per_prefill_token_s: float
    per_context_token_s: float = 0.0

    def __call__(self, plan: StepPlan) -> float:
        return (
            self.base_s
            + self.per_decode_token_s * plan.num_decode_tokens
            + self.per_prefill_token_s * plan.num_prefill_tokens
            + self.per_context_token_s * plan.num_context_tokens
        )


def fit_step_cost(
    samples: Iterable[Sequence[float]], weights: Sequence[float] | None = None
) -> StepCostModel:
    """Least squares from (decode_tokens, prefill_tokens, context_tokens, seconds) samples.

    A feature that is zero in every sample (e.g. no prefill measured) gets coefficient 0.
    weights (one per sample) make it weighted least squares: 1 / seconds^2 fits relative
    errors, so short steps count as much as long ones.
    """
    points = [tuple(float(v) for v in s) for s in samples]
    rows = [(1.0, d, p, c) for d, p, c, _ in points]
    ys = [point[3] for point in points]
    used = [j for j in range(4) if any(row[j] for row in rows)]
    scale = [1.0] * len(rows) if weights is None else [w**0.5 for w in weights]
    x = [[row[j] * w for j in used] for row, w in zip(rows, scale, strict=True)]
    ys = [y * w for y, w in zip(ys, scale, strict=True)]
    coef = dict(zip(used, _least_squares(x, ys), strict=True))
    return StepCostModel(*(coef.get(j, 0.0) for j in range(4)))


def _least_squares(x: list[list[float]], y: list[float]) -> list[float]:
    """Solve the normal equations (X^T X) b = X^T y by Gaussian elimination."""
    k = len(x[0]) if x else 0
    a = [[sum(r[i] * r[j] for r in x) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * yi for r, yi in zip(x, y, strict=True)) for i in range(k)]
    return _solve(a, b)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gauss-Jordan with partial pivoting; a near-zero pivot means a singular system."""
    k = len(b)
    m = [row[:] + [bi] for row, bi in zip(a, b, strict=True)]
    tiny = 1e-12 * max((abs(v) for row in a for v in row), default=1.0)
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= tiny:
            raise ValueError("step-cost samples do not determine the model (too few or collinear)")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(k):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [v - factor * w for v, w in zip(m[r], m[col], strict=True)]
    return [m[i][k] / m[i][i] for i in range(k)]
