"""`benchbatch occupancy`: static against continuous batching, simulated and on the model."""

from __future__ import annotations

from benchbatch import render
from benchbatch.commands import common as c
from benchbatch.commands.params import command, use
from benchbatch.experiments import OccupancyOptions
from benchbatch.noise import NOISY_P90_OVER_MEDIAN
from benchbatch.options import ModelOptions, RunOptions, WorkloadOptions, record
from benchbatch.run import Recorder

CPU_HINT = "--engine real --requests 64 --slots 8 --max-output 200"
LONG_RUN_S = 600  # over this estimate, the notice suggests a smaller run
RUN_FIELDS = ("device", "dtype", "seed", "threads", "out", "force", "json_out")

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


@command(OccupancyOptions, WorkloadOptions, ModelOptions, use(RunOptions, only=RUN_FIELDS))
def occupancy(
    opts: OccupancyOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """Static vs continuous batching: slot occupancy and total steps on one workload.

    Static batching runs a group of --slots requests until its longest ends (finished slots
    sit idle); continuous batching refills a slot the step after it frees. Defaults are the
    article's: 600 requests, output lengths lognormal (median 70), 32 slots.

    With --engine real both policies also run on the model (default preset: article on CUDA,
    cpu-small on CPU; the model, --device and --dtype options apply only then), and measured
    time is compared with the simulation. A notice estimates the duration first. On a CPU,
    try `benchbatch occupancy --engine real --requests 64 --slots 8 --max-output 200` (about
    a minute with cpu-small on 2 cores).
    """
    opts.check(workload, model)
    requests = _served(workload.draw(run.seed), workload, model, opts.stop_at_eos)
    if opts.engine == "real":
        check = lambda cfg: _check_real(cfg, requests, workload)  # noqa: E731
        rec = c.open_model_run("occupancy", model, run, opts, workload, check=check)
    else:
        rec = Recorder.open("occupancy", run, None, None, record(opts, workload, run))
        c.print_notes(_ignored(model, run))
    with rec:
        sims, rec.meta["summary"] = simulate_part(rec, requests, workload, opts.seeds, run.seed)
        if opts.engine == "real":
            stop = _stop_tokens(model) if opts.stop_at_eos else frozenset()
            _run_real(rec, model, run, requests, workload.slots, sims, stop)
    _report(rec, run.json_out)


def _served(requests, workload: WorkloadOptions, model: ModelOptions, stop_at_eos: bool):
    """The requests as the real engine serves them: real prompts (--prompts), and with
    --stop-at-eos every output capped at --max-output instead of forced to its drawn length."""
    import dataclasses

    cap = workload.max_output if stop_at_eos else None
    if workload.prompts is not None:
        from benchbatch.engines.workload import with_prompts
        from benchbatch.prompts import prompt_token_ids

        return with_prompts(requests, prompt_token_ids(workload.prompts, model.model), cap)
    if cap is not None:
        return [dataclasses.replace(r, output_tokens=cap) for r in requests]
    return requests


def _stop_tokens(model: ModelOptions) -> frozenset[int]:
    from benchbatch.checkpoint import eos_token_ids

    return eos_token_ids(model.model)


def _check_real(cfg, requests, workload: WorkloadOptions) -> None:
    """A prompt alone longer than the model's context is the prompt's fault (or the trace's),
    a prompt plus its output the output's."""
    from benchbatch.engines.engine import check_fits, check_prompt_ids
    from benchbatch.errors import UserError

    check_prompt_ids(cfg.vocab, requests)
    longest = max(r.prompt_tokens for r in requests)
    if longest + 1 > cfg.max_context:
        raise UserError(
            "trace" if workload.trace is not None else "prompt_len",
            f"a {longest:,}-token prompt and its first output token exceed the model's "
            f"--max-context {cfg.max_context:,}",
        )
    check_fits(cfg.max_context, requests)


def _ignored(model: ModelOptions, run: RunOptions) -> str | None:
    given = [f"--{k.replace('_', '-')}" for k in model.overrides()]
    given += [f"--{k}" for k in ("preset", "config") if getattr(model, k) is not None]
    given += ["--dtype"] if run.dtype is not None else []
    return f"{', '.join(given)} only apply with --engine real; ignored" if given else None


# --- simulation --------------------------------------------------------------------------------


def simulate_part(rec, first, workload: WorkloadOptions, seeds: int, seed: int):
    """occupancy.csv (every seed), occupancy_seeds.csv (spread), timeline.csv (run-length
    form) and the figure (first seed), for occupancy and reproduce. Returns the first seed's
    simulations and the article's claim as they measure it."""
    from benchbatch.engines.simulate import TIMELINE_FORM
    from benchbatch.plots.occupancy import occupancy_figure
    from benchbatch.probes import occupancy as probe

    sims = probe.simulate(first, workload.slots)
    rows = probe.occupancy(sims, None if workload.trace else seed)
    for s in range(seed + 1, seed + seeds):
        rows += probe.occupancy(probe.simulate(workload.draw(s), workload.slots), s)
    rec.put("occupancy", rows)
    if seeds > 1:
        rec.put("occupancy_seeds", probe.seed_spread(rows))
    timeline = probe.timeline(sims)
    rec.put("timeline", timeline)
    rec.meta["timeline_form"] = TIMELINE_FORM
    title = probe.title(first, workload.slots)
    occupancy_figure(timeline, rows[:2], rec.folder / "occupancy.png", title)
    return sims, probe.summary(rows[:2])


# --- the real engine ---------------------------------------------------------------------------


def _run_real(rec, model: ModelOptions, run: RunOptions, requests, slots: int, sims, stop) -> None:
    from benchbatch.plots.occupancy import engine_figure
    from benchbatch.probes import occupancy as probe

    net, cfg = model.build(rec.target, run.seed)
    estimate = probe.estimate(net, rec.target.dtype_name, requests, slots, sims)
    rec.meta.update(estimate=estimate, sim_time_basis=probe.SIM_TIME_BASIS)
    if not run.json_out:
        _print_estimate(estimate, sims, rec, slots)
    engine_runs(rec, net, requests, slots, sims, run.seed, stop)
    rows = rec.rows("engine")
    rec.meta["engine_summary"] = probe.engine_summary(rows, sims)
    title = c.title(rec, f"{slots} slots: real engine", noise=c.engine_noise(rows))
    engine_figure(rec.rows("engine_steps"), rows, rec.folder / "engine.png", title)


def engine_runs(rec, net, requests, slots: int, sims, seed: int, stop=frozenset()) -> None:
    """Static, then continuous batching on the model: engine_steps.csv as the steps end,
    engine.csv a row per policy (occupancy and reproduce). With stop tokens the lengths that
    came out go to trace_POLICY.csv, and the run is set beside their own simulation."""
    from benchbatch.probes import occupancy as probe

    runs = [
        probe.EngineRun(p, slots, p, sim_steps=sims[p].total_steps, stop_tokens=stop)
        for p in probe.POLICIES
    ]
    walls: dict[str, float] = {}

    def finished(spec, result) -> None:
        walls[spec.name] = result.wall_s
        sim = sims[spec.name] if not stop else _observed_sim(rec, requests, result, spec.name)
        rec.add("engine", probe.engine_row(result, sim, walls.get("static")))

    steps = probe.engine_steps(net, requests, runs, seed, finished)
    total = sum(r.sim_steps for r in runs)
    rec.record("engine_steps", steps, total=total, label="real engine", stream=True)


def _observed_sim(rec, requests, result, policy: str):
    """The lengths a run stopping at end-of-sequence produced: trace_POLICY.csv, and the
    simulation of exactly those requests (the one the run is compared with)."""
    from benchbatch.engines.engine import observed_requests
    from benchbatch.engines.workload import write_trace
    from benchbatch.probes import occupancy as probe

    observed = observed_requests(requests, result)
    write_trace(rec.folder / f"trace_{policy}.csv", observed)
    rec.meta.setdefault("traces", []).append(f"trace_{policy}.csv")
    return probe.simulate(observed, result.slots)[policy]


def _print_estimate(e: dict, sims: dict, rec, slots: int) -> None:
    cfg, target = rec.cfg, rec.target
    steps = " + ".join(f"{p} {s.total_steps:,}" for p, s in sims.items())
    render.err_console.print(
        f"real engine: {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers) "
        f"{target.dtype_name} on {target.device}, KV cache {e['kv_cache_bytes'] / 2**20:,.0f} "
        f"MiB; {e['simulated_steps']:,} steps to run ({steps}). Estimated duration: about "
        f"{render.duration(e['estimated_s'])} (a decode step of {slots} sequences at context "
        f"{e['decode_context']:,} took {e['decode_step_ms']:.3g} ms here, a "
        f"{e['prefill_tokens']}-token prefill {e['prefill_ms']:.3g} ms).",
        highlight=False,
    )
    if e["estimated_s"] > LONG_RUN_S and target.device.type == "cpu":
        render.note(
            f"that is long; for a quick look on a CPU try `benchbatch occupancy {CPU_HINT}`"
        )


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
        render.print_json(doc)
        return
    first = rows[:2]
    render.table([{**r, "occupancy_pct": 100 * r["occupancy"]} for r in first], SIM_COLUMNS,
                 "simulated")  # fmt: skip
    render.out_console.print(
        f"continuous batching: {summary['speedup']:.2f}x fewer steps "
        f"(static {summary['static_occupancy']:.1%}, "
        f"continuous {summary['continuous_occupancy']:.1%} occupancy)"
    )
    if spread:
        render.table([_spread_display(r) for r in spread], SEED_COLUMNS, "over seeds")
        render.out_console.print(_spread_line(spread))
    if engine:
        shown = [_engine_display(r) for r in engine]
        render.table(shown, ENGINE_COLUMNS, "real engine (sim s: simulated steps x median step)")
        render.table(shown, LATENCY_COLUMNS,
                     "real engine: request latency and time to first token (s)")  # fmt: skip
        line = _engine_line(run.meta.get("engine_summary", {}))
        if line:
            render.out_console.print(line)
        _warn_noisy(engine)
    render.results_line(run.folder)


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
    from benchbatch.probes import occupancy as probe

    policies = probe.noisy(engine)
    if policies:
        render.warning(
            f"step times of {', '.join(policies)} spread wide (p90 over "
            f"{NOISY_P90_OVER_MEDIAN:g}x the median): something else may have used the "
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
