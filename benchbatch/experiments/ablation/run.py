"""`benchbatch ablation`: the Sarathi-Serve ablation (mixed batching, chunked prefill, both)
on one workload, simulated with a step-cost model fitted here and run on the model."""

from __future__ import annotations

from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN
from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions, record, use
from benchbatch.experiments import common as c
from benchbatch.experiments.ablation.options import ABLATION_WORKLOAD, AblationOptions
from benchbatch.output import render
from benchbatch.output.recorder import Recorder

CPU_RECOMMENDATION = "benchbatch ablation --engine real --preset cpu-small"
# The ablation times steps for their cost, not against the device's ceilings.
ROOFLINE_FIELDS = ("roofline", "ceilings", "reprobe")

COLUMNS = {
    "label": "scheme",
    "source": "source",
    "ttft_p50_s": "P50 TTFT s",
    "tbt_p99_s": "P99 TBT s",
    "tbt_max_s": "TBT max s",
    "e2e_p50_s": "e2e p50 s",
    "total_s": "total s",
}
SLO_COLUMNS = {
    "label": "scheme",
    "source": "source",
    "slo_met": "met SLO",
    "requests": "of",
    "goodput_rps": "goodput req/s",
}


@command(
    AblationOptions,
    use(WorkloadOptions, skip=("prompts",), defaults=ABLATION_WORKLOAD),
    ModelOptions,
    use(RunOptions, skip=ROOFLINE_FIELDS),
)
def ablation(
    opts: AblationOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """Mixed batching, chunked prefill and both (Sarathi-Serve): P50 TTFT and P99 TBT.

    A long prompt prefilled whole stalls every running decode for a step; chunks bound the
    step, and mixing them into the decodes' steps keeps prompts moving. The paper (Yi-34B):
    P50 TTFT / P99 TBT 0.53 / 0.68 s mixed without chunks, 1.04 / 0.17 s chunks without
    mixing, 0.76 / 0.14 s both. All three run on one workload, simulated with a step-cost
    model fitted to steps timed here (or --step-costs), and with --engine real on the model
    (default preset: article on CUDA, cpu-small on CPU).

    On a CPU: `benchbatch ablation --engine real --preset cpu-small` (the defaults: 40
    requests, a fifth with 1,024-token prompts, 8 sequences, budget 256, chunk 128) takes
    about two minutes on 2 cores.
    """
    from benchbatch.core import stepcost
    from benchbatch.experiments.ablation import probe

    opts.check(workload)
    budgets = probe.Budgets(workload.slots, opts.max_num_batched_tokens, opts.chunk)
    probe.check_budgets(opts.schemes, budgets, opts.chunk_size is not None)
    requests = workload.draw(run.seed)
    real = opts.engine == "real"
    what = "trace" if workload.trace is not None else "requests"
    work = _named(what, probe.check_work, requests, opts.schemes, budgets, opts.slo, real)
    given = stepcost.fit(stepcost.cost_rows_from_csv(opts.step_costs)) if opts.step_costs else None
    rec = _open(opts, workload, model, run, requests, real or given is None)
    rec.meta["work"] = work
    with rec:
        net = c.build_model(rec, model, run)[0] if rec.target is not None else None
        cost = cost_model(rec, net, budgets, requests, given, run)
        sims = _simulate(rec, requests, opts.schemes, budgets, cost, opts.slo)
        if real:
            _run_real(rec, net, requests, budgets, sims, opts.slo, run)
        if opts.slo is not None:
            _slo_search(rec, requests, budgets, cost, opts.slo)
        _figures(rec, budgets)
    _report(rec, run.json_out)


def _open(opts, workload, model, run, requests, need_model: bool) -> Recorder:
    """A run on the model (the cost fit times steps, --engine real runs them), or, with
    --step-costs and no real engine, a simulation that touches no device."""
    if not need_model:
        return Recorder.open("ablation", run, None, None, record(opts, workload, run))
    from benchbatch.runtime.engine import check_fits

    real = opts.engine == "real"
    what = "trace" if workload.trace is not None else "max_output"
    # The cost fit times steps on the model too: the workload must fit its context.
    check = lambda cfg: _named(what, check_fits, cfg.max_context, requests)  # noqa: E731
    cache = (lambda cfg: c.engine_cache(workload.slots, requests)) if real else None
    return c.open_model_run("ablation", model, run, opts, workload, check=check, cache=cache)


def _named(option: str, check, *args):
    """check(*args), its UserError naming the option the requests came from."""
    from benchbatch.errors import UserError

    try:
        return check(*args)
    except UserError as e:
        raise UserError(option, e.message) from None


# --- the step-cost model ------------------------------------------------------------------------


def cost_model(rec, net, budgets, requests, given, run: RunOptions):
    """The step-cost model fitted to steps timed now, or the one fitted to --step-costs
    (given): step_cost.csv, step_cost.json and the metadata."""
    from benchbatch.core import stepcost
    from benchbatch.output import results

    if given is None:
        points = stepcost.fit_points(budgets, requests, net.cfg.max_context)
        rows = stepcost.cost_rows(net, points, run.timing())
        measured = rec.record(
            "step_cost", rows, total=len(points), label="timing steps for the cost model"
        )
        given = stepcost.fit(measured, "repeats")
    cost, fitted = given
    summary = stepcost.cost_summary(cost, fitted)
    rec.put("step_cost", fitted)
    results.write_json(rec.folder / "step_cost.json", summary)
    rec.meta["step_cost"] = summary
    return cost


# --- simulation and the real engine ---------------------------------------------------------------


def _simulate(rec, requests, schemes, budgets, cost, slo) -> dict:
    from benchbatch.experiments.ablation import probe

    sims = probe.simulate_all(requests, schemes, budgets, cost)
    for s in sims.values():
        rec.add("ablation", probe.summary_row(s, budgets, slo))
    rec.put("requests", [r for s in sims.values() for r in probe.request_rows(s, requests, slo)])
    rec.put("tbt", [g for s in sims.values() for g in probe.gap_rows(s)])
    return sims


def _run_real(rec, net, requests, budgets, sims, slo, run: RunOptions) -> None:
    """Every scheme on the model, through the real engine's one loop: steps.csv as the steps
    end (beside the cost model's price of each), the real rows of ablation.csv, requests.csv
    and tbt.csv as each scheme ends."""
    from benchbatch.experiments.ablation import probe
    from benchbatch.experiments.occupancy.probe import EngineRun, engine_steps

    estimate = sum(s.total_s for s in sims.values())
    render.err_console.print(
        f"real engine: {len(sims)} schemes, {sum(s.steps for s in sims.values()):,} steps; "
        f"the fitted cost model expects about {estimate:.0f} s",
        highlight=False,
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

    def finished(spec, result) -> None:
        real = probe.real_scheme(result, sims[spec.name])
        row = probe.summary_row(real, budgets, slo)
        rec.add("ablation", probe.real_columns(row, sim_rows[spec.name], result))
        rec.put("requests", rec.rows("requests") + probe.request_rows(real, requests, slo))
        rec.put("tbt", rec.rows("tbt") + probe.gap_rows(real))

    steps = engine_steps(net, requests, runs, run.seed, finished)
    rec.record("steps", steps, total=sum(r.sim_steps for r in runs), label="real engine",
               stream=True)  # fmt: skip


def _slo_search(rec, requests, budgets, cost, slo) -> None:
    from benchbatch.experiments.ablation import probe

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
    from benchbatch.experiments.ablation import probe
    from benchbatch.output.plots.ablation import latency_figure, slo_figure, tbt_figure

    rows = rec.rows("ablation")
    rec.meta["ordering"] = {s: probe.ordering(rows, s) for s in ("sim", "real")}
    title = _title(rec, budgets)
    tbt_figure(rec.rows("tbt"), rows, rec.folder / "ablation_tbt.png", title)
    latency_figure(
        rec.rows("requests"), rec.rows("tbt"), rows, rec.folder / "ablation_latency.png", title
    )
    if rec.rows("slo"):
        slo = rec.meta["slo"]
        slo_figure(rec.rows("slo"), slo["ttft_s"], slo["tbt_s"], rec.folder / "slo.png", title)


def _title(rec, b) -> str:
    model = "cost model from --step-costs" if rec.target is None else c.title(rec)
    return (
        f"{model}; max_num_seqs {b.max_num_seqs}, token budget {b.max_num_batched_tokens}, "
        f"chunk {b.chunk_size}"
    )


# --- report ---------------------------------------------------------------------------------------


def _report(run, json_out: bool) -> None:
    rows, meta = run.rows("ablation"), run.meta
    if json_out:
        doc = {
            "folder": str(run.folder),
            "step_cost": meta.get("step_cost"),
            "ordering": meta.get("ordering"),
            "rows": rows,
        }
        if "slo" in meta:
            doc["slo"] = meta["slo"]
        render.print_json(doc)
        return
    render.out_console.print(cost_line(meta["step_cost"]))
    lost = meta["step_cost"]["per_token_costs_unmeasured"]
    if lost:
        render.warning(
            f"the cost of {' and '.join(lost)} could not be measured (every step timed about "
            f"the same: timing noise hides it), so the simulation prices them at 0: "
            f"{render.NOISY_HINT}, or a larger model"
        )
    paper = [
        {
            "label": r["label"],
            "source": "paper",
            "ttft_p50_s": r["paper_ttft_p50_s"],
            "tbt_p99_s": r["paper_tbt_p99_s"],
        }
        for r in rows
        if r["source"] == "sim"
    ]
    render.table(rows + paper, COLUMNS, "schemes side by side (paper: Yi-34B)")
    for source, verdict in meta["ordering"].items():
        if verdict is not None:
            render.out_console.print(_ordering_line(source, verdict))
    real = [r for r in rows if r["source"] == "real"]
    if real:
        render.out_console.print(
            "real/simulated total time: "
            + ", ".join(f"{r['scheme']} {r['real_over_sim']:.2f}" for r in real)
        )
    if "slo" in meta:
        _slo_report(rows, meta["slo"])
    from benchbatch.experiments.ablation import probe

    wide = probe.noisy(run.rows("steps"))
    if wide:
        render.warning(
            f"real step times of {', '.join(wide)} spread wide against the cost model (p90 "
            f"over {NOISY_P90_OVER_MEDIAN:g}x the median): another process may have used the "
            "device meanwhile; see steps.csv"
        )
    render.results_line(run.folder)


def cost_line(s: dict) -> str:
    return (
        f"step cost fitted to {s['samples']} steps: {s['base_ms']:.3g} ms + "
        f"{s['per_decode_token_ms']:.3g} ms/decode token + {s['per_prefill_token_ms']:.3g} "
        f"ms/prefill token + {s['per_context_token_us']:.3g} us/context token "
        f"(median error {s['median_abs_error']:.0%}, largest {s['max_abs_error']:.0%}"
        + (f"; {s['left_out_as_noise']} slowed by noise left out" if s["left_out_as_noise"] else "")
        + ")"
    )


def _ordering_line(source: str, v: dict) -> str:
    name = {"sim": "simulated", "real": "real engine"}[source]
    verdict = "same ordering as the paper" if v["as_paper"] else "NOT the paper's ordering"
    return (
        f"{name}: {verdict} (P99 TBT both < chunks-only < mixed-only: "
        f"{_yes(v['tbt_p99_order'])}; P50 TTFT mixed-only < both < chunks-only: "
        f"{_yes(v['ttft_p50_order'])}); {_stall(v['stall_shrink'])}"
    )


def _stall(shrink: float) -> str:
    if shrink != shrink:  # NaN: no request had a second token, so no gap
        return "no gap between tokens to stall"
    return f"chunking cut the stall {shrink:.1f}x"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _slo_report(rows: list[dict], slo: dict) -> None:
    render.table(
        rows,
        SLO_COLUMNS,
        f"goodput: TTFT <= {slo['ttft_s']:g} s and own P99 TBT <= {slo['tbt_s']:g} s",
    )
    head = (
        "SLO search (scheme both, chunk = budget, simulated): "
        f"P99 TTFT <= {slo['ttft_s']:g} s and P99 TBT <= {slo['tbt_s']:g} s"
    )
    if not slo["met"]:
        render.out_console.print(f"{head}: no max_num_seqs and token budget on the grid meets it")
        return
    s, b, g = slo["largest_seqs"], slo["largest_budget"], slo["best_goodput"]
    render.out_console.print(
        f"{head}: largest max_num_seqs {s['max_num_seqs']} (token budget "
        f"{s['max_num_batched_tokens']}); largest token budget {b['max_num_batched_tokens']} "
        f"(max_num_seqs {b['max_num_seqs']}); best goodput {g['goodput_rps']:.3g} req/s at "
        f"max_num_seqs {g['max_num_seqs']}, budget {g['max_num_batched_tokens']}"
    )
