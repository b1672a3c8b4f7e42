"""The occupancy probe on columns (a Workload, what WorkloadOptions.draw gives) gives what it
gives on a list of requests: the same rows, timeline and title."""

from __future__ import annotations

import pandas as pd

from benchbatch.core.options import WorkloadOptions
from benchbatch.core.simulate import expand_timeline, timeline_rows, timeline_table
from benchbatch.core.trace import read_trace
from benchbatch.core.workload import Workload, lognormal_workload
from benchbatch.experiments.occupancy import probe


def test_columns_and_lists_give_the_same_rows_timeline_and_title(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("output_tokens,arrival_step\n5,0\n300,2\n7,2\n1,40\n")
    cases = [
        (WorkloadOptions(requests=600), lognormal_workload(600, seed=3)),
        (
            WorkloadOptions(requests=2000, arrival_rate=4.0),
            lognormal_workload(2000, arrival_rate=4.0, seed=3),
        ),
        (WorkloadOptions(trace=trace), read_trace(trace)),
    ]
    for options, listed in cases:
        columns = options.draw(seed=3)
        assert isinstance(columns, Workload) and columns.to_requests() == listed
        sims, sims_listed = probe.simulate(columns, 8), probe.simulate(listed, 8)
        assert sims == sims_listed
        assert probe.occupancy(sims, 3) == probe.occupancy(sims_listed, 3)
        per_step = pd.DataFrame(timeline_rows(sims_listed))
        assert expand_timeline(timeline_table(sims)).equals(per_step)
    assert probe.title(WorkloadOptions(trace=trace).draw(), 8) == (
        "4 requests (output tokens: median 7, max 300), 8 slots: active slots per step"
    )


def test_the_articles_seed_through_columns():
    sims = probe.simulate(WorkloadOptions(requests=600).draw(seed=3), 32)
    summary = probe.summary(probe.occupancy(sims, 3))
    assert (summary["static_steps"], summary["continuous_steps"]) == (10089, 2576)
