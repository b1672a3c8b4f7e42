"""`benchbatch serve-sweep`: request rate against latency and throughput, static vs
continuous vs continuous with chunked prefill, simulated and served on the model."""

from __future__ import annotations

import math

from benchbatch.core import energy
from benchbatch.core.fits import check_fits
from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import record
from benchbatch.experiments import common as c
from benchbatch.experiments.serve import real
from benchbatch.experiments.serve import work_checks as checks
from benchbatch.experiments.serve.options import ServeOptions
from benchbatch.output.recorder import Recorder


def open_run(
    opts: ServeOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> Recorder:
    """Every input checked (the lengths, the budgets, the trace, --step-costs), then the
    run: on the model, or without one for --step-costs with --engine sim, or against a
    running server (--endpoint), which is reached before anything is written."""
    opts.check(workload)
    if opts.endpoint is not None:
        return _open_endpoint(opts, workload, model, run)
    checks.check_work(opts, workload)  # before drawing: --requests alone may be too many
    _, w, given = _plan(opts, workload, run)
    checks.check_work(opts, workload, w)
    checks.check_real_rates(opts, w)
    rec = _open(opts, workload, model, run, w, opts.engine == "real" or given is None, given)
    _record_workload(rec, w)
    return rec


# The drawn arrivals' own rate off the nominal by more than this: said (serve.csv's
# arrival_rate_rps has each point's).
ARRIVAL_RATE_WARN = 0.10


def _record_workload(rec, w) -> None:
    """metadata.json's workload, and a warning where the draw's own arrival rate is far
    from the nominal one (in bursts, a draw of a few hundred requests can be)."""
    from benchbatch.core.arrivals import mean_rate

    drawn = mean_rate(w.unit_arrivals) if len(w.unit_arrivals) > 1 else 1.0
    rec.meta["workload"] = {"arrivals": w.arrivals, "lengths": w.lengths,
                            "arrival_rate_over_nominal": drawn}  # fmt: skip
    if abs(drawn - 1.0) > ARRIVAL_RATE_WARN:  # a trace's are scaled to exactly 1
        rec.warning(
            f"the {len(w.unit_arrivals):,} requests' drawn arrivals come at {drawn:.2f}x each "
            f"nominal rate ({w.arrivals}): one draw of the process; serve.csv's "
            "arrival_rate_rps has each point's, and more --requests (or another --seed) "
            "draw closer to the nominal rate"
        )


def measure_run(
    rec, opts: ServeOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    from benchbatch.experiments.serve import knees, probe

    setup, w, given = _plan(opts, workload, run)
    if opts.endpoint is not None:
        from benchbatch.experiments.serve import endpoint as ep

        ep.serve(rec, opts, w, setup, *_endpoint_costs(rec, setup, w, given, run))
        rec.put("slo", probe.sustained(rec.rows("serve")))
        rec.meta["energy"] = energy.summary(energy.measured_points(rec.rows("serve")),
                                        "joules_per_output_token")  # as the terminal says
        _warn_uncertain(rec)
        _figures(rec)
        return
    net = c.build_model(rec, model, run)[0] if rec.target is not None else None
    cost, cpu_cost = _cost_model(rec, net, setup, w, given, run)
    sweep_cost = _sweep_cost(rec, cost, cpu_cost)
    rates = _simulate(rec, opts, w, setup, sweep_cost)
    _knees(rec, opts, w, setup, sweep_cost)
    if opts.engine == "real":
        served = real.serve(rec, net, opts, w, setup, cost, rates, run.seed, cpu_cost)
        if served is not None:
            real.compare(rec, served)
    found = (rec.meta.get("knees") or {}).get("policies", [])
    rec.put("slo", knees.with_knees(probe.sustained(rec.rows("serve")), found))
    rec.meta["energy"] = energy.summary(energy.measured_points(rec.rows("serve")),
                                        "joules_per_output_token")  # as the terminal says
    _warn_uncertain(rec)
    _figures(rec)


def _warn_uncertain(rec) -> None:
    """Points whose p99 rests on too few requests, said under the tables and kept."""
    from benchbatch.core.serving import P99_MIN_REQUESTS

    uncertain = [r for r in rec.rows("serve") if r["p99_uncertain"] and r["requests"]]
    few = sorted({r["requests"] for r in uncertain})
    if few:  # the option that sizes those points: served ones' --real-requests
        served = any(r.get("source") in ("real", "endpoint", "sim-matched") for r in uncertain)
        raise_it = "--real-requests" if served else "--requests"
        rec.warning(f"points of {', '.join(f'{n:,}' for n in few)} requests: a p99 over "
                    f"fewer than {P99_MIN_REQUESTS} requests is about their largest value, "
                    f"so it is uncertain (MLPerf asks for far more); raise {raise_it} to firm "
                    "it up", later=True)  # fmt: skip


def _plan(opts: ServeOptions, workload: WorkloadOptions, run: RunOptions):
    """What every point shares (checked), the requests and their arrivals (seeded: the same
    when drawn again), and the cost model fitted to --step-costs (None without)."""
    from benchbatch.core.serving import ServingSLO
    from benchbatch.experiments.serve import probe, workloads

    slo = ServingSLO(opts.slo_ttft, opts.slo_tpot)
    # One --max-concurrency cap holds at every point; a concurrency sweep's caps are each
    # point's own (probe.at_cap), as an endpoint's are (serve/endpoint.py sets them).
    cap = opts.caps[0] if len(opts.caps) == 1 and opts.endpoint is None else None
    setup = probe.Setup(workload.slots, opts.max_num_batched_tokens, opts.chunk, slo,
                        client_limit=cap)  # fmt: skip
    probe.check_setup(opts.policies, setup)
    return setup, workloads.draw(opts, workload, run.seed), _given_costs(opts)


def _given_costs(opts: ServeOptions):
    if not opts.step_costs:
        return None
    from benchbatch.core import saved_calibration

    return saved_calibration.given(opts.step_costs)


def _open(opts, workload, model, run, w, need_model: bool, given=None) -> Recorder:
    """A run on the model (the cost fit times steps, --engine real serves), or, with
    --step-costs and --engine sim, a simulation that touches no device."""
    if not need_model:
        rec = Recorder.open("serve-sweep", run, None, None, record(opts, workload, run))
        rec.note(_ignored(model, run))
        return rec
    n = min(opts.real_requests, len(w.requests))
    names = _length_options(opts, workload)
    serving = opts.engine == "real"
    check = (lambda cfg: _check_real(cfg, w.requests[:n], *names)) if serving else None
    return c.open_model_run("serve-sweep", model, run, opts, workload, check=check, given=given)


def _length_options(opts: ServeOptions, workload) -> tuple[str, str]:
    """The options that made the longest prompt and the longest output."""
    if getattr(workload, "trace", None) is not None:
        return "trace", "trace"
    prompt = "prompt_len" if opts.prompt_dist == "fixed" else "max_prompt"
    return prompt, "max_output"


def _check_real(cfg, requests, prompt: str = "max_prompt", output: str = "max_output") -> None:

    check_fits(cfg.max_context, requests, prompt=prompt, output=output)


def _ignored(
    model: ModelOptions, run: RunOptions, why: str = "with --engine real or without --step-costs"
) -> str | None:
    from benchbatch.experiments.fields import ignored_options

    return ignored_options(model, run, why)


def _cost_model(rec, net, setup, w, given, run):
    """(the step costs as the engine ran, wall clock; the same steps' work on the CPU
    clock, None where the calibration has none)."""
    from benchbatch.experiments.ablation.probe import Budgets
    from benchbatch.experiments.ablation.run import cost_model

    budgets = Budgets(setup.slots, setup.budget, setup.chunk)
    return cost_model(rec, net, budgets, w.requests, given, run, cpu_clock=True, wake=True)


def _sweep_cost(rec, cost, cpu_cost):
    """The sweep's step costs: the calibration's fit on the CPU clock where it has one (the
    device's own steps: the same on a quiet machine and on one whose other processes take
    turns on the core), else its wall-clock fit. The real engine's points are set beside
    their simulation on the CPU clock's fit over each point's own core share (real.beside)."""
    if cpu_cost is None:
        return cost
    clock = rec.meta["step_cost"].get("cpu_clock") or {}
    share = clock.get("core_share", math.nan)
    rec.meta["sweep_step_costs"] = "cpu clock"
    if share == share and share < c.SHARED_CORE:
        rec.note(
            f"the engine held its core {share:.0%} of the calibration's wall time (other "
            "processes took turns on it): the sweep is simulated on the calibration's CPU "
            "clock, the device's own steps, and each of the real engine's points beside a "
            "simulation at the share of the core it had while it was served"
        )
    return cpu_cost


# --- the simulated sweep ------------------------------------------------------------------------


def _simulate(rec, opts: ServeOptions, w, setup, cost) -> tuple[float, ...]:
    """serve.csv's simulated rows, one per (policy, rate) (a concurrency sweep's: one per
    (policy, cap) at its one rate), and requests.csv. The default rates come from the
    capacity the max point shows (a concurrency sweep's default rate is max). Returns the
    rates."""
    from benchbatch.experiments.serve import probe, rate_choice

    done: dict = {}
    rates = opts.rate_values
    if opts.concurrency_sweep:
        rates = rates or (math.inf,)
        rec.meta["max_concurrency"] = list(opts.caps)
    elif rates is None:
        for p in opts.policies:
            done[(p, math.inf)] = probe.simulate_point(w, p, math.inf, setup, cost)
        rows = [probe.point_row(point, setup) for point in done.values()]
        rates = rate_choice.auto_rates(rate_choice.capacity(rows))
    added = sorted(set(opts.real_rate_values or ()) - set(rates))
    if added:  # a real point is set beside its simulated twin
        rec.note(f"--real-rates {', '.join(probe.rate_label(r) for r in added)} not in the "
                 "simulated rates: simulated too, each real point beside its simulation")
    rates = tuple(sorted(set(rates) | set(added)))
    rec.meta["rates_rps"] = [probe.rate_label(r) for r in rates]
    requests: list[dict] = []

    def points():
        for rate in rates:
            for cap in opts.caps:
                capped, columns = probe.at_cap(setup, cap), probe.cap_columns(cap)
                for p in opts.policies:
                    point = done.pop((p, rate), None) or probe.simulate_point(w, p, rate,
                                                                              capped, cost)
                    requests.extend(probe.request_rows(point, setup.slo, cap))
                    row = probe.point_row(point, capped) | columns
                    yield row | energy.serve_columns(row, None, opts.price_per_hour)

    total = len(rates) * len(opts.caps) * len(opts.policies)
    rec.record("serve", points(), total=total, label="simulating the sweep", timed=False)
    rec.put("requests", requests)
    return rates


def _knees(rec, opts: ServeOptions, w, setup, cost) -> None:
    """Each policy's knee in the sweep bisected between its last rate within the SLO and its
    first outside, or searched above the sweep where every finite rate was within
    (knees.knees: to KNEE_WIDTH, and again with every step STEP_COST_SPREAD slower and
    faster), into metadata's knees; left out, with a note, where those simulations would
    pass the run's simulation budget beside the sweep's."""
    from benchbatch.experiments.serve import knees, probe

    if opts.concurrency_sweep:
        return  # a knee is a rate; the sweep's slo.csv names the most in flight within it
    rows = [r for r in rec.rows("serve") if r["source"] == probe.SIM]
    brackets = knees.knee_brackets(rows)
    if not brackets:
        return
    point = checks.steps_bound(opts, w.requests) + ServeOptions.REQUEST_WORK * len(w.requests)
    total = len(brackets) * 3 * knees.KNEE_STEPS
    if (len(rows) + total) * point > ServeOptions.MAX_SIM_WORK:
        rec.note(
            f"the SLO knees are not bisected: {total} more simulations of {len(w.requests):,} "
            "requests would pass the run's simulation budget (fewer --requests); each "
            "policy's knee lies between its last rate within the SLO and its first outside"
        )
        return
    expected = knees.expected_knee_calls(brackets)
    with rec.progress("bisecting the SLO knees", expected) as task:
        found = knees.knees(w, rows, setup, cost, task.advance)
    rec.meta["knees"] = {"width": knees.KNEE_WIDTH, "step_cost_spread": knees.STEP_COST_SPREAD,
                         "policies": found}  # fmt: skip


# --- a running server (--endpoint) ------------------------------------------------------------


def _open_endpoint(opts: ServeOptions, workload, model, run) -> Recorder:
    """The server reached (/v1/models) and the requests checked against what it says, then
    the run's folder; no model is built here."""
    from benchbatch.experiments.serve import endpoint as ep
    from benchbatch.experiments.serve import lateness

    w = _plan(opts, workload, run)[1]
    n = min(opts.real_requests, len(w.requests))
    if opts.step_costs:
        checks.check_work(opts, workload, w)
    target, info = ep.connect(opts)
    ep.check_fits(info, w.requests[:n], *_length_options(opts, workload))
    options = record(opts, workload, run) | {"endpoint": info["url"]}  # no credentials
    rec = Recorder.open("serve-sweep", run, None, None, options)
    rec.note(_ignored(model, run, "with --endpoint (the server's model is measured)"))
    _record_workload(rec, w)
    rec.meta["endpoint"] = {k: v for k, v in info.items() if k != "vocab"}
    if info.get("client_priority_refused"):
        rec.note(lateness.refused_line(info["client_priority_refused"]))
    rec.inputs = (target, info)
    return rec


def _endpoint_costs(rec, setup, w, given, run) -> tuple:
    """--step-costs beside a server: an endpoint's calibration (its conditions checked
    against this server) predicts it; an engine's or isolated steps' costs are a what-if of
    benchbatch's engine on these requests. Returns (cost model or None, predicted)."""
    from benchbatch.experiments.serve import predict

    if given is None:
        return None, False
    if (given.get("conditions") or {}).get("device") == predict.DEVICE:
        for line in predict.compare(given["conditions"], rec.inputs[1]):
            rec.warning(line)
        predict.save_given(rec, given)
        return given["model"], True
    return _cost_model(rec, None, setup, w, given, run)[0], False


# --- figures ------------------------------------------------------------------------------------


def _figures(rec) -> None:
    from benchbatch.output.plots.serve import pareto_figure, serve_figure

    rows = rec.rows("serve")
    title = _title(rec)
    opts = rec.meta["options"]
    serve_figure(rows, rec.folder / "serve.png", title, opts["slo_ttft"], opts["slo_tpot"])
    pareto_figure(rows, rec.folder / "pareto.png", title)


def _title(rec) -> str:
    opts = rec.meta["options"]
    served = rec.meta.get("endpoint") or {}
    model = (
        f"{served.get('served_model', 'server')} at {served.get('url', opts.get('endpoint'))}"
        if opts.get("endpoint")
        else "cost model from --step-costs"
        if rec.target is None
        else c.title(rec)
    )
    return (
        f"{model}; {opts['slots']} slots; SLO: TTFT {opts['slo_ttft']:g} s, TPOT "
        f"{opts['slo_tpot'] * 1e3:g} ms (p99)"
    )
