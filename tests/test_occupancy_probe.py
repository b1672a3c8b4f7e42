"""The occupancy probe's columnar functions give what its list functions give, so the command
can switch to them without changing a number."""

from __future__ import annotations

import pandas as pd

from benchbatch.commands.occupancy import _sim_title
from benchbatch.engines.simulate import expand_timeline, timeline_rows
from benchbatch.engines.workload import Workload
from benchbatch.probes import occupancy as probe

MAKE = dict(median=70, sigma=0.9, max_output=2000, prompt_len=64, arrival_rate=None, trace=None)


def test_columns_and_lists_give_the_same_rows_timeline_and_title(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("output_tokens,arrival_step\n5,0\n300,2\n7,2\n1,40\n")
    cases = [
        (600, {**MAKE}),
        (2000, {**MAKE, "arrival_rate": 4.0}),
        (0, {**MAKE, "trace": trace}),
    ]
    for requests, make in cases:
        listed = probe.workload(requests, seed=3, **make)
        columns = probe.workload_columns(requests, seed=3, **make)
        assert isinstance(columns, Workload) and columns.to_requests() == listed
        sims, sims_listed = probe.simulate(columns, 8), probe.simulate(listed, 8)
        assert sims == sims_listed
        assert probe.occupancy(sims, 3) == probe.occupancy(sims_listed, 3)
        per_step = pd.DataFrame(timeline_rows(sims_listed))
        assert expand_timeline(probe.timeline(sims)).equals(per_step)
        assert probe.title(columns, 8) == _sim_title(listed, 8)


def test_the_articles_seed_through_columns():
    sims = probe.simulate(probe.workload_columns(600, seed=3, **MAKE), 32)
    summary = probe.summary(probe.occupancy(sims, 3))
    assert (summary["static_steps"], summary["continuous_steps"]) == (10089, 2576)
