"""`benchbatch occupancy`: static against continuous batching, simulated and on the model."""

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
from benchbatch.config import DTYPE_BYTES
from benchbatch.engines.engine import Engine, StepRecord, cache_len, check_fits
from benchbatch.engines.model import Transformer
from benchbatch.engines.simulate import SimResult, timeline_rows
from benchbatch.engines.workload import Request
from benchbatch.errors import UserError
from benchbatch.plots.occupancy import engine_figure, occupancy_figure
from benchbatch.probes import occupancy as probe

WORKLOAD = "Workload"
BATCHING = "Batching"
CPU_HINT = "--engine real --requests 64 --slots 8 --max-output 200"
LONG_RUN_S = 600  # over this estimate, the notice suggests a smaller run

SIM_COLUMNS = {
    "policy": "policy",
    "total_steps": "steps",
    "useful_slot_steps": "useful slot-steps",
    "idle_slot_steps": "idle slot-steps",
    "occupancy_pct": "occupancy %",
    "speedup_vs_static": "speedup",
}
SEED_COLUMNS = {
    "policy": "policy",
    "seeds": "seeds",
    "steps": "steps mean (min-max)",
    "occupancy": "occupancy % mean (min-max)",
    "speedup": "speedup mean (min-max)",
}
ENGINE_COLUMNS = {
    "policy": "policy",
    "total_steps": "steps",
    "wall_s": "wall s",
    "tokens_per_s": "tok/s",
    "occupancy_pct": "occupancy %",
    "sim_s": "sim s",
    "measured_over_sim": "meas/sim",
    "overhead_pct": "overhead %",
}
LATENCY_COLUMNS = {
    "policy": "policy",
    "e2e_mean_s": "latency mean",
    "e2e_p50_s": "p50",
    "e2e_p99_s": "p99",
    "ttft_mean_s": "TTFT mean",
    "ttft_p50_s": "p50",
    "ttft_p99_s": "p99",
}


class EngineKind(str, Enum):
    sim = "sim"
    real = "real"


def occupancy(
    requests: Annotated[
        int,
        typer.Option(help="Requests in the generated workload.", rich_help_panel=WORKLOAD),
    ] = 600,
    slots: Annotated[
        int,
        typer.Option(
            help="Slots: sequences run at once (KV-cache rows); static groups are this big.",
            rich_help_panel=BATCHING,
        ),
    ] = 32,
    median: Annotated[
        float, typer.Option(help="Median output length (tokens).", rich_help_panel=WORKLOAD)
    ] = 70,
    sigma: Annotated[
        float,
        typer.Option(help="Lognormal sigma of the output lengths.", rich_help_panel=WORKLOAD),
    ] = 0.9,
    max_output: Annotated[
        int,
        typer.Option(help="Output lengths are clipped to this (tokens).", rich_help_panel=WORKLOAD),
    ] = 2000,
    prompt_len: Annotated[
        int,
        typer.Option(
            help="Prompt tokens of every request (with --trace: where prompt_tokens is missing).",
            rich_help_panel=WORKLOAD,
        ),
    ] = 64,
    arrival_rate: Annotated[
        float | None,
        typer.Option(
            help="Poisson arrivals, requests per step. Default: all waiting at step 0.",
            rich_help_panel=WORKLOAD,
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            help="Seed of the output lengths and arrivals (with --engine real also of the "
            "weights and prompts). Seed 3 draws the article's trace step for step.",
            rich_help_panel=WORKLOAD,
            min=0,
        ),
    ] = 0,
    seeds: Annotated[
        int,
        typer.Option(
            help="Simulate seeds --seed .. --seed+K-1 and report mean and spread (min-max); "
            "the figure, timeline and --engine real use --seed.",
            rich_help_panel=WORKLOAD,
        ),
    ] = 1,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Replay a CSV trace instead: column output_tokens, optional prompt_tokens "
            "and arrival_step (replaces --requests, --median, --sigma, --max-output, "
            "--arrival-rate).",
            rich_help_panel=WORKLOAD,
        ),
    ] = None,
    engine: Annotated[
        EngineKind,
        typer.Option(
            help="sim: count steps (milliseconds); real: also run both policies on the model "
            "and time them.",
            case_sensitive=False,
            rich_help_panel=BATCHING,
        ),
    ] = EngineKind.sim,
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
    out: c.OutOpt = None,
    force: c.ForceOpt = False,
    json_out: c.JsonOpt = False,
) -> None:
    """Static vs continuous batching: slot occupancy and total steps on one workload.

    Static batching runs a group of --slots requests until its longest ends (finished slots
    sit idle); continuous batching refills a slot the step after it frees. Defaults are the
    article's: 600 requests, output lengths lognormal (median 70), 32 slots.

    With --engine real both policies also run on the model (default preset: article on CUDA,
    cpu-small on CPU; the model, --device and --dtype options apply only then), and measured
    time is compared with the
    simulation. A notice estimates the duration first. On a CPU, try
    `benchbatch occupancy --engine real --requests 64 --slots 8 --max-output 200`
    (about a minute with cpu-small on 2 cores).
    """
    _check(requests, slots, seeds, trace)
    _check_arrivals(requests, arrival_rate, trace)
    seed_list = list(range(seed, seed + seeds))
    make = dict(
        median=median,
        sigma=sigma,
        max_output=max_output,
        prompt_len=prompt_len,
        arrival_rate=arrival_rate,
        trace=trace,
    )
    first = probe.workload(requests, seed=seed, **make)
    _check_trace_arrivals(first, trace)
    real = engine is EngineKind.real
    model_opts = dict(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
        max_context=max_context,
    )
    if real:
        target = c.resolve_target(device, dtype)
        cfg, notes = _model_config(preset, config, target, model_opts)
        _check_prompts(cfg.max_context, first, trace)
        check_fits(cfg.max_context, first)
        c.check_model_fits(cfg, target, c.model_option(preset, config, model_opts))
    else:
        notes = _ignored(preset, config, dtype, model_opts)
        target, cfg = devices.Target(torch.device("cpu"), "fp32"), None
    folder = results.run_dir(out, "occupancy", force)
    for note in notes:  # every input is checked: a user error stays a single line
        c.err_console.print(f"[yellow]note:[/] {note}")
    options = dict(
        requests=requests,
        slots=slots,
        median=median,
        sigma=sigma,
        max_output=max_output,
        prompt_len=prompt_len,
        arrival_rate=arrival_rate,
        seed=seed,
        seeds=seeds,
        trace=trace,
        engine=engine.value,
    )
    run = c.start_run(folder, "occupancy", target, cfg, options)
    with c.recording(run, target):
        sims = _simulate(run, first, seed_list, slots, requests, make)
        if real:
            _run_real(run, cfg, target, first, slots, seed, sims, json_out)
    _report(run, json_out)


# Beyond these a simulation runs out of memory rather than saying anything new.
MAX_REQUESTS = 10_000_000
MAX_SLOTS = 1_000_000
MAX_SEEDS = 10_000


def _check(requests: int, slots: int, seeds: int, trace: Path | None) -> None:
    for option, value, most in (
        ("--requests", requests, MAX_REQUESTS),
        ("--slots", slots, MAX_SLOTS),
        ("--seeds", seeds, MAX_SEEDS),
    ):
        if value < 1:
            raise UserError(option, f"must be at least 1, got {value}")
        if value > most:
            raise UserError(option, f"must be at most {most:,}, got {value:,}")
    if trace is not None and seeds > 1:
        raise UserError("--seeds", "a --trace is fixed: there is no seed to vary")


MAX_ARRIVAL_SPAN = 10_000_000  # steps: the timeline has a row for each


def _check_arrivals(requests: int, rate: float | None, trace: Path | None) -> None:
    if trace is None and rate is not None and rate > 0 and requests / rate > MAX_ARRIVAL_SPAN:
        raise UserError(
            "--arrival-rate",
            f"{rate:g} spreads {requests:,} arrivals over about {requests / rate:.3g} steps "
            f"(at most {MAX_ARRIVAL_SPAN:,}); raise it",
        )


def _check_trace_arrivals(requests: list[Request], trace: Path | None) -> None:
    """A trace's last arrival bounds the steps simulated, one timeline row each."""
    last = max(r.arrival_step for r in requests)
    if trace is not None and last > MAX_ARRIVAL_SPAN:
        raise UserError(
            "--trace",
            f"{trace}: a request arrives at step {last:,}, beyond the {MAX_ARRIVAL_SPAN:,} "
            "steps a run may span",
        )


def _check_prompts(max_context: int, requests: list[Request], trace: Path | None) -> None:
    """A prompt alone longer than the model's context is the prompt's fault, not the output's."""
    longest = max(r.prompt_tokens for r in requests)
    if longest + 1 > max_context:
        raise UserError(
            "--trace" if trace is not None else "--prompt-len",
            f"a {longest:,}-token prompt and its first output token exceed the model's "
            f"--max-context {max_context:,}",
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


def _ignored(preset, config, dtype, overrides: dict) -> list[str]:
    given = [k for k, v in overrides.items() if v is not None]
    given += [k for k, v in (("preset", preset), ("config", config), ("dtype", dtype)) if v]
    if not given:
        return []
    names = ", ".join(f"--{k.replace('_', '-')}" for k in given)
    return [f"{names} only apply with --engine real; ignored"]


# --- simulation --------------------------------------------------------------------------------


def _simulate(
    run, first: list[Request], seed_list: list[int], slots: int, requests: int, make: dict
) -> dict[str, SimResult]:
    """occupancy.csv (every seed), occupancy_seeds.csv (spread), timeline.csv and the figure
    (first seed). Returns the first seed's simulations."""
    sims = probe.simulate(first, slots)
    trace = make["trace"] is not None
    rows = probe.occupancy(sims, None if trace else seed_list[0])
    for s in seed_list[1:]:
        rows += probe.occupancy(probe.simulate(probe.workload(requests, seed=s, **make), slots), s)
    run.put("occupancy", rows)
    if len(seed_list) > 1:
        run.put("occupancy_seeds", probe.seed_spread(rows))
    timeline = timeline_rows(sims)
    run.put("timeline", timeline)
    run.meta["summary"] = probe.summary(rows[:2])
    occupancy_figure(timeline, rows[:2], run.folder / "occupancy.png", _sim_title(first, slots))
    return sims


def _sim_title(requests: list[Request], slots: int) -> str:
    outputs = sorted(r.output_tokens for r in requests)
    median = outputs[len(outputs) // 2]
    return (
        f"{len(requests):,} requests (output tokens: median {median:,}, max {outputs[-1]:,}), "
        f"{slots} slots: active slots per step"
    )


# --- the real engine ---------------------------------------------------------------------------


def _run_real(run, cfg, target, requests, slots, seed, sims, json_out: bool) -> None:
    model = Transformer(cfg, target.device, target.dtype, seed)
    estimate = probe.estimate(model, requests, slots, sims)
    per_token = 2 * cfg.layers * cfg.kv_dim * DTYPE_BYTES[target.dtype_name]  # keys and values
    estimate["kv_cache_bytes"] = per_token * slots * cache_len(requests)
    run.meta["estimate"] = estimate
    run.meta["sim_time_basis"] = probe.SIM_TIME_BASIS
    _print_estimate(estimate, sims, cfg, target, slots)
    steps: list[dict] = []
    static_wall = None
    with c.progress(json_out) as bar:
        for policy in probe.POLICIES:
            task = bar.add_task(f"{policy} (real)", total=sims[policy].total_steps)
            eng = Engine(model, policy, slots, seed)
            try:
                result = eng.run(requests, on_step=lambda rec, t=task: _advance(bar, t, rec))
            finally:  # interrupted or not, every measured step reaches the disk
                run.put("engine_steps", steps + probe.step_rows(eng.result))
            steps += probe.step_rows(result)
            if policy == "static":
                static_wall = result.wall_s
            run.add("engine", probe.engine_row(result, sims[policy], static_wall))
    rows = run.rows("engine")
    run.meta["engine_summary"] = probe.engine_summary(rows, sims)
    engine_figure(steps, rows, run.folder / "engine.png", _engine_title(cfg, target, slots))


def _advance(bar, task, record: StepRecord) -> None:
    bar.advance(task)


def _engine_title(cfg, target, slots: int) -> str:
    return (
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {target.dtype_name}, "
        f"{devices.device_name(target.device)}, {slots} slots: real engine"
    )


def _print_estimate(e: dict, sims: dict[str, SimResult], cfg, target, slots: int) -> None:
    steps = " + ".join(f"{p} {s.total_steps:,}" for p, s in sims.items())
    c.err_console.print(
        f"real engine: {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers) "
        f"{target.dtype_name} on {target.device}, KV cache {e['kv_cache_bytes'] / 2**20:,.0f} "
        f"MiB; {e['simulated_steps']:,} steps to run ({steps}). Estimated duration: about "
        f"{_duration(e['estimated_s'])} (a decode step of {slots} sequences at context "
        f"{e['decode_context']:,} took {e['decode_step_ms']:.3g} ms here, a "
        f"{e['prefill_tokens']}-token prefill {e['prefill_ms']:.3g} ms)."
    )
    if e["estimated_s"] > LONG_RUN_S and target.device.type == "cpu":
        c.err_console.print(
            f"[yellow]note:[/] that is long; for a quick look on a CPU try "
            f"`benchbatch occupancy {CPU_HINT}`"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --- report ------------------------------------------------------------------------------------


def _report(run, json_out: bool) -> None:
    rows, spread, engine = run.rows("occupancy"), run.rows("occupancy_seeds"), run.rows("engine")
    summary = run.meta.get("summary", {})
    if json_out:
        doc = {"folder": str(run.folder), "summary": summary, "rows": rows}
        if spread:
            doc["seeds"] = spread
        if engine:
            doc |= {"engine": engine, "engine_summary": run.meta.get("engine_summary", {})}
        c.print_json(doc)
        return
    first = rows[:2]
    _table([{**r, "occupancy_pct": 100 * r["occupancy"]} for r in first], SIM_COLUMNS, "simulated")
    c.out_console.print(
        f"continuous batching: {summary['speedup']:.2f}x fewer steps "
        f"(static {summary['static_occupancy']:.1%}, "
        f"continuous {summary['continuous_occupancy']:.1%} occupancy)"
    )
    if spread:
        _table([_spread_display(r) for r in spread], SEED_COLUMNS, "over seeds")
        c.out_console.print(_spread_line(spread))
    if engine:
        shown = [_engine_display(r) for r in engine]
        _table(shown, ENGINE_COLUMNS, "real engine (sim s: simulated steps x median step)")
        _table(shown, LATENCY_COLUMNS, "real engine: request latency and time to first token (s)")
        line = _engine_line(run.meta.get("engine_summary", {}))
        if line:
            c.out_console.print(line)
        _warn_noisy(engine)
    c.out_console.print(f"results: {run.folder}")


def _table(rows: list[dict], columns: dict[str, str], title: str) -> None:
    table = rows_table(rows, columns, title=title)
    table.box, table.pad_edge = box.SIMPLE_HEAD, False
    c.out_console.print(table)


def _spread_display(r: dict) -> dict:
    def span(key: str, scale: float = 1.0, digits: int = 0) -> str:
        lo, mean, hi = (scale * r[f"{key}_{s}"] for s in ("min", "mean", "max"))
        return f"{mean:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"

    return {
        "policy": r["policy"],
        "seeds": r["seeds"],
        "steps": span("total_steps"),
        "occupancy": span("occupancy", 100, 1),
        "speedup": span("speedup_vs_static", 1, 2),
    }


def _spread_line(spread: list[dict]) -> str:
    by = {r["policy"]: r for r in spread}
    s, cont = by["static"], by["continuous"]
    return (
        f"over {s['seeds']} seeds: continuous batching {cont['speedup_vs_static_mean']:.2f}x "
        f"fewer steps ({cont['speedup_vs_static_min']:.2f}-{cont['speedup_vs_static_max']:.2f}x); "
        f"static {s['occupancy_mean']:.1%} ({s['occupancy_min']:.1%}-{s['occupancy_max']:.1%}), "
        f"continuous {cont['occupancy_mean']:.1%} "
        f"({cont['occupancy_min']:.1%}-{cont['occupancy_max']:.1%}) occupancy"
    )


def _engine_display(r: dict) -> dict:
    return {**r, "occupancy_pct": 100 * r["occupancy"], "overhead_pct": 100 * r["overhead"]}


def _warn_noisy(engine: list[dict]) -> None:
    policies = probe.noisy(engine)
    if policies:
        c.err_console.print(
            f"[yellow]warning:[/] step times of {', '.join(policies)} spread wide (p90 over "
            f"{probe.NOISY_P90_OVER_MEDIAN:g}x the median): something else may have used the "
            "device meanwhile, which inflates wall time and measured/simulated; see "
            "engine_steps.csv"
        )


def _engine_line(s: dict) -> str | None:
    if not s:
        return None
    return (
        f"real engine: continuous batching {s['wall_speedup']:.2f}x faster in wall time "
        f"(simulated: {s['sim_speedup']:.2f}x fewer steps); measured/simulated time "
        f"static {s['static_measured_over_sim']:.2f}, continuous "
        f"{s['continuous_measured_over_sim']:.2f}; scheduling overhead "
        f"{s['continuous_overhead']:.1%} of a continuous step"
    )
