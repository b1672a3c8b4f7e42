"""The one loop of the real engine, for every experiment that runs it (occupancy and its
memory policies, ablation, serve-sweep, reproduce): runs in turn, each a policy (or scheme)
over the same requests, reported through one channel, an iterator of events: a row per
step as it ends, then `Finished(run, result)` once the run has served every request. The
recorder consumes the rows (Recorder.engine_rows) and hands the Finished events back to the
experiment, which turns each into its summary row: no callbacks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from benchbatch.core.workload import Request


@dataclass
class EngineRun:
    """One run of the real engine: a policy (or an ablation scheme) on the workload.

    name: what the rows call it (their `key` column); sim_step_s: the simulation's price of
    each step, when a cost model priced them, set beside each measured step."""

    name: str
    slots: int
    policy: str = "continuous"
    settings: dict = field(default_factory=dict)
    sim_steps: int = 0
    key: str = "policy"
    sim_step_s: Sequence[float] | None = None
    stop_tokens: frozenset[int] = frozenset()  # end a request at one (end-of-sequence)
    arrivals_s: Sequence[float] | None = None  # arrivals in seconds, on the wall clock
    columns: dict = field(default_factory=dict)  # set in each of its rows (serve-sweep: rate)
    client_limit: int | None = None  # a client's cap on requests in flight (arrivals_s)


@dataclass(frozen=True)
class Finished:
    """A run has served every request: its EngineResult."""

    run: EngineRun
    result: object


def engine_events(
    model, requests: Sequence[Request], runs: Sequence[EngineRun], seed: int
) -> Iterator[dict | Finished]:
    """Every run in turn: a row per step as it ends (the steps' CSV), then its Finished.
    A compiled model's rows have compile_s: the seconds of the step torch spent compiling
    (a new shape), which its step time includes, and compiled.row_columns' others; the
    run's result keeps its total (engine.csv's compile_s)."""
    from benchbatch.runtime import compiled
    from benchbatch.runtime.engine import Engine

    for run in runs:
        engine = Engine(model, run.policy, run.slots, seed, run.stop_tokens, **run.settings)
        start = before = compiled.counts(model)
        for record in engine.steps(requests, run.arrivals_s, run.client_limit):
            row = step_row(run, record.row())
            row |= compiled.row_columns(model, before)
            before = compiled.counts(model)
            if run.sim_step_s is not None:
                row["sim_step_ms"] = 1e3 * run.sim_step_s[record.step]
            yield row
        if start is not None:  # the run's compile seconds: in its wall time, said apart
            engine.result.compile_s = compiled.row_columns(model, start)["compile_s"]
        yield Finished(run, engine.result)


def step_row(run: EngineRun, step: dict) -> dict:
    """A step's row: the run's name in its key column first, then its columns, then the
    step's. The step's own `policy` is the scheduler's (serve-sweep's chunked policy runs the
    continuous scheduler with chunked prefill): where the key is `policy` too, the run's name
    wins (the scheduler's policy is what the name stands for); under another key (ablation's
    scheme, the memory policies) both columns are kept."""
    if run.key == "policy":
        step = {k: v for k, v in step.items() if k != "policy"}
    return {run.key: run.name, **run.columns, **step}
