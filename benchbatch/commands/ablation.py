"""`benchbatch ablation`: the Sarathi-Serve ablation (mixed batching, chunked prefill, both)
on one workload, simulated with a step-cost model fitted here and run on the model."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich import box

from benchbatch import device as devices
from benchbatch import results
from benchbatch.commands import common as c
from benchbatch.commands.render import rows_table
from benchbatch.engines.engine import Engine, check_fits
from benchbatch.engines.model import Transformer
from benchbatch.engines.workload import Request
from benchbatch.errors import UserError
from benchbatch.plots.ablation import latency_figure, slo_figure, tbt_figure
from benchbatch.probes import ablation as probe
from benchbatch.timing import TimingOptions

WORKLOAD = "Workload"
BUDGETS = "Scheduler budgets"
SLO_PANEL = "SLO mode"
DEFAULT_CHUNK = 128
CPU_RECOMMENDATION = "benchbatch ablation --engine real --preset cpu-small"

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


class EngineKind(str, Enum):
    sim = "sim"
    real = "real"


def ablation(
    max_num_seqs: Annotated[
        int,
        typer.Option(
            help="Sequences running at once (vLLM's max_num_seqs; also the KV-cache slots).",
            rich_help_panel=BUDGETS,
        ),
    ] = 8,
    max_num_batched_tokens: Annotated[
        int,
        typer.Option(
            help="Tokens per step, decodes and prefill chunks together (vLLM's "
            "max_num_batched_tokens), in the chunked schemes. Mixed batching without chunks "
            "has no budget: a whole prompt rides with the decodes, as in the paper.",
            rich_help_panel=BUDGETS,
        ),
    ] = 256,
    chunk_size: Annotated[
        int | None,
        typer.Option(
            help=f"Largest prefill chunk in the chunked schemes. Default: {DEFAULT_CHUNK}, or "
            "the token budget if smaller.",
            rich_help_panel=BUDGETS,
        ),
    ] = None,
    schemes: Annotated[
        str,
        typer.Option(
            help="Schemes to run, comma-separated: mixed-only (mixed batching, no chunks), "
            "chunks-only (chunked prefill, prefill and decode steps take turns), both "
            "(Sarathi-Serve).",
            rich_help_panel=BUDGETS,
        ),
    ] = ",".join(probe.SCHEMES),
    requests: Annotated[
        int, typer.Option(help="Requests in the generated workload.", rich_help_panel=WORKLOAD)
    ] = 40,
    arrival_rate: Annotated[
        float,
        typer.Option(
            help="Poisson arrivals, requests per scheduler step. The default keeps the slots "
            "busy, so schemes compete for steps.",
            rich_help_panel=WORKLOAD,
        ),
    ] = 0.25,
    prompt_len: Annotated[
        int,
        typer.Option(
            help="Prompt tokens of a request (with --trace: where prompt_tokens is missing).",
            rich_help_panel=WORKLOAD,
        ),
    ] = 64,
    long_prompt_fraction: Annotated[
        float,
        typer.Option(
            help="Fraction of requests with a long prompt (their prefill makes the stalls).",
            rich_help_panel=WORKLOAD,
        ),
    ] = 0.2,
    long_prompt_len: Annotated[
        int, typer.Option(help="Tokens of a long prompt.", rich_help_panel=WORKLOAD)
    ] = 1024,
    median: Annotated[
        float, typer.Option(help="Median output length (tokens).", rich_help_panel=WORKLOAD)
    ] = 40,
    sigma: Annotated[
        float,
        typer.Option(help="Lognormal sigma of the output lengths.", rich_help_panel=WORKLOAD),
    ] = 0.9,
    max_output: Annotated[
        int,
        typer.Option(help="Output lengths are clipped to this (tokens).", rich_help_panel=WORKLOAD),
    ] = 200,
    seed: Annotated[
        int,
        typer.Option(
            help="Seed of the workload (and of the weights and prompts).",
            rich_help_panel=WORKLOAD,
            min=0,
        ),
    ] = 0,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Replay a CSV trace instead: column output_tokens, optional prompt_tokens "
            "and arrival_step.",
            rich_help_panel=WORKLOAD,
        ),
    ] = None,
    engine: Annotated[
        EngineKind,
        typer.Option(
            help="sim: simulate with the fitted step-cost model; real: also run every scheme "
            "on the model and compare.",
            case_sensitive=False,
        ),
    ] = EngineKind.sim,
    step_costs: Annotated[
        list[Path] | None,
        typer.Option(
            "--step-costs",
            help="Fit the step-cost model to these CSVs (phases, sweep, piggyback or an "
            "ablation's step_cost.csv; repeatable) instead of timing steps here first.",
        ),
    ] = None,
    slo_ttft: Annotated[
        float | None,
        typer.Option(
            help="Time-to-first-token limit in seconds (with --slo-tbt): goodput per scheme, "
            "and a search for the largest budgets whose P99s meet both.",
            rich_help_panel=SLO_PANEL,
        ),
    ] = None,
    slo_tbt: Annotated[
        float | None,
        typer.Option(
            help="Time-between-tokens limit in seconds (with --slo-ttft).",
            rich_help_panel=SLO_PANEL,
        ),
    ] = None,
    preset: c.PresetOpt = None,
    config: c.ConfigOpt = None,
    hidden: c.HiddenOpt = None,
    layers: c.LayersOpt = None,
    heads: c.HeadsOpt = None,
    kv_heads: c.KvHeadsOpt = None,
    intermediate: c.IntermediateOpt = None,
    vocab: c.VocabOpt = None,
    max_context: c.MaxContextOpt = None,
    device: c.DeviceOpt = "auto",
    dtype: c.DtypeOpt = None,
    repeats: c.RepeatsOpt = 3,
    min_time: c.MinTimeOpt = 0.1,
    out: c.OutOpt = None,
    force: c.ForceOpt = False,
    json_out: c.JsonOpt = False,
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
    scheme_list = probe.parse_schemes(schemes)
    # Without --chunk-size the chunk is 128 tokens, or the whole budget if that is smaller.
    chunk = min(DEFAULT_CHUNK, max(1, max_num_batched_tokens)) if chunk_size is None else chunk_size
    budgets = probe.Budgets(max_num_seqs, max_num_batched_tokens, chunk)
    probe.check_budgets(scheme_list, budgets, chunk_size is not None)
    slo = _slo(slo_ttft, slo_tbt)
    _check_workload(requests, arrival_rate, trace)
    reqs = probe.workload(
        requests,
        median=median,
        sigma=sigma,
        max_output=max_output,
        prompt_len=prompt_len,
        arrival_rate=arrival_rate,
        long_prompt_fraction=long_prompt_fraction,
        long_prompt_len=long_prompt_len,
        seed=seed,
        trace=trace,
    )
    _check_trace(reqs, trace)
    real = engine is EngineKind.real
    need_model = real or not step_costs
    opts = c.timing_options(repeats, min_time)
    target = c.resolve_target(device, dtype)
    model_opts = dict(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
        max_context=max_context,
    )
    if not need_model:  # nothing runs on the device: no device notice either
        target = devices.Target(torch.device("cpu"), "fp32")
    cfg, notes = _model_config(preset, config, target, model_opts) if need_model else (None, [])
    given = probe.fit(probe.cost_rows_from_csv(step_costs)) if step_costs else None
    if real:
        check_fits(cfg.max_context, reqs)
    if need_model:
        c.check_model_fits(cfg, target, c.model_option(preset, config, model_opts))
    folder = results.run_dir(out, "ablation", force)
    for note in notes:  # every input is checked: a user error stays a single line
        c.err_console.print(f"[yellow]note:[/] {note}")
    options = dict(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        chunk_size=budgets.chunk_size,
        schemes=scheme_list,
        requests=requests,
        arrival_rate=arrival_rate,
        prompt_len=prompt_len,
        long_prompt_fraction=long_prompt_fraction,
        long_prompt_len=long_prompt_len,
        median=median,
        sigma=sigma,
        max_output=max_output,
        seed=seed,
        trace=trace,
        engine=engine.value,
        step_costs=[str(p) for p in step_costs or []],
        slo_ttft=slo_ttft,
        slo_tbt=slo_tbt,
        repeats=repeats,
        min_time=min_time,
    )
    run = c.start_run(folder, "ablation", target, cfg, options)
    with c.recording(run, target):
        model = Transformer(cfg, target.device, target.dtype, seed) if need_model else None
        cost = _cost_model(run, model, budgets, reqs, given, opts, json_out)
        sims = _simulate(run, reqs, scheme_list, budgets, cost, slo)
        if real:
            _run_real(run, model, reqs, budgets, sims, slo, seed, json_out)
        if slo is not None:
            _slo_search(run, reqs, budgets, cost, slo)
        _figures(run, cfg, target, budgets)
    _report(run, json_out)


def _slo(ttft: float | None, tbt: float | None) -> probe.SLO | None:
    if ttft is None and tbt is None:
        return None
    if ttft is None or tbt is None:
        missing = "--slo-ttft" if ttft is None else "--slo-tbt"
        raise UserError(missing, "SLO mode needs both --slo-ttft and --slo-tbt")
    for name, value in (("--slo-ttft", ttft), ("--slo-tbt", tbt)):
        if value <= 0:
            raise UserError(name, f"must be a positive number of seconds, got {value}")
    return probe.SLO(ttft, tbt)


# Every request's every token gap is a row of tbt.csv, per scheme: 5,000 requests take about
# 15 s and 1 GiB, so beyond this the simulation runs for hours and out of memory.
MAX_REQUESTS = 100_000
# Steps: every scheme simulates each one, idle or not (a million take about 35 s).
MAX_ARRIVAL_SPAN = 1_000_000


def _check_workload(requests: int, rate: float, trace: Path | None) -> None:
    """Refuse, before it is generated, a workload too large or too spread out to simulate."""
    if requests > MAX_REQUESTS:
        raise UserError("--requests", f"must be at most {MAX_REQUESTS:,}, got {requests:,}")
    if trace is None and rate > 0 and requests / rate > MAX_ARRIVAL_SPAN:
        raise UserError(
            "--arrival-rate",
            f"{rate:g} spreads {requests:,} arrivals over about {requests / rate:.3g} steps "
            f"(at most {MAX_ARRIVAL_SPAN:,}); raise it",
        )


def _check_trace(reqs: list[Request], trace: Path | None) -> None:
    """The same limits for a trace's requests and arrival steps."""
    if trace is None:
        return
    if len(reqs) > MAX_REQUESTS:
        raise UserError("--trace", f"{trace}: {len(reqs):,} requests (at most {MAX_REQUESTS:,})")
    last = max(r.arrival_step for r in reqs)
    if last > MAX_ARRIVAL_SPAN:
        raise UserError(
            "--trace",
            f"{trace}: arrivals reach step {last:,} (at most {MAX_ARRIVAL_SPAN:,}); "
            "start them earlier",
        )


def _model_config(preset, config, target, overrides: dict):
    """The model's shape, and a note when the device chose the preset."""
    default = "article" if target.device.type == "cuda" else "cpu-small"
    notes = []
    if preset is None and config is None:
        notes.append(
            f"using the {default} preset, the default on "
            f"{'CUDA' if default == 'article' else 'CPU'} (article on CUDA, cpu-small on CPU); "
            "pass --preset or --config to change it"
        )
    return c.build_config(preset, config, default=default, **overrides), notes


# --- the step-cost model ------------------------------------------------------------------------


def _cost_model(run, model, budgets, reqs, given, opts: TimingOptions, json_out: bool):
    """The step-cost model fitted to steps timed now, or the one fitted to --step-costs
    (given): step_cost.csv, step_cost.json and the metadata."""
    if given is None:
        points = probe.fit_points(budgets, reqs, model.cfg.max_context)
        with c.progress(json_out) as bar:
            task = bar.add_task("timing steps for the cost model", total=len(points))
            rows = probe.measure_costs(model, points, opts, lambda: bar.advance(task))
        given = probe.fit(rows, "--repeats")
    cost, fitted = given
    summary = probe.cost_summary(cost, fitted)
    run.put("step_cost", fitted)
    results.write_json(run.folder / "step_cost.json", summary)
    run.meta["step_cost"] = summary
    return cost


# --- simulation and the real engine ---------------------------------------------------------------


def _simulate(run, reqs, schemes, budgets, cost, slo) -> dict[str, probe.SchemeRun]:
    sims = probe.simulate_all(reqs, schemes, budgets, cost)
    for s in sims.values():
        run.add("ablation", probe.summary_row(s, budgets, slo))
    run.put("requests", [r for s in sims.values() for r in probe.request_rows(s, reqs, slo)])
    run.put("tbt", [g for s in sims.values() for g in probe.gap_rows(s)])
    return sims


def _run_real(run, model, reqs, budgets, sims, slo, seed: int, json_out: bool) -> None:
    estimate = sum(s.total_s for s in sims.values())
    c.err_console.print(
        f"real engine: {len(sims)} schemes, {sum(s.steps for s in sims.values()):,} steps; "
        f"the fitted cost model expects about {estimate:.0f} s"
    )
    sim_rows = {r["scheme"]: r for r in run.rows("ablation")}
    steps, request_rows, gaps = [], run.rows("requests"), run.rows("tbt")
    with c.progress(json_out) as bar:
        for scheme, sim in sims.items():
            task = bar.add_task(f"{scheme} (real)", total=sim.steps)
            eng = Engine(
                model,
                "continuous",
                budgets.max_num_seqs,
                seed,
                **probe.scheme_settings(scheme, budgets),
            )
            result = eng.run(reqs, on_step=lambda rec, t=task: bar.advance(t))
            real = probe.real_scheme(result, sim)
            row = probe.summary_row(real, budgets, slo)
            run.add("ablation", probe.real_columns(row, sim_rows[scheme], result))
            steps += probe.step_rows(real, sim)
            request_rows += probe.request_rows(real, reqs, slo)
            gaps += probe.gap_rows(real)
            run.put("steps", steps)
    run.put("requests", request_rows)
    run.put("tbt", gaps)


def _slo_search(run, reqs, budgets, cost, slo: probe.SLO) -> None:
    rows = probe.slo_search(reqs, budgets, cost, slo)
    run.put("slo", rows)
    run.meta["slo"] = {
        "ttft_s": slo.ttft_s,
        "tbt_s": slo.tbt_s,
        "percentile": probe.SLO_PERCENTILE,
        "request_rule": "TTFT <= limit and the request's own P99 TBT <= limit",
        "search_rule": "P99 TTFT over requests and P99 TBT over all gaps within the limits, "
        "scheme 'both' with chunk size = token budget (vLLM), simulated with the fitted cost "
        "model",
        **probe.slo_best(rows),
    }


def _figures(run, cfg, target, budgets: probe.Budgets) -> None:
    rows = run.rows("ablation")
    run.meta["ordering"] = {s: probe.ordering(rows, s) for s in ("sim", "real")}
    title = _title(cfg, target, budgets)
    tbt_figure(run.rows("tbt"), rows, run.folder / "ablation_tbt.png", title)
    latency_figure(
        run.rows("requests"), run.rows("tbt"), rows, run.folder / "ablation_latency.png", title
    )
    if run.rows("slo"):
        slo = run.meta["slo"]
        slo_figure(run.rows("slo"), slo["ttft_s"], slo["tbt_s"], run.folder / "slo.png", title)


def _title(cfg, target, b: probe.Budgets) -> str:
    model = (
        "cost model from --step-costs"
        if cfg is None
        else (
            f"{cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers, {target.dtype_name}, "
            f"{devices.device_name(target.device)})"
        )
    )
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
        c.print_json(doc)
        return
    c.out_console.print(_cost_line(meta["step_cost"]))
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
    _table(rows + paper, COLUMNS, "schemes side by side (paper: Yi-34B)")
    for source, verdict in meta["ordering"].items():
        if verdict is not None:
            c.out_console.print(_ordering_line(source, verdict))
    real = [r for r in rows if r["source"] == "real"]
    if real:
        c.out_console.print(
            "real/simulated total time: "
            + ", ".join(f"{r['scheme']} {r['real_over_sim']:.2f}" for r in real)
        )
    if "slo" in meta:
        _slo_report(rows, meta["slo"])
    wide = probe.noisy(run.rows("steps"))
    if wide:
        c.err_console.print(
            f"[yellow]warning:[/] real step times of {', '.join(wide)} spread wide against the "
            f"cost model (p90 over {probe.NOISY_P90_OVER_MEDIAN:g}x the median): another "
            "process may have used the device meanwhile; see steps.csv"
        )
    c.out_console.print(f"results: {run.folder}")


def _cost_line(s: dict) -> str:
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
        f"{_yes(v['ttft_p50_order'])}); chunking cut the stall {v['stall_shrink']:.1f}x"
    )


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def _slo_report(rows: list[dict], slo: dict) -> None:
    _table(
        rows,
        SLO_COLUMNS,
        f"goodput: TTFT <= {slo['ttft_s']:g} s and own P99 TBT <= {slo['tbt_s']:g} s",
    )
    head = (
        "SLO search (scheme both, chunk = budget, simulated): "
        f"P99 TTFT <= {slo['ttft_s']:g} s and P99 TBT <= {slo['tbt_s']:g} s"
    )
    if not slo["met"]:
        c.out_console.print(f"{head}: no max_num_seqs and token budget on the grid meets it")
        return
    s, b, g = slo["largest_seqs"], slo["largest_budget"], slo["best_goodput"]
    c.out_console.print(
        f"{head}: largest max_num_seqs {s['max_num_seqs']} (token budget "
        f"{s['max_num_batched_tokens']}); largest token budget {b['max_num_batched_tokens']} "
        f"(max_num_seqs {b['max_num_seqs']}); best goodput {g['goodput_rps']:.3g} req/s at "
        f"max_num_seqs {g['max_num_seqs']}, budget {g['max_num_batched_tokens']}"
    )


def _table(rows: list[dict], columns: dict[str, str], title: str) -> None:
    table = rows_table(rows, columns, title=title)
    table.box, table.pad_edge = box.SIMPLE_HEAD, False
    c.out_console.print(table)
