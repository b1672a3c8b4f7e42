"""`benchbatch ablation`: the Sarathi-Serve ablation (mixed batching, chunked prefill, both)
on one workload, simulated with a step-cost model fitted here and run on the model."""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.fits import check_fits, length_options
from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN
from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import record
from benchbatch.core.prediction import pairs_of, ratio
from benchbatch.experiments.ablation import probe
from benchbatch.experiments.ablation.options import AblationOptions
from benchbatch.output.recorder import Recorder
from benchbatch.runtime.runs import EngineRun, engine_events

CPU_RECOMMENDATION = "benchbatch ablation --engine real --preset cpu-small"


@dataclass(frozen=True)
class Inputs:
    """What open_run checked and measure_run runs on: the requests, the scheduler's
    budgets and the step-cost model fitted to --step-costs (None: fitted in the run)."""

    requests: object
    budgets: probe.Budgets
    given: object = None


def open_run(
    opts: AblationOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> Recorder:
    """Every input checked (the schemes' budgets, the work the simulation would take, the
    step costs, the model's context), then the run folder."""
    from benchbatch.core import saved_calibration

    opts.check(workload)
    budgets = probe.Budgets(workload.slots, opts.max_num_batched_tokens, opts.chunk)
    probe.check_budgets(opts.schemes, budgets, opts.chunk_size is not None)
    requests = workload.draw(run.seed)
    real = opts.engine == "real"
    what = "trace" if workload.trace is not None else "requests"
    work = _named(what, probe.check_work, requests, opts.schemes, budgets, opts.slo, real)
    given = saved_calibration.given(opts.step_costs) if opts.step_costs else None
    rec = _open(opts, workload, model, run, requests, real or given is None, given)
    rec.meta["work"] = work
    rec.inputs = Inputs(requests, budgets, given)
    return rec


def measure_run(
    rec, opts: AblationOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """The cost model (fitted to steps timed now, or to --step-costs), every scheme
    simulated, with --engine real on the model, with --slo the search; the figures."""
    inputs = rec.inputs
    requests, budgets = inputs.requests, inputs.budgets
    net = None
    if rec.target is not None:
        from benchbatch.experiments import common as c

        net = c.build_model(rec, model, run)[0]
    cost = cost_model(rec, net, budgets, requests, inputs.given, run)
    sims = _simulate(rec, requests, opts.schemes, budgets, cost, opts.slo)
    if opts.engine == "real":
        _run_real(rec, net, requests, budgets, sims, opts.slo, run, cost)
    if opts.slo is not None:
        _slo_search(rec, requests, budgets, cost, opts.slo)
    _figures(rec, budgets)


def _open(opts, workload, model, run, requests, need_model: bool, given=None) -> Recorder:
    """A run on the model (the cost fit times steps, --engine real runs them), or, with
    --step-costs and no real engine, a simulation that touches no device."""
    if not need_model:
        from benchbatch.experiments.fields import ignored_options

        rec = Recorder.open("ablation", run, None, None, record(opts, workload, run))
        rec.note(ignored_options(model, run, "with --engine real or without --step-costs"))
        return rec
    from benchbatch.experiments import common as c

    real = opts.engine == "real"
    prompt, output = length_options(workload, requests)
    # The cost fit times steps on the model too: the workload must fit its context.
    check = lambda cfg: check_fits(cfg.max_context, requests, prompt=prompt, output=output)  # noqa: E731
    cache = (lambda cfg: c.engine_cache(workload.slots, requests)) if real else None
    return c.open_model_run("ablation", model, run, opts, workload, check=check, cache=cache,
                            given=given)  # fmt: skip


def _named(option: str, check, *args):
    """check(*args), its UserError naming the option the requests came from."""
    from benchbatch.errors import UserError

    try:
        return check(*args)
    except UserError as e:
        raise UserError(option, e.message) from None


# --- the step-cost model ------------------------------------------------------------------------


def cost_model(rec, net, budgets, requests, given, run: RunOptions, cpu_clock: bool = False,
               layout: dict | None = None, wake: bool = False):  # fmt: skip
    """The step-cost model: with a model, the engine calibrated as it runs (the real engine's
    own steps, engine_calibration, in the cache layout the runs it prices use); or the one
    read from --step-costs (given: a calibration, its conditions checked against this
    run's, or isolated steps' times): step_cost.csv, step_cost.json and the metadata
    (ablation, serve-sweep and occupancy); a reused one's differences from this run, and
    where it came from, kept with them. cpu_clock: also the calibration's fit on the CPU
    clock where this run is on that clock (one thread, a CPU) and the calibration has it,
    else None: (model, cpu model). wake: a serving run's calibration, with the wake runs
    (runtime/calibrate.py: its engine waits idle between requests)."""
    from benchbatch.output import results

    fresh = given is None
    if fresh:
        given = engine_calibration(rec, net, budgets, requests, run.seed, layout, wake)
    differences = [] if fresh else _reused(rec, net, given, layout)
    if not fresh:
        _beyond(rec, given["summary"], budgets.max_num_seqs)
    summary = given["summary"] | {"source": given.get("source", "calibration")}
    if not fresh:  # reused: from where, and what differs from this run
        summary |= {"reused_from": given.get("paths"), "differences": differences}
    if given["rows"]:
        rec.put("step_cost", given["rows"])
    results.write_json(rec.folder / "step_cost.json", summary)
    rec.meta["step_cost"] = summary
    lost = summary.get("per_token_costs_unmeasured") or []
    if lost:
        from benchbatch.output import render

        rec.warning(f"the cost of {' and '.join(lost)} could not be measured (every step "
                    "timed about the same: timing noise hides it), so the simulation prices "
                    f"them at 0: {render.NOISY_HINT}, or a larger model", later=True)  # fmt: skip
    if cpu_clock:  # and the steps' work on the CPU clock, where the calibration has it
        # (a simulation with no model is of the calibration's own run: its CPU clock's fit
        # too; a real run on the wall clock, several threads, cannot be priced by it)
        on_cpu = net is None or (rec.meta.get("threads") or {}).get("clock") == "cpu"
        return given["model"], given.get("cpu_model") if on_cpu else None
    return given["model"]


def _beyond(rec, summary: dict, slots: int) -> None:
    """A reused calibration's largest batch against this run's slots: batches past it are
    priced by extrapolation, said."""
    largest = summary.get("largest_batch")
    if isinstance(largest, int) and 0 < largest < slots:
        rec.warning(
            f"the step-cost calibration ran batches of up to {largest} sequences; this run's "
            f"{slots} slots make larger ones, priced by extrapolating its fit (calibrate "
            "again, dropping --step-costs, to measure them)"
        )


def _reused(rec, net, given: dict, layout: dict | None) -> list[str]:
    """A reused calibration's conditions against this run's: another device refused, every
    other difference a warning (kept in metadata.json's warnings); without a model (--engine
    sim) what it was measured under, said. The notes of its reading (unknown conditions, ...)
    as warnings. Returns the differences."""
    from benchbatch.core import saved_calibration

    for line in given.get("notes") or []:
        rec.warning(line)
    was = given.get("conditions")
    if not was:  # unknown (its notes say so)
        return []
    if net is None:  # (step_cost.json and metadata's step_cost keep these conditions)
        shape = f" (model: {was['model']})" if was.get("model") else ""
        rec.note(
            f"step costs calibrated on {was.get('device')} ({was.get('threads')} threads, "
            f"torch {was.get('torch')}, benchbatch {was.get('benchbatch')}, load "
            f"{was.get('load_class')}){shape}: simulated as that"
        )
        return []
    from benchbatch.runtime.calibrate import conditions

    cores = (rec.meta.get("threads") or {}).get("physical_cores")
    lines = saved_calibration.compare(was, conditions(net, layout, cores))
    for line in lines:
        rec.warning(line)
    return lines


def calibration_runs(net, budgets, requests, layout: dict | None = None,
                     wake: bool = False) -> list:  # fmt: skip
    """runtime/calibrate.py's runs at these budgets and the requests' prompt lengths (what
    engine_calibration serves; their steps counted beforehand: calibrate.total_steps), in
    the engine's cache layout (default contiguous)."""
    from benchbatch.runtime import calibrate as cb

    prompts = [r.prompt_tokens for r in requests]
    plan = cb.plan_for(budgets.max_num_seqs, prompts, budgets.chunk_size,
                       budgets.max_num_batched_tokens, net.cfg.max_context)  # fmt: skip
    return cb.runs(plan, layout, wake)


def engine_calibration(rec, net, budgets, requests, seed: int, layout: dict | None = None,
                       wake: bool = False) -> dict:  # fmt: skip
    """The real engine run on runtime/calibrate.py's workload at these budgets and the
    requests' prompt lengths (calibration_steps.csv as its steps end), fitted by
    core/calibration.py; its conditions (read before it ran) in the summary. The fit is
    said once, with the result (each command's view: calibration_text.step_cost_line)."""
    from benchbatch.core import calibration as cal
    from benchbatch.core.cpu_clock import with_cpu_clock
    from benchbatch.runtime import calibrate as cb

    runs = calibration_runs(net, budgets, requests, layout, wake)
    cores = (rec.meta.get("threads") or {}).get("physical_cores")
    conditions = cb.conditions(net, layout, cores)
    events = cb.events(net, runs, seed)
    label = "calibrating the engine"
    for _ in rec.engine_rows("calibration_steps", events, total=cb.total_steps(runs), label=label):
        pass
    rows = cb.fit_rows(rec.rows("calibration_steps"))
    out = cal.fit(rows, "calibration")
    if (rec.meta.get("threads") or {}).get("clock") == "cpu":  # one thread, one rank, a CPU
        out = with_cpu_clock(out, rows, "calibration")
    out["summary"]["conditions"] = conditions
    out["summary"]["largest_batch"] = max((r["sequences"] for r in rows), default=0)
    return out | {"conditions": conditions, "source": "calibration"}


# --- simulation and the real engine ---------------------------------------------------------------


def _simulate(rec, requests, schemes, budgets, cost, slo) -> dict:
    sims = probe.simulate_all(requests, schemes, budgets, cost)
    for s in sims.values():
        rec.add("ablation", probe.summary_row(s, budgets, slo))
    rec.put("requests", [r for s in sims.values() for r in probe.request_rows(s, requests, slo)])
    rec.put("tbt", [g for s in sims.values() for g in probe.gap_rows(s)])
    return sims


def _run_real(rec, net, requests, budgets, sims, slo, run: RunOptions, cost) -> None:
    """Every scheme on the model, through the real engine's one loop: steps.csv as the steps
    end (beside the cost model's price of each), the real rows of ablation.csv, requests.csv
    and tbt.csv as each scheme ends; prediction.csv, each scheme's run priced as serve-sweep's
    points are (_at_speed)."""
    estimate = sum(s.total_s for s in sims.values())
    rec.say(
        f"real engine: {len(sims)} schemes, {sum(s.steps for s in sims.values()):,} steps; "
        f"the fitted cost model expects about {estimate:.0f} s"
    )
    sim_rows = {r["scheme"]: r for r in rec.rows("ablation")}
    runs = [
        EngineRun(
            scheme,
            budgets.max_num_seqs,
            settings=probe.scheme_settings(scheme, budgets),
            sim_steps=sim.steps,
            key="scheme",
            sim_step_s=probe.step_costs(sim),
        )
        for scheme, sim in sims.items()
    ]
    events = engine_events(net, requests, runs, run.seed)
    total = sum(r.sim_steps for r in runs)
    pairs: list[dict] = []
    for done in rec.engine_rows("steps", events, total=total, label="real engine"):
        scheme, result = done.run.name, done.result
        real = probe.real_scheme(result, sims[scheme])
        row = probe.summary_row(real, budgets, slo)
        rec.add("ablation", probe.real_columns(row, sim_rows[scheme], result))
        rec.put("requests", rec.rows("requests") + probe.request_rows(real, requests, slo))
        rec.put("tbt", rec.rows("tbt") + probe.gap_rows(real))
        pairs += pairs_of(scheme, sim_rows[scheme], row, PREDICTED, scheme=scheme)
    from benchbatch.output.plots.prediction import record as record_prediction

    _at_speed(rec, requests, budgets, cost, pairs, slo)
    wide = probe.noisy(rec.rows("steps"))
    if wide:
        rec.warning(f"real step times of {', '.join(wide)} spread wide against the cost model "
                    f"(p90 over {NOISY_P90_OVER_MEDIAN:g}x the median): another process may "
                    "have used the device meanwhile; see steps.csv", later=True)  # fmt: skip
    title = f"ablation: the real engine beside its simulation; {_title(rec, budgets)}"
    record_prediction(rec, pairs, title)


def _at_speed(rec, requests, budgets, cost, pairs: list[dict], slo) -> None:
    """Each scheme's real steps priced by the cost model (on its clock, the wall's): how far
    it priced them per step kind (metadata's real.step_prices), each scheme's speed (its
    steps' time over their price: real.steps_over_price, a warning past x0.8-1.25), and its
    requests simulated again at that speed beside each pair (steps_over_price,
    simulated_at_speed, ratio_at_speed: known only after the run; not for the total time,
    whose steps' time over their price is about that speed)."""
    from benchbatch.core.pricing import speed
    from benchbatch.experiments.step_prices import priced, say_prices, say_speeds

    steps = list(priced(rec.rows("steps"), cost))
    schemes = list(dict.fromkeys(p["scheme"] for p in pairs))
    speeds = {s: speed([r for r in steps if r["scheme"] == s]) for s in schemes}
    for scheme, factor in speeds.items():
        if not factor == factor:
            continue
        sim = probe.simulate_scheme(requests, scheme, budgets, cost.scaled(factor))
        again = probe.summary_row(sim, budgets, slo)
        for pair in (p for p in pairs if p["scheme"] == scheme and p["metric"] != "total_s"):
            pair |= {"steps_over_price": factor, "simulated_at_speed": again[pair["metric"]],
                     "ratio_at_speed": ratio(again[pair["metric"]], pair["measured"])}  # fmt: skip
    say_prices(rec, steps, key="scheme")
    rec.meta.setdefault("real", {})["steps_over_price"] = speeds
    say_speeds(rec, list(speeds.items()), unit="runs")


# What prediction.csv sets side by side for each scheme (all requests queued at once).
PREDICTED = ("total_s", "ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s", "e2e_p50_s",
             "e2e_p99_s")  # fmt: skip


def _slo_search(rec, requests, budgets, cost, slo) -> None:
    rows = probe.slo_search(requests, budgets, cost, slo)
    rec.put("slo", rows)
    rec.meta["slo"] = {
        "ttft_s": slo.ttft_s,
        "tbt_s": slo.tbt_s,
        "percentile": probe.SLO_PERCENTILE,
        "request_rule": "TTFT <= limit and the request's own P99 TBT <= limit",
        "search_rule": "P99 TTFT over requests and P99 TBT over all gaps within the limits, "
        "scheme 'both' with chunk size = token budget (vLLM), simulated with the fitted cost "
        "model",
        **probe.slo_best(rows),
    }


def _figures(rec, budgets) -> None:
    from benchbatch.output.plots.ablation import latency_figure, slo_figure, tbt_figure

    rows = rec.rows("ablation")
    from benchbatch.experiments.ablation.ordering import ordering

    rec.meta["ordering"] = {s: ordering(rows, s) for s in ("sim", "real")}
    title = _title(rec, budgets)
    tbt_figure(rec.rows("tbt"), rows, rec.folder / "ablation_tbt.png", title)
    latency_figure(
        rec.rows("requests"), rec.rows("tbt"), rows, rec.folder / "ablation_latency.png", title
    )
    if rec.rows("slo"):
        slo = rec.meta["slo"]
        slo_figure(rec.rows("slo"), slo["ttft_s"], slo["tbt_s"], rec.folder / "slo.png", title)


def _title(rec, b) -> str:
    if rec.target is None:
        model = "cost model from --step-costs"
    else:
        from benchbatch.experiments import common as c

        model = c.title(rec)
    return (
        f"{model}; max_num_seqs {b.max_num_seqs}, token budget {b.max_num_batched_tokens}, "
        f"chunk {b.chunk_size}"
    )
