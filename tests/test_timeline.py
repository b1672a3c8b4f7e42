"""The compact timeline against the per-step one: run lengths, their table and CSV, the bin
means the figure draws, and the expansion back to every step."""

from __future__ import annotations

import random
from itertools import pairwise

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import (
    TIMELINE_COLUMNS,
    expand_timeline,
    run_policies,
    simulate,
    timeline_rows,
    timeline_runs,
    timeline_table,
)
from benchbatch.core.timeline import RunLengths
from benchbatch.core.workload import Request, lognormal_columns
from benchbatch.output.plots.occupancy import MAX_POINTS, _downsample


def per_step_active(starts: list[int], ends: list[int]) -> list[int]:
    """Brute force: for every step, the intervals [start, end) that hold it."""
    total = max(ends, default=0)
    return [sum(s <= t < e for s, e in zip(starts, ends, strict=True)) for t in range(total)]


intervals_st = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 30)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(intervals_st)
def test_run_lengths_of_intervals_equal_counting_every_step(intervals):
    starts = np.array([s for s, _ in intervals], np.int64)
    ends = np.array([s + n for s, n in intervals], np.int64)
    active = per_step_active(starts.tolist(), ends.tolist())
    runs = RunLengths.from_intervals(starts, ends)
    assert runs.expand().tolist() == active and runs.total_steps == len(active)
    assert runs == RunLengths.from_per_step(active)
    if runs.step.size:  # runs start at 0, neighbours differ, lengths are positive
        assert runs.step[0] == 0 and (np.diff(runs.active) != 0).all()
        assert (runs.lengths > 0).all() and runs.lengths.sum() == runs.total_steps


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=300), st.data())
def test_sums_over_any_edges_equal_summing_the_steps(active, data):
    runs = RunLengths.from_per_step(active)
    edges = sorted(data.draw(st.lists(st.integers(0, len(active)), min_size=2, max_size=12)))
    expected = [sum(active[a:b]) for a, b in pairwise(edges)]
    assert runs.sums(np.array(edges)).tolist() == expected


def test_the_figure_draws_the_same_points_and_bin_means_from_runs():
    rng = random.Random(0)
    for n in (1, 50, MAX_POINTS, MAX_POINTS + 1, 3 * MAX_POINTS + 17):
        active = np.repeat(rng.choices(range(40), k=n // 7 + 1), 7)[:n]
        steps, values, binned = _downsample(RunLengths.from_per_step(active))
        if n <= MAX_POINTS:  # every step, drawn "post": the value at each step is the run's
            assert not binned
            drawn = np.repeat(values[:-1], np.diff(steps))
            assert drawn.tolist() == active.tolist() and steps[-1] == n
        else:  # as the per-step figure: bin means over MAX_POINTS // 4 equal bins
            edges = np.linspace(0, n, MAX_POINTS // 4 + 1).astype(int)
            means = np.add.reduceat(active, edges[:-1]) / np.diff(edges)
            assert binned and steps.tolist() == edges.tolist()
            assert values[:-1].tolist() == means.tolist()


def workloads():
    yield [Request(0, 4, 3), Request(1, 4, 1), Request(2, 4, 1), Request(3, 4, 1)], 2
    yield lognormal_columns(600, seed=3), 32
    yield lognormal_columns(3000, seed=8, arrival_rate=0.05), 16  # idle steps between arrivals
    yield [Request(0, 1, 2, arrival_step=5)], 4  # nothing at all before step 5


def test_timeline_table_expands_to_the_per_step_rows_and_survives_csv(tmp_path):
    for requests, slots in workloads():
        sims = run_policies(requests, slots)
        table = timeline_table(sims)
        assert tuple(table.columns) == TIMELINE_COLUMNS
        per_step = pd.DataFrame(timeline_rows(sims))
        assert expand_timeline(table).to_dict("records") == per_step.to_dict("records")
        # Far fewer rows than steps, and what the CSV keeps is the same timeline.
        assert len(table) <= len(per_step)
        table.to_csv(tmp_path / "timeline.csv", index=False)
        back = pd.read_csv(tmp_path / "timeline.csv")
        assert timeline_runs(back) == {p: r.timeline.run_lengths() for p, r in sims.items()}
        for policy, r in sims.items():
            mine = table[table["policy"] == policy]
            assert mine["steps"].sum() == r.total_steps
            assert (mine["steps"] * mine["active_slots"]).sum() == r.useful_slot_steps


def test_per_step_timeline_of_the_scheduler_compacts_alike():
    requests = lognormal_columns(400, seed=2, arrival_rate=1.0)
    fast = run_policies(requests, 8)
    for policy in ("static", "continuous"):
        stepped = simulate(requests, make_scheduler(policy, 8), fast=False)
        assert stepped.timeline.run_lengths() == fast[policy].timeline.run_lengths()
        assert timeline_table({policy: stepped}).equals(timeline_table({policy: fast[policy]}))
