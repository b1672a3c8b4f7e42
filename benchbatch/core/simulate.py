"""Drive a scheduler without a model: each step costs one unit, or what a cost model says.

The simulator and the real engine drive the same scheduler, so a simulated run and a
measured one differ only in what a step costs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from benchbatch.core import article
from benchbatch.core.arrivals import ArrivalFeed, GatedFeed
from benchbatch.core.metrics import RunMetrics
from benchbatch.core.plans import StepPlan
from benchbatch.core.scheduler import Scheduler, make_scheduler
from benchbatch.core.serving import timed_run_metrics
from benchbatch.core.timeline import EventTimeline, RunLengths, Timeline
from benchbatch.core.workload import Request, Workload

StepCost = Callable[[StepPlan], float]


@dataclass
class SimResult:
    policy: str
    slots: int
    requests: int
    total_steps: int
    useful_slot_steps: int  # sum of output tokens: one slot-step per token
    total_time: float  # in steps without a cost model, else seconds
    timeline: Timeline | EventTimeline  # per step, or (fast path) runs and admissions
    metrics: RunMetrics | None
    step_end_times: list[float] | None = None  # only with a cost model
    step_start_times: list[float] | None = None  # arrivals in seconds: idle waits between steps

    @property
    def idle_slot_steps(self) -> int:
        return self.total_steps * self.slots - self.useful_slot_steps

    @property
    def occupancy(self) -> float:
        return self.useful_slot_steps / (self.total_steps * self.slots)


def simulate(
    requests: Iterable[Request] | Workload,
    scheduler: Scheduler,
    step_cost: StepCost | None = None,
    *,
    fast: bool = True,
    with_metrics: bool = True,
) -> SimResult:
    """Run every request to completion on a fresh scheduler.

    With the article's rule (default settings, no cost model) static and continuous runs
    take an event-driven fast path over arrays (core/article.py) that never builds step
    plans: it gives the same steps, timeline and metrics and leaves `scheduler` untouched.
    It is an exact shortcut of the scheduler, not a model of it: the two are proved equal
    (tests/test_simulate.py: test_fast_path_equals_generic_scheduler, and both against
    brute-force references in test_columns_fast_path_equals_references_at_many_sizes);
    fast=False runs the scheduler step by step instead. A Workload (columns) goes straight
    to the shortcut; a list of requests is converted.
    """
    assert scheduler.done and scheduler.step == 0, "simulate() needs a fresh scheduler"
    article_rule = scheduler.config.article_rule and scheduler.policy in article.POLICIES
    if fast and step_cost is None and article_rule:
        workload = Workload.of(requests)
        return _article_result(scheduler.policy, workload, scheduler.config.slots, with_metrics)
    requests = requests.to_requests() if isinstance(requests, Workload) else list(requests)
    return _simulate_steps(requests, scheduler, step_cost, with_metrics)


def _simulate_steps(
    requests: list[Request], sched: Scheduler, step_cost: StepCost | None, with_metrics: bool
) -> SimResult:
    sched.add_requests(requests)
    timeline, ends, now = Timeline(), [], 0.0
    # Each non-idle step does at least one token of work; idle steps wait for arrivals, and
    # a preemption undoes at most one request's tokens (and may leave its step without any).
    max_steps = 1 + max((r.arrival_step for r in requests), default=0)
    max_steps += sum(r.prompt_tokens + r.output_tokens for r in requests)
    lost = 1 + max((r.prompt_tokens + r.output_tokens for r in requests), default=0)
    while not sched.done:
        assert sched.step < max_steps + lost * sched.preemptions, "the scheduler stopped"
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


def simulate_timed(
    requests: Sequence[Request],
    arrivals_s: Sequence[float],
    scheduler: Scheduler,
    step_cost: StepCost,
    *,
    with_metrics: bool = True,
    delay_s: float = 0.0,
    client_limit: int | None = None,
) -> SimResult:
    """Every request to completion, arrivals in seconds: each step lasts what step_cost says,
    and a request arriving at t joins the queue of the first step that starts at or after t
    (requests' own arrival_step is ignored). With nothing to run the simulation waits for
    the next arrival: no step is taken meanwhile (the engine idles, as a server does), and
    the step after the wait costs step_cost.woken_s(the wait) more where it prices one
    (StepCostModel: the core back from idle, slow).

    delay_s: a server's latency outside its steps (HTTP, tokenizing, streaming back), paid
    once per request: each reaches the scheduler delay_s after its arrival, and its metrics
    still count from the arrival, so TTFT and E2E include it and the token gaps do not.

    client_limit: a client that keeps at most this many requests in flight (a GatedFeed):
    a request waits for a free one after its arrival, and its metrics count from when it
    was sent, as the client's (vLLM's bench serve --max-concurrency) do.

    Metrics are in seconds from each request's own arrival time (serving.timed_run_metrics).
    """
    assert scheduler.done and scheduler.step == 0, "simulate_timed() needs a fresh scheduler"
    assert delay_s >= 0, delay_s
    requests = requests.to_requests() if isinstance(requests, Workload) else list(requests)
    arrivals_s = [float(t) for t in arrivals_s]
    feed = _feed(requests, arrivals_s, delay_s, client_limit)
    sched = scheduler
    woken = getattr(step_cost, "woken_s", None)  # a step after an idle wait costs more
    timeline, starts, ends, now, idle = Timeline(), [], [], 0.0, 0.0
    while True:
        feed.release(sched, now)
        if sched.done:
            if feed.empty:
                break
            idle += max(0.0, feed.next_arrival - now)
            now = max(now, feed.next_arrival)  # idle until the next request arrives
            continue
        plan = sched.schedule()
        starts.append(now)
        now += step_cost(plan) + (woken(idle) if woken is not None and idle else 0.0)
        idle = 0.0
        finished = sched.update(plan)
        if client_limit is not None:
            feed.finish(finished, now)
        timeline.append(plan)
        ends.append(now)
    metrics = None
    if with_metrics and sched.recorder is not None:
        arrived = {r.id: t for r, t in zip(requests, arrivals_s, strict=True)}
        arrived |= getattr(feed, "sent_s", {})  # behind a client's limit: from sending
        metrics = timed_run_metrics(sched.recorder.token_steps, ends, arrived)
    useful = sum(r.output_tokens for r in requests)
    return SimResult(
        sched.policy, sched.config.slots, len(requests), sched.step, useful, now,
        timeline, metrics, ends, starts,
    )  # fmt: skip


def _feed(requests, arrivals_s: list[float], delay_s: float, client_limit: int | None):
    """The requests as they reach the scheduler: delay_s after arriving, or behind a
    client's cap on requests in flight."""
    if client_limit is None:
        return ArrivalFeed(requests, [t + delay_s for t in arrivals_s])
    return GatedFeed(requests, arrivals_s, client_limit, delay_s)


def _article_result(policy: str, workload: Workload, slots: int, with_metrics: bool) -> SimResult:
    starts = article.admission_steps(policy, workload, slots)
    outputs = workload.output_tokens
    total_steps = int((starts + outputs).max()) if len(workload) else 0
    timeline = EventTimeline.from_requests(starts, outputs, workload.prompt_tokens)
    metrics = article.metrics(workload, starts) if with_metrics else None
    useful = int(outputs.sum())
    return SimResult(
        policy, slots, len(workload), total_steps, useful, float(total_steps), timeline, metrics
    )


# --- tables for the occupancy command ------------------------------------------------------


def run_policies(
    requests: Sequence[Request] | Workload,
    slots: int,
    policies: Sequence[str] = ("static", "continuous"),
    step_cost: StepCost | None = None,
    **settings,
) -> dict[str, SimResult]:
    """Simulate the same requests under each policy (a list is made columns once)."""
    if step_cost is None:
        requests = Workload.of(requests)
    return {
        p: simulate(requests, make_scheduler(p, slots, **settings), step_cost) for p in policies
    }


def occupancy_table(requests: Sequence[Request] | Workload, slots: int) -> list[dict]:
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
    """(policy, step, active_slots) for every step of every policy: the article's figure.
    One dict per step: for long runs use timeline_table() (compact) instead."""
    return [
        {"policy": policy, "step": step, "active_slots": active}
        for policy, r in results.items()
        for step, active in enumerate(r.timeline.active_slots)
    ]


TIMELINE_COLUMNS = ("policy", "step", "steps", "active_slots")
# The rule of the run-length file, for a run's metadata beside timeline.csv.
TIMELINE_FORM = (
    "run-length: one row per step where a policy's active-slot count changes; steps step .. "
    "step + steps - 1 each had active_slots slots doing useful work"
)


def timeline_table(results: dict[str, SimResult]):
    """The timeline in run-length form, a pandas DataFrame built from columns: one row per
    run of steps with the same active-slot count, i.e. per step where the count changes.
    Row (policy, step, steps, active_slots): steps step .. step + steps - 1 of that policy
    each had active_slots slots doing useful work. expand_timeline() gives every step back."""
    runs = {policy: r.timeline.run_lengths() for policy, r in results.items()}
    return _frame(
        runs,
        {
            "step": [rl.step for rl in runs.values()],
            "steps": [rl.lengths for rl in runs.values()],
            "active_slots": [rl.active for rl in runs.values()],
        },
    )


def timeline_runs(table) -> dict[str, RunLengths]:
    """Each policy's RunLengths from a timeline_table() (or the CSV written from it)."""
    out = {}
    for policy, rows in table.groupby("policy", sort=False):
        step, steps = rows["step"].to_numpy(np.int64), rows["steps"].to_numpy(np.int64)
        total = int(step[-1] + steps[-1])
        out[policy] = RunLengths(step, rows["active_slots"].to_numpy(np.int64), total)
    return out


def expand_timeline(table):
    """A timeline_table() back to one row per step: (policy, step, active_slots), the
    rows of timeline_rows() as a DataFrame."""
    runs = timeline_runs(table)
    return _frame(
        runs,
        {
            "step": [np.arange(rl.total_steps) for rl in runs.values()],
            "active_slots": [rl.expand() for rl in runs.values()],
        },
    )


def _frame(runs: dict[str, RunLengths], columns: dict[str, list[np.ndarray]]):
    """A DataFrame of a policy column and these columns, each the policies' arrays joined."""
    import pandas as pd  # not at import time: the simulator itself needs no pandas

    sizes = [len(arrays[0]) for arrays in zip(*columns.values(), strict=True)]
    joined = {
        name: np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        for name, arrays in columns.items()
    }
    policy = np.repeat(np.array(list(runs), dtype=object), sizes) if runs else []
    return pd.DataFrame({"policy": policy, **joined})
