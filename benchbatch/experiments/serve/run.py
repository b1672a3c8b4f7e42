"""`benchbatch serve-sweep`: request rate against latency and throughput, static vs
continuous vs continuous with chunked prefill, simulated and served on the model."""

from __future__ import annotations

import math

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions, record, use
from benchbatch.experiments import common as c
from benchbatch.experiments.serve.options import SERVE_WORKLOAD, ServeOptions
from benchbatch.output import render
from benchbatch.output.recorder import Recorder

WORKLOAD_FIELDS = ("requests", "slots", "median", "sigma", "max_output", "prompt_len", "trace")
RUN_FIELDS = (
    "device",
    "dtype",
    "seed",
    "repeats",
    "min_time",
    "warmup",
    "threads",
    "out",
    "force",
    "json_out",
)

LATENCY_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "p99",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p99_ms": "p99",
    "itl_p99_ms": "ITL p99 ms",
    "e2e_p50_s": "E2E p50",
    "slo": "SLO",
}
LOAD_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "request_throughput_rps": "req/s",
    "output_throughput_tps": "tok/s",
    "goodput_rps": "goodput",
    "occupancy_pct": "occupancy %",
    "mean_batch": "batch",
    "duration_s": "duration s",
}
VERSUS_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "duration_s": "duration",
    "output_throughput_tps": "tok/s",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "TTFT p99",
    "tpot_p50_s": "TPOT p50",
    "tpot_p99_s": "TPOT p99",
}
SLO_COLUMNS = {
    "policy": "policy",
    "source": "source",
    "sustained_rate": "sustains (req/s)",
    "goodput_rps": "goodput there",
    "leaves_slo_at": "leaves the SLO at",
}


@command(
    ServeOptions,
    use(WorkloadOptions, only=WORKLOAD_FIELDS, defaults=SERVE_WORKLOAD),
    ModelOptions,
    use(RunOptions, only=RUN_FIELDS),
)
def serve_sweep(
    opts: ServeOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """Request rate (requests per second) against TTFT, TPOT, ITL and throughput: static vs
    continuous vs continuous with chunked prefill, and the largest rate each sustains within
    the SLO.

    Poisson arrivals (seeded) at each rate, and a 'max' point with every request queued.
    Every point is simulated with a step-cost model fitted to steps timed here (or
    --step-costs): a step lasts what the model says, so a request arriving at t seconds is
    first seen by the first step starting at or after t. With --engine real (the default)
    the rates that fit --real-time are also served on the model (default preset: article on
    CUDA, cpu-small on CPU), arrivals on the wall clock, each beside the simulation of the
    very same requests and arrival times (sim-matched) and their ratio.

    Lengths from --prompt-dist and --output-dist (fixed, uniform, lognormal), or --trace: a
    CSV with output_tokens, optional prompt_tokens and optional arrival_s (seconds: its
    shape, bursts and lulls, is replayed at each rate; without it, Poisson arrivals).

    Metrics as the serving benchmarks define them: TTFT (arrival to first token), TPOT
    ((E2E - TTFT) / (output tokens - 1), per request), ITL (every gap between tokens), E2E;
    mean, p50, p90, p99; request and output-token throughput; goodput (requests per second
    meeting both --slo-ttft and --slo-tpot). A point is within the SLO when its p99 TTFT and
    p99 TPOT are. Slot occupancy and mean batch per point say why the curve bends.

    Defaults, sized for a 2-core CPU with cpu-small (a decode step of 8 sequences about 30
    ms): 500 requests per simulated point, 8 slots, prompts lognormal around 128 tokens (up
    to 1,024), outputs lognormal median 16 (at most 64), MLPerf's Llama-2-70B limits (TTFT
    2 s, TPOT 200 ms); rates from the simulated capacity; 40 requests per real point within
    150 s. Static batching leaves the SLO at about a third of the rate continuous batching
    sustains. The whole run takes about four minutes; --engine sim about half a minute.
    """
    from benchbatch.core.serving import ServingSLO
    from benchbatch.experiments.serve import probe

    opts.check(workload)
    slo = ServingSLO(opts.slo_ttft, opts.slo_tpot)
    setup = probe.Setup(workload.slots, opts.max_num_batched_tokens, opts.chunk, slo)
    probe.check_setup(opts.policies, setup)
    w = probe.draw(opts, workload, run.seed)
    given = _given_costs(opts)
    real = opts.engine == "real"
    rec = _open(opts, workload, model, run, w, real or given is None)
    rec.meta["workload"] = {"arrivals": w.arrivals, "lengths": w.lengths}
    with rec:
        net = c.build_model(rec, model, run)[0] if rec.target is not None else None
        cost = _cost_model(rec, net, setup, w, given, run)
        rates = _simulate(rec, opts, w, setup, cost)
        if real:
            _serve_real(rec, net, opts, w, setup, cost, rates, run.seed)
        rec.put("slo", probe.sustained(rec.rows("serve")))
        _figures(rec)
    _report(rec, run.json_out)


def _given_costs(opts: ServeOptions):
    if not opts.step_costs:
        return None
    from benchbatch.core import stepcost

    return stepcost.fit(stepcost.cost_rows_from_csv(opts.step_costs))


def _open(opts, workload, model, run, w, need_model: bool) -> Recorder:
    """A run on the model (the cost fit times steps, --engine real serves), or, with
    --step-costs and --engine sim, a simulation that touches no device."""
    if not need_model:
        rec = Recorder.open("serve-sweep", run, None, None, record(opts, workload, run))
        c.print_notes(_ignored(model, run))
        return rec
    n = min(opts.real_requests, len(w.requests))
    check = (lambda cfg: _check_real(cfg, w.requests[:n])) if opts.engine == "real" else None
    return c.open_model_run("serve-sweep", model, run, opts, workload, check=check)


def _check_real(cfg, requests) -> None:
    from benchbatch.runtime.engine import check_fits

    check_fits(cfg.max_context, requests)


def _ignored(model: ModelOptions, run: RunOptions) -> str | None:
    given = [f"--{k.replace('_', '-')}" for k in model.overrides()]
    given += [f"--{k}" for k in ("model", "preset", "config") if getattr(model, k) is not None]
    given += ["--dtype"] if run.dtype is not None else []
    if not given:
        return None
    return f"{', '.join(given)} only apply with --engine real or without --step-costs; ignored"


def _cost_model(rec, net, setup, w, given, run):
    from benchbatch.experiments.ablation.probe import Budgets
    from benchbatch.experiments.ablation.run import cost_model

    budgets = Budgets(setup.slots, setup.budget, setup.chunk)
    return cost_model(rec, net, budgets, w.requests, given, run)


# --- the simulated sweep ------------------------------------------------------------------------


def _simulate(rec, opts: ServeOptions, w, setup, cost) -> tuple[float, ...]:
    """serve.csv's simulated rows, one per (policy, rate), and requests.csv. The default
    rates come from the capacity the max point shows. Returns the rates."""
    from benchbatch.experiments.serve import probe

    done: dict = {}
    rates = opts.rate_values
    if rates is None:
        for p in opts.policies:
            done[(p, math.inf)] = probe.simulate_point(w, p, math.inf, setup, cost)
        rows = [probe.point_row(point, setup) for point in done.values()]
        rates = probe.auto_rates(probe.capacity(rows))
    rates = tuple(sorted(set(rates) | set(opts.real_rate_values or ())))
    rec.meta["rates_rps"] = [probe.rate_label(r) for r in rates]
    requests: list[dict] = []

    def points():
        for rate in rates:
            for p in opts.policies:
                point = done.pop((p, rate), None) or probe.simulate_point(w, p, rate, setup, cost)
                requests.extend(probe.request_rows(point, setup.slo))
                yield probe.point_row(point, setup)

    total = len(rates) * len(opts.policies)
    rec.record("serve", points(), total=total, label="simulating the sweep", timed=False)
    rec.put("requests", requests)
    return rates


# --- the real engine ------------------------------------------------------------------------------


def _serve_real(rec, net, opts: ServeOptions, w, setup, cost, rates, seed: int) -> None:
    """The chosen rates on the model: real_steps.csv as steps end; per point its serve.csv
    row beside the simulation of the same requests (sim-matched) and sim_vs_real.csv."""
    from benchbatch.experiments.serve import probe

    n = min(opts.real_requests, len(w.requests))
    matched, chosen = _matched(rec, opts, w, setup, cost, rates, n)
    if not chosen:
        return
    rows = {k: probe.point_row(v, setup) for k, v in matched.items()}
    for r in chosen:
        for p in opts.policies:
            rec.add("serve", rows[(p, r)])
            for row in probe.request_rows(matched[(p, r)], setup.slo):
                rec.add("requests", row, stream=True)
    by_label = {probe.rate_label(r): r for r in chosen}
    requests, _ = w.at(math.inf, n)

    def finished(spec, result) -> None:
        rate = by_label[spec.columns["rate"]]
        point = probe.real_point(result, spec.name, rate, requests, w.at(rate, n)[1])
        row = probe.point_row(point, setup)
        rec.add("serve", row)
        for versus in probe.sim_vs_real(row, rows[(spec.name, rate)]):
            rec.add("sim_vs_real", versus)
        for r in probe.request_rows(point, setup.slo):
            rec.add("requests", r, stream=True)

    runs = probe.engine_runs(w, chosen, opts.policies, setup, n, matched)
    steps = probe.real_steps(net, w, runs, n, seed, finished)
    total = sum(run.sim_steps for run in runs)
    rec.record("real_steps", steps, total=total, label="real engine", stream=True)


def _matched(rec, opts: ServeOptions, w, setup, cost, rates, n: int):
    """The simulation of the real engine's n requests at every candidate rate, and the rates
    to serve: --real-rates, or those that fit --real-time by these simulations' durations."""
    from benchbatch.experiments.serve import probe

    candidates = opts.real_rate_values or rates
    matched = {
        (p, r): probe.simulate_point(w, p, r, setup, cost, n, probe.MATCHED)
        for r in candidates
        for p in opts.policies
    }
    cost_s = {r: sum(matched[(p, r)].step_ends[-1] for p in opts.policies) for r in candidates}
    if opts.real_rates is None:
        rows = [probe.point_row(v, setup) for v in matched.values()]
        chosen, spent = probe.choose_real_rates(rows, cost_s, opts.real_time)
    else:
        chosen, spent = list(candidates), sum(cost_s.values())
    rec.meta["real"] = {
        "requests": n,
        "rates_rps": [probe.rate_label(r) for r in chosen],
        "estimated_s": spent,
        "budget_s": opts.real_time,
    }
    if chosen:
        _say_estimate(rec, n, chosen, spent)
    else:
        render.warning(f"no rate fits --real-time {opts.real_time:g} s: none served on the model")
    return matched, chosen


def _say_estimate(rec, n: int, chosen, spent: float) -> None:
    if rec.quiet:
        return
    from benchbatch.experiments.serve.options import rate_label

    render.err_console.print(
        f"real engine: {n} requests per point at {', '.join(rate_label(r) for r in chosen)} "
        f"req/s; the fitted cost model expects about {render.duration(spent)}",
        highlight=False,
    )


# --- figures and report ---------------------------------------------------------------------------


def _figures(rec) -> None:
    from benchbatch.output.plots.serve import pareto_figure, serve_figure

    rows = rec.rows("serve")
    title = _title(rec)
    opts = rec.meta["options"]
    serve_figure(rows, rec.folder / "serve.png", title, opts["slo_ttft"], opts["slo_tpot"])
    pareto_figure(rows, rec.folder / "pareto.png", title)


def _title(rec) -> str:
    opts = rec.meta["options"]
    model = "cost model from --step-costs" if rec.target is None else c.title(rec)
    return (
        f"{model}; {opts['slots']} slots; SLO: TTFT {opts['slo_ttft']:g} s, TPOT "
        f"{opts['slo_tpot'] * 1e3:g} ms (p99)"
    )


def _report(rec, json_out: bool) -> None:
    from benchbatch.experiments.ablation.run import cost_line

    rows, slo, versus = rec.rows("serve"), rec.rows("slo"), rec.rows("sim_vs_real")
    if json_out:
        return c.report_json(
            rec,
            step_cost=rec.meta.get("step_cost"),
            real=rec.meta.get("real"),
            rows=rows,
            slo=slo,
            sim_vs_real=versus,
        )
    render.out_console.print(cost_line(rec.meta["step_cost"]))
    for source, name in (("sim", "simulated"), ("real", "real engine")):
        mine = [_shown(r) for r in rows if r["source"] == source]
        if mine:
            n = f"{mine[0]['requests']:,} requests a point"
            render.table(mine, LATENCY_COLUMNS, f"{name}, {n}: latency (s unless ms)")
            render.table(mine, LOAD_COLUMNS, f"{name}: throughput, and what the slots did")
    if versus:
        title = "real engine over its simulation (the same requests at the same times)"
        render.table(_versus(versus), VERSUS_COLUMNS, title)
    render.table(slo, SLO_COLUMNS, "the largest rate each policy sustains within the SLO")
    for line in verdict_lines(slo):
        render.out_console.print(line, highlight=False)
    _warn_uncertain(rows)
    render.results_line(rec.folder)


def _shown(r: dict) -> dict:
    ms = {f"{k}_ms": 1e3 * r[f"{k}_s"] for k in ("tpot_p50", "tpot_p99", "itl_p99")}
    return {
        **ms,
        **r,
        "occupancy_pct": 100 * r["slot_occupancy"],
        "slo": "yes" if r["within_slo"] else "no",
    }


def _versus(rows: list[dict]) -> list[dict]:
    """sim_vs_real's ratios, one row per real point."""
    out: dict = {}
    for r in rows:
        key = (r["policy"], r["rate"])
        out.setdefault(key, {"policy": r["policy"], "rate": r["rate"]})
        out[key][r["metric"]] = f"x{r['measured_over_simulated']:.2f}"
    return list(out.values())


def verdict_lines(slo: list[dict]) -> list[str]:
    """Per source: the rate each policy sustains, continuous over static."""
    names = {"sim": "simulated", "real": "real engine", "sim-matched": "simulated, real workload"}
    lines = []
    for source, name in names.items():
        by = {r["policy"]: r for r in slo if r["source"] == source}
        if not by:
            continue
        parts = [f"{p} {_sustains(r)}" for p, r in by.items()]
        lines.append(f"{name}: within the SLO up to " + ", ".join(parts))
    return lines


def _sustains(r: dict) -> str:
    if r["sustained_rate"] is None:
        return f"no rate (leaves at {r['leaves_slo_at']})"
    if r["leaves_slo_at"] is None:
        return f"every rate ({r['sustained_rate']} included)"
    return f"{r['sustained_rate']} req/s"


def _warn_uncertain(rows: list[dict]) -> None:
    from benchbatch.core.serving import P99_MIN_REQUESTS

    few = sorted({r["requests"] for r in rows if r["p99_uncertain"]})
    if few:
        render.warning(
            f"points of {', '.join(f'{n:,}' for n in few)} requests: a p99 over fewer than "
            f"{P99_MIN_REQUESTS} requests is about their largest value, so it is uncertain "
            "(MLPerf asks for far more); raise --real-requests or --requests to firm it up"
        )


# --- reproduce's curve ----------------------------------------------------------------------------

REPRODUCE_FRACTIONS = (0.3, 0.6, 0.9)  # of the simulated capacity: below, near and past a knee


def reproduce_curve(rec, seed: int) -> dict:
    """reproduce's serving curve: serve-sweep's default workload and SLO at three rates,
    simulated with a cost model fitted to the phases and sweep steps the run just measured
    (no step is timed again): serve.csv, slo.csv, serve.png. Returns its summary."""
    from benchbatch.core import stepcost
    from benchbatch.core.serving import ServingSLO
    from benchbatch.experiments.serve import probe
    from benchbatch.output.plots.serve import serve_figure

    opts, workload = ServeOptions(), WorkloadOptions(**SERVE_WORKLOAD)
    files = [
        rec.folder / f"{t}.csv" for t in ("phases", "sweep") if (rec.folder / f"{t}.csv").exists()
    ]
    cost, fitted = stepcost.fit(stepcost.cost_rows_from_csv(files), "repeats")
    slo = ServingSLO(opts.slo_ttft, opts.slo_tpot)
    setup = probe.Setup(workload.slots, opts.max_num_batched_tokens, opts.chunk, slo)
    w = probe.draw(opts, workload, seed)
    top = [
        probe.point_row(probe.simulate_point(w, p, math.inf, setup, cost), setup)
        for p in opts.policies
    ]
    capacity = probe.capacity(top)
    rates = sorted({float(f"{f * capacity:.2g}") for f in REPRODUCE_FRACTIONS})
    rows = [
        probe.point_row(probe.simulate_point(w, p, r, setup, cost), setup)
        for r in rates
        for p in opts.policies
    ]
    rec.put("serve", rows)
    rec.put("slo", probe.sustained(rows))
    title = f"{c.title(rec)}; serve-sweep's workload, {workload.slots} slots"
    serve_figure(rows, rec.folder / "serve.png", title, opts.slo_ttft, opts.slo_tpot)
    return {
        "workload": f"{workload.requests} requests a rate, {w.lengths}, {workload.slots} slots",
        "slo": {"ttft_s": opts.slo_ttft, "tpot_s": opts.slo_tpot},
        "capacity_rps": capacity,
        "rates_rps": rates,
        "step_cost": stepcost.cost_summary(cost, fitted),
    }
