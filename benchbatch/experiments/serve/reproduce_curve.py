"""reproduce's serving curve: serve-sweep's default workload simulated on the step costs
reproduce has just measured (no step timed again)."""

from __future__ import annotations

import math

from benchbatch.core.options import WorkloadOptions
from benchbatch.experiments import common as c
from benchbatch.experiments.serve.options import SERVE_WORKLOAD, ServeOptions

REPRODUCE_FRACTIONS = (0.3, 0.6, 0.9)  # of the simulated capacity: below, near and past a knee


def reproduce_curve(rec, seed: int) -> dict:
    """reproduce's serving curve: serve-sweep's default workload and SLO at three rates,
    simulated with a cost model fitted to the phases and sweep steps the run just measured
    (no step is timed again): serve.csv, slo.csv (with each policy's bisected knee and
    its range), serve.png. Returns its summary."""
    from benchbatch.core import stepcost
    from benchbatch.core.serving import ServingSLO
    from benchbatch.experiments.serve import knees, probe, rate_choice, workloads
    from benchbatch.output.plots.serve import serve_figure

    opts, workload = ServeOptions(), WorkloadOptions(**SERVE_WORKLOAD)
    files = [
        rec.folder / f"{t}.csv" for t in ("phases", "sweep") if (rec.folder / f"{t}.csv").exists()
    ]
    cost, fitted = stepcost.fit(stepcost.cost_rows_from_csv(files), "repeats")
    slo = ServingSLO(opts.slo_ttft, opts.slo_tpot)
    setup = probe.Setup(workload.slots, opts.max_num_batched_tokens, opts.chunk, slo)
    w = workloads.draw(opts, workload, seed)
    top = [
        probe.point_row(probe.simulate_point(w, p, math.inf, setup, cost), setup)
        for p in opts.policies
    ]
    capacity = rate_choice.capacity(top)
    rates = sorted({float(f"{f * capacity:.2g}") for f in REPRODUCE_FRACTIONS})
    rows = [
        probe.point_row(probe.simulate_point(w, p, r, setup, cost), setup)
        for r in rates
        for p in opts.policies
    ]
    rec.put("serve", rows)
    # The S claim's rates with their noise; the max point says where the knee is above them.
    found = knees.knees(w, rows + top, setup, cost)
    rec.put("slo", knees.with_knees(probe.sustained(rows), found))
    title = f"{c.title(rec)}; serve-sweep's workload, {workload.slots} slots"
    serve_figure(rows, rec.folder / "serve.png", title, opts.slo_ttft, opts.slo_tpot)
    return {
        "workload": f"{workload.requests} requests a rate, {w.lengths}, {workload.slots} slots",
        "slo": {"ttft_s": opts.slo_ttft, "tpot_s": opts.slo_tpot},
        "capacity_rps": capacity,
        "rates_rps": rates,
        "step_cost": stepcost.cost_summary(cost, fitted),
        "knees": {
            "width": knees.KNEE_WIDTH,
            "step_cost_spread": knees.STEP_COST_SPREAD,
            "policies": found,
        },
    }
