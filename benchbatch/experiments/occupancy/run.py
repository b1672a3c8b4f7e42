"""`benchbatch occupancy`: static against continuous batching, simulated and on the model;
and the memory policies (reserved against paged KV blocks) on one KV budget."""

from __future__ import annotations

import dataclasses

from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN
from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions, record, use
from benchbatch.experiments import common as c
from benchbatch.experiments.occupancy.options import OccupancyOptions
from benchbatch.output import render
from benchbatch.output.recorder import Recorder
from benchbatch.runtime import session

CPU_HINT = "--engine real --requests 64 --slots 8 --max-output 200"
LONG_RUN_S = 600  # over this estimate, the notice suggests a smaller run
RUN_FIELDS = ("device", "dtype", "seed", "threads", "tp", "compile", "out", "force", "json_out")

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
MEMORY_COLUMNS = {  # running sequences, slot occupancy, mean KV memory, preemptions, steps
    "policy": "policy",
    "peak_running": "peak",
    "mean_running": "mean",
    "slot_occupancy_pct": "slots%",
    "reserved": "resv",
    "used": "used",
    "fragmentation_pct": "frag%",
    "preemptions": "preempt",
    "total_steps": "steps",
}
MAX_MEMORY_REQUESTS = 10_000  # the memory policies run step by step: about 20 s at this size
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

    Memory, not compute, limits the batch: on one KV budget (--kv-memory, --block-size) three
    memory policies run side by side: static and continuous batching each reserving prompt +
    --max-output per sequence, and continuous batching with paged blocks (preempting the
    newest request when the blocks run out). memory.csv, memory_timeline.csv, memory.png.

    With --engine real both policies also run on the model (default preset: article on CUDA,
    cpu-small on CPU; --device applies only then), and measured time is compared with the
    simulation; with --kv-memory the memory policies run on it too. A notice estimates the
    duration first. On a CPU, try `benchbatch occupancy --engine real --requests 64 --slots
    8 --max-output 200` (about a minute with cpu-small on 2 cores).
    """
    from benchbatch.experiments.occupancy.probe import check_memory

    opts.check(workload, model)
    requests = _served(workload.draw(run.seed), workload, model, opts.stop_at_eos)
    cost = _step_cost(opts)
    held: dict = {}
    check_memory(len(requests), "trace" if workload.trace is not None else "requests")
    if opts.engine == "real":

        def check(cfg) -> None:
            _check_real(cfg, requests, workload)
            target = session.target_of(run)
            held["memory"] = _memory_setup(opts, workload, requests, cfg, target, True)

        cache = lambda cfg: c.engine_cache(workload.slots, requests)  # noqa: E731
        rec = c.open_model_run("occupancy", model, run, opts, workload, check=check, cache=cache)
    else:
        shape = model.shape("article")
        held["memory"] = _memory_setup(opts, workload, requests, shape, run.dtype or "fp16")
        rec = Recorder.open("occupancy", run, None, None, record(opts, workload, run))
    with rec:
        sims, rec.meta["summary"] = simulate_part(rec, requests, workload, opts.seeds, run.seed)
        memory = memory_part(rec, requests, held["memory"], cost)
        if opts.engine == "real":
            stop = _stop_tokens(model) if opts.stop_at_eos else frozenset()
            layout = {"kv_layout": opts.kv_layout, "block_size": opts.block_size}
            net = _run_real(rec, model, run, requests, workload.slots, sims, stop, layout)
            if opts.kv_memory is not None and memory:
                _memory_engine(rec, net, requests, held["memory"], memory, run.seed)
    _report(rec, run.json_out)


def _step_cost(opts: OccupancyOptions):
    """The step-cost model fitted to --step-costs (checked before any folder is made)."""
    if not opts.step_costs:
        return None
    from benchbatch.core import stepcost

    return stepcost.fit(stepcost.cost_rows_from_csv(opts.step_costs))[0]


def _memory_setup(opts, workload: WorkloadOptions, requests, cfg, target, free: bool = False):
    """The memory policies' shared budget: --kv-memory, else with a model what the device
    has free beside the weights (read before the model is built), else the slot count's
    worth. target: the run's Target, or (simulated) a dtype name."""
    from benchbatch.core import kvceiling
    from benchbatch.experiments.occupancy import memory as mprobe

    dtype = target if isinstance(target, str) else target.dtype_name
    kv_bytes, source = None, ""
    if opts.kv_memory is not None:
        kv_bytes, source = int(opts.kv_memory * mprobe.GIB), f"--kv-memory {opts.kv_memory:g} GiB"
    elif free:
        from benchbatch.runtime import device as devices

        kv_bytes = kvceiling.kv_room(cfg, dtype, devices.free_memory_bytes(target.device))
        source = "what the device has free beside the weights (a tenth held back)"
    reserve = mprobe.reserve_output(requests, workload.max_output, workload.trace)
    bpt = mprobe.bytes_per_token(cfg, dtype)
    setup = mprobe.setup(requests, workload.slots, opts.block_size, reserve, bpt, kv_bytes,
                         source)  # fmt: skip
    return dataclasses.replace(setup, source=f"{setup.source}; {cfg.name} in {dtype}")


def _served(requests, workload: WorkloadOptions, model: ModelOptions, stop_at_eos: bool):
    """The requests as the real engine serves them: real prompts (--prompts), and with
    --stop-at-eos every output capped at --max-output instead of forced to its drawn length."""
    import dataclasses

    cap = workload.max_output if stop_at_eos else None
    if workload.prompts is not None:
        from benchbatch.core.prompts import prompt_token_ids
        from benchbatch.core.workload import with_prompts

        return with_prompts(requests, prompt_token_ids(workload.prompts, model.model), cap)
    if cap is not None:
        return [dataclasses.replace(r, output_tokens=cap) for r in requests]
    return requests


def _stop_tokens(model: ModelOptions) -> frozenset[int]:
    from benchbatch.runtime.checkpoint import eos_token_ids

    return eos_token_ids(model.model)


def _check_real(cfg, requests, workload: WorkloadOptions) -> None:
    """A prompt alone longer than the model's context is the prompt's fault (or the trace's),
    a prompt plus its output the output's."""
    from benchbatch.errors import UserError
    from benchbatch.runtime.engine import check_fits, check_prompt_ids

    check_prompt_ids(cfg.vocab, requests)
    from benchbatch.core.workload import Workload

    longest = int(Workload.of(requests).prompt_tokens.max())
    if longest + 1 > cfg.max_context:
        raise UserError(
            "trace" if workload.trace is not None else "prompt_len",
            f"a {longest:,}-token prompt and its first output token exceed the model's "
            f"--max-context {cfg.max_context:,}",
        )
    check_fits(cfg.max_context, requests)


# --- simulation --------------------------------------------------------------------------------


def simulate_part(rec, first, workload: WorkloadOptions, seeds: int, seed: int):
    """occupancy.csv (every seed), occupancy_seeds.csv (spread), timeline.csv (run-length
    form) and the figure (first seed), for occupancy and reproduce. Returns the first seed's
    simulations and the article's claim as they measure it."""
    from benchbatch.core.simulate import TIMELINE_FORM
    from benchbatch.experiments.occupancy import probe
    from benchbatch.output.plots.occupancy import occupancy_figure

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


def memory_part(rec, requests, setup, cost) -> dict | None:
    """memory.csv, memory_timeline.csv and memory.png: the memory policies on one budget
    (occupancy). Returns their simulations (None when the workload is too large)."""
    from benchbatch.experiments.occupancy import memory as mprobe
    from benchbatch.output.plots.memory import memory_figure

    if len(requests) > MAX_MEMORY_REQUESTS:
        render.note(
            f"memory policies skipped: they simulate step by step, up to "
            f"{MAX_MEMORY_REQUESTS:,} requests (this workload has {len(requests):,})"
        )
        return None
    sims = mprobe.simulate(requests, setup, cost)
    rows = mprobe.rows(sims, setup, requests)
    rec.put("memory", rows)
    timeline = mprobe.timeline(sims, setup)
    rec.put("memory_timeline", timeline)
    rec.meta["memory"] = {"budget": _budget(setup), **mprobe.claim(rows)}
    title = f"{len(requests):,} requests on one KV budget: {_budget(setup)}"
    memory_figure(timeline, rows, rec.folder / "memory.png", title)
    return sims


def _budget(s) -> str:
    size = f"{s.budget_bytes / 2**30:.3g} GiB, " if s.budget_bytes is not None else ""
    return f"{size}{s.blocks:,} blocks of {s.block_size} tokens ({s.source})"


# --- the real engine ---------------------------------------------------------------------------


def _run_real(rec, model: ModelOptions, run: RunOptions, requests, slots: int, sims, stop,
              layout: dict | None = None):  # fmt: skip
    """Static and continuous batching on the model (engine.csv, engine.png); the model."""
    from benchbatch.experiments.occupancy import probe
    from benchbatch.output.plots.occupancy import engine_figure

    net, cfg = c.build_model(rec, model, run)
    estimate = probe.estimate(net, rec.target.dtype_name, requests, slots, sims)
    rec.meta.update(estimate=estimate, sim_time_basis=probe.SIM_TIME_BASIS)
    if not run.json_out:
        _print_estimate(estimate, sims, rec, slots)
    if rec.target.tp > 1:
        _collectives(rec, net, estimate["decode_context"], slots, run)
    engine_runs(rec, net, requests, slots, sims, run.seed, stop, layout)
    rows = rec.rows("engine")
    rec.meta["engine_summary"] = probe.engine_summary(rows, sims)
    title = c.title(rec, f"{slots} slots: real engine", noise=c.engine_noise(rows))
    engine_figure(rec.rows("engine_steps"), rows, rec.folder / "engine.png", title)
    return net


def _collectives(rec, net, context: int, slots: int, run: RunOptions) -> None:
    """Under tensor parallelism: the engine's typical decode step (every slot at the
    estimate's context) timed with its all-reduces on their own, per rank: collectives.csv."""
    from benchbatch.runtime import steps

    step = steps.decode(slots, context)
    row = steps.run_step(net, rec.target.dtype_name, step, run.timing(), run.graphs(rec.target))
    rec.record("collectives", [row], total=1, label="the decode step's all-reduces")
    keys = ("step_ms", "allreduce_ms", "allreduce_share", "batch", "context", "tp")
    rec.meta["collectives"] = {k: row.get(k) for k in keys}


def _memory_engine(rec, net, requests, setup, sims, seed: int) -> None:
    """The memory policies on the model, each in a paged cache of the budget's blocks:
    memory_engine_steps.csv as the steps end, memory_engine.csv a row per policy."""
    from benchbatch.experiments.occupancy import memory as mprobe
    from benchbatch.experiments.occupancy import probe

    runs = mprobe.engine_runs(setup, len(requests), sims)

    def finished(spec, result) -> None:
        rec.add("memory_engine", mprobe.engine_row(spec.name, result, setup, requests))

    steps = probe.engine_steps(net, requests, runs, seed, finished)
    total = sum(r.sim_steps for r in runs)
    rec.record("memory_engine_steps", steps, total=total, label="memory policies, real engine",
               stream=True)  # fmt: skip


def engine_runs(
    rec, net, requests, slots: int, sims, seed: int, stop=frozenset(), layout=None
) -> None:
    """Static, then continuous batching on the model: engine_steps.csv as the steps end,
    engine.csv a row per policy (occupancy and reproduce). With stop tokens the lengths that
    came out go to trace_POLICY.csv, and the run is set beside their own simulation.
    layout: the engine's kv_layout and block_size (default: contiguous)."""
    from benchbatch.experiments.occupancy import probe

    runs = [
        probe.EngineRun(p, slots, p, dict(layout or {}), sims[p].total_steps, stop_tokens=stop)
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
    from benchbatch.core.workload import write_trace
    from benchbatch.experiments.occupancy import probe
    from benchbatch.runtime.engine import observed_requests

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
    summary, memory = run.meta.get("summary", {}), run.rows("memory")
    if json_out:
        doc = {"folder": str(run.folder), "summary": summary, "rows": rows}
        if spread:
            doc["seeds"] = spread
        if memory:
            doc |= {"memory": memory, "memory_summary": run.meta.get("memory", {})}
        if engine:
            doc |= {"engine": engine, "engine_summary": run.meta.get("engine_summary", {})}
        if run.rows("memory_engine"):
            doc["memory_engine"] = run.rows("memory_engine")
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
    if memory:
        _memory_report(memory, run.meta.get("memory", {}), "simulated")
    if run.rows("memory_engine"):
        _memory_report(run.rows("memory_engine"), None, "real engine, paged cache of the budget")
    if engine:
        shown = [_engine_display(r) for r in engine]
        render.table(shown, ENGINE_COLUMNS, "real engine (sim s: simulated steps x median step)")
        render.table(shown, LATENCY_COLUMNS,
                     "real engine: request latency and time to first token (s)")  # fmt: skip
        line = _engine_line(run.meta.get("engine_summary", {}))
        if line:
            render.out_console.print(line)
        _collectives_line(run.meta.get("collectives"))
        _warn_noisy(engine)
    render.results_line(run.folder)


def _memory_report(rows: list[dict], meta: dict | None, how: str) -> None:
    gib = rows[0].get("kv_budget_gib") is not None
    unit = "GiB" if gib else "tokens"
    title = f"memory policies ({how}): running sequences; mean KV memory reserved, used ({unit})"
    render.table([_memory_display(r, gib) for r in rows], MEMORY_COLUMNS, title)
    if rows[0]["time_unit"] == "s":  # priced by a fitted step cost, or measured
        times = ", ".join(f"{r['policy']} {render.fmt(r['total_time'])} s" for r in rows)
        basis = "measured" if "wall_s" in rows[0] else "fitted step cost"
        render.out_console.print(f"time ({basis}): {times}", highlight=False)
    if meta:
        render.out_console.print(
            f"on one KV budget ({meta['budget']}): paged blocks ran "
            f"{meta['paged_mean_running']:.3g} sequences at once on average (peak "
            f"{meta['paged_peak_running']:,}) against {meta['reserve_mean_running']:.3g} "
            f"(peak {meta['reserve_peak_running']:,}) reserving prompt + maximum output; "
            f"{meta['reserve_fragmentation']:.0%} of the reserved memory was never written, "
            f"{meta['paged_fragmentation']:.1%} of the paged; {meta['preemptions']:,} "
            "preemptions",
            highlight=False,
        )


def _memory_display(r: dict, gib: bool) -> dict:
    unit = "_gib" if gib else "_tokens"
    occupancy = r.get("slot_occupancy")
    return {
        **r,
        "slot_occupancy_pct": 100 * occupancy if occupancy is not None else None,
        "reserved": r["kv_reserved_mean" + unit],
        "used": r["kv_used_mean" + unit],
        "fragmentation_pct": 100 * r["fragmentation"],
    }


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


def _collectives_line(c: dict | None) -> None:
    if c and c.get("allreduce_ms") is not None:
        render.out_console.print(
            f"tensor-parallel over {c['tp']} ranks: a decode step of {c['batch']} sequences at "
            f"context {c['context']:,} took {c['step_ms']:.3g} ms, its all-reduces "
            f"{c['allreduce_ms']:.3g} ms on their own ({c['allreduce_share']:.0%}; "
            "collectives.csv)"
        )


def _engine_display(r: dict) -> dict:
    return {**r, "occupancy_pct": 100 * r["occupancy"], "overhead_pct": 100 * r["overhead"]}


def _warn_noisy(engine: list[dict]) -> None:
    from benchbatch.experiments.occupancy import probe

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
