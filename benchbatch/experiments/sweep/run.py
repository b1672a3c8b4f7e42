"""`benchbatch sweep`: batch size against decode throughput and step latency."""

from __future__ import annotations

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions, use
from benchbatch.experiments import common as c
from benchbatch.experiments.sweep.options import SweepOptions
from benchbatch.output import render
from benchbatch.output.render import fmt
from benchbatch.runtime import distributed

# The length distribution the memory ceiling is read for (occupancy's workload options).
LENGTH_FIELDS = ("requests", "median", "sigma", "max_output", "prompt_len", "trace")

# Short headers: nine columns fit an 80-column terminal (the CSV has every column, the KV
# cache's bytes too).
COLUMNS = {
    "context": "ctx",
    "batch": "batch",
    "step_ms": "step ms",
    "spread_ms": "p10-p90",
    "tokens_per_s": "tok/s",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "arithmetic_intensity": "FLOP/B",
    "status": "status",
}


@command(SweepOptions, use(WorkloadOptions, only=LENGTH_FIELDS), ModelOptions, RunOptions)
def sweep(
    opts: SweepOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """Batch size vs decode throughput and step latency: the knee and the memory ceiling.

    A decode step reads every weight once whatever the batch, so batching raises throughput
    while each user's wait (the step time) barely grows, until compute takes over (the knee)
    or the KV cache fills memory. Default model: the article's (12 layers, hidden 2048) on
    CUDA, cpu-small on a CPU.

    The memory ceiling is also given for a length distribution (the workload options, as
    occupancy's): sequences that fit reserving the longest prompt + --max-output against
    paged blocks at the lengths they reach (memory_ceiling.csv), on this device's free
    memory and, with --gpu, on a named GPU's datasheet memory.
    """
    from benchbatch.experiments.sweep import probe
    from benchbatch.runtime import device as devices

    requests = workload.draw(run.seed)  # checks a --trace before any folder is made
    rec = c.open_model_run("sweep", model, run, opts, workload, check=opts.check)
    with rec:
        # Read before the model exists: max_batch subtracts the weights itself. Under
        # torchrun every rank holds a shard: the least free memory of any rank bounds it.
        free_bytes = distributed.least(devices.free_memory_bytes(rec.target.device))
        ceiling = probe.ceilings(rec.cfg, rec.target.dtype_name, opts.context, free_bytes,
                                 rec.target.tp)  # fmt: skip
        memory_ceiling(rec, requests, workload, opts, free_bytes)
        if not run.json_out:
            _print_ceiling(ceiling, free_bytes, rec.target, opts.try_oom)
            for line in ceiling_lines(rec.meta["memory_ceiling"]):
                render.out_console.print(line, highlight=False)
        roof = c.use_ceilings(rec, run)
        ridge, ridge_source = _ridge(rec.target, roof)
        rec.meta.update(
            free_memory_bytes_before_model=free_bytes,
            predicted_max_batch={str(k): v for k, v in ceiling.items()},
            ridge_flop_per_byte=ridge,
            ridge_source=ridge_source,
        )
        net, _ = c.build_model(rec, model, run)
        _estimate(rec, net, opts, ceiling, run)
        rows, summary = measure(rec, net, opts, ceiling, ridge, run)
        if roof is not None:
            rec.meta["ridge_flop_per_byte"], _ = _ridge(rec.target, rec.ceilings)
        rec.meta["knees"] = {str(s["context"]): _knees(s) for s in summary}
        rec.meta["summary"] = summary
        rec.meta["untrusted"] = rec.untrusted("sweep", _row_name)
        if roof and any(r["status"] == "ok" for r in rows):
            c.roofline_plot(rec, rows, "sweep", c.title(rec, "roofline", rows))
    _report(rec, run.json_out)


def _estimate(rec, net, opts: SweepOptions, ceiling: dict, run: RunOptions) -> None:
    """The run's duration first (batches over the memory ceiling are skipped: free), and a
    shorter one when it is long: two batches (the claim compares them) are kept."""
    from benchbatch.experiments.sweep import probe

    batches = opts.batches(rec.target)
    lists = {"batch": batches, "context": opts.context}
    keep = {"batch": min(2, len(batches))}

    def plan_of(ls: dict) -> list:
        steps = probe.plan(ls["context"], ls["batch"])
        return [s for s in steps if opts.try_oom or s.batch <= ceiling[s.context]]

    c.estimate_run(rec, net, run, lists, keep, plan_of)


def measure(rec, net, opts: SweepOptions, ceiling: dict, ridge, run: RunOptions, timing=None):
    """sweep.csv as each step is measured, its summary per context and sweep.png (sweep and
    reproduce, whose `timing` measures a noisy group again). Batches over the memory
    ceiling are skipped unless --try-oom."""
    from benchbatch.experiments.sweep import probe
    from benchbatch.output.plots.sweep import sweep_figure

    dtype = rec.target.dtype_name
    plan = probe.plan(opts.context, opts.batches(rec.target))
    steps = probe.rows(net, dtype, plan, timing or run.timing(), ceiling, opts.try_oom,
                       run.cuda_graphs, opts.kv_layout, opts.block_size)  # fmt: skip
    rows = rec.record("sweep", steps, total=len(plan))
    if rec.ceilings is not None:  # as the rows were placed: raised if a row beat the probe
        ridge = rec.ceilings.ridge
    summary = probe.summarize(rows, net.cfg, dtype, ceiling, ridge, opts.knee_threshold,
                              rec.target.tp)  # fmt: skip
    if any(r["status"] == "ok" for r in rows):  # nothing to draw when all were skipped
        title = c.title(rec, "decode batch sweep", rows)
        sweep_figure(rows, summary, rec.folder / "sweep.png", title)
        c.allreduce_plot(rec, rows, "each decode step's all-reduces")
    return rows, summary


def memory_ceiling(rec, requests, workload: WorkloadOptions, opts, free_bytes: int) -> None:
    """memory_ceiling.csv and its metadata: reserved against paged sequences for the
    workload's lengths on the free memory (and on --gpu's datasheet memory)."""
    from benchbatch.core import kvceiling
    from benchbatch.experiments.occupancy import memory as mprobe

    where = "free GPU memory" if rec.target.device.type == "cuda" else "available RAM"
    memories = [(f"this device ({where})", free_bytes)]
    if opts.gpu is not None:
        peak = opts.datasheet()
        memories.append((f"{peak.name} ({peak.memory_gib:g} GiB datasheet)",
                         kvceiling.datasheet_bytes(peak.memory_gib)))  # fmt: skip
    reserve = mprobe.reserve_output(requests, workload.max_output, workload.trace)
    found = kvceiling.for_workload(rec.cfg, rec.target.dtype_name, requests, reserve,
                                   opts.block_size, memories)  # fmt: skip
    rows = [c.row() for c in found]
    rec.put("memory_ceiling", rows)
    rec.meta["memory_ceiling"] = rows


def ceiling_lines(rows: list[dict]) -> list[str]:
    """One line per memory: sequences reserved at the maximum length against paged."""
    lines = []
    for r in rows:
        gain = f" (x{r['paging_gain']:.3g})" if r["paging_gain"] else ""
        lines.append(
            f"memory ceiling for the workload's lengths on {r['where']}, "
            f"{fmt(r['memory_bytes'] / 2**30)} GiB: {r['reserved_sequences']:,} sequences "
            f"reserving {r['reserved_tokens']:,} tokens each, {r['paged_sequences']:,} paged "
            f"in blocks of {r['block_size']} at the {fmt(r['paged_mean_tokens'])} tokens they "
            f"reach on average{gain}."
        )
    return lines


def _ridge(target, measured) -> tuple[float | None, str]:
    """The ridge point: measured on this device when probed, else a known GPU's datasheet;
    a CPU or an unknown GPU without a probe gets no prediction."""
    from benchbatch.core import peaks
    from benchbatch.runtime import device as devices

    if measured is not None:
        return measured.ridge, (
            f"measured ({measured.tflops_source}, {measured.gbps_source}) {measured.dtype}"
        )
    name = devices.device_name(target.device)
    peak = peaks.lookup(name) if target.device.type == "cuda" else None
    if peak is None:
        return None, f"unknown device ({name})"
    return peak.ridge(target.dtype_name), f"datasheet {peak.name} {target.dtype_name}"


def _knees(s: dict) -> dict:
    keys = ("measured_knee", "knee_threshold", "predicted_knee", "predicted_knee_note")
    return {k: s[k] for k in keys} | {"matmul_knee": s["matmul_knee"]}


def _print_ceiling(ceiling: dict[int, int], free_bytes: int, target, try_oom: bool) -> None:
    where = "free GPU memory" if target.device.type == "cuda" else "available RAM"
    fits = ", ".join(f"context {k:,}: {v:,}" for k, v in ceiling.items())
    over = "tried anyway (--try-oom)" if try_oom else "skipped"
    held = "weights, KV cache and workspace"
    if target.tp > 1:
        where += f" on each of {target.tp} ranks"
        held = "each rank's shard of the weights and KV cache, and workspace"
    render.out_console.print(
        f"memory ceiling from {fmt(free_bytes / 2**30)} GiB {where} ({held}, 10% held "
        f"back): largest batch {fits}; batches above it are {over}."
    )


def _report(rec, json_out: bool) -> None:
    rows, summary = rec.rows("sweep"), rec.meta.get("summary", [])
    if json_out:
        return c.report_json(
            rec, summary=summary, rows=rows, memory_ceiling=rec.meta.get("memory_ceiling")
        )
    tp = any(r.get("tp", 1) > 1 for r in rows)  # KV MiB and all-reduce share: one rank's
    shown = [
        {**r, "kv_cache_mib": r["kv_cache_bytes"] / 2**20,
         "allreduce_pct": 100 * r.get("allreduce_share", float("nan"))}
        for r in rows
    ]  # fmt: skip
    shown, columns = render.with_flop_unit(
        shown, {**COLUMNS, "allreduce_pct": "AR%"} if tp else COLUMNS
    )
    title = "decode step vs batch size (step ms: median of the repeats, each user's wait)"
    render.table(shown, columns, title + (" (per rank)" if tp else ""))
    for s in summary:
        for line in _summary_lines(s):
            render.out_console.print(line)
    render.warn_untrusted(rec.meta["untrusted"])
    render.results_line(rec.folder)


def _row_name(r: dict) -> str:
    return f"ctx {r['context']} batch {r['batch']}"


def _summary_lines(s: dict) -> list[str]:
    head = f"context {s['context']:,}:"
    if "batch_from" not in s:
        return [f"{head} fewer than two batches measured: no claim to check."]
    threshold = f"{s['knee_threshold']:.0%}"
    knee = s["measured_knee"]
    measured = f"none (step never grew over {threshold})"
    if knee is not None:
        measured = f"batch {knee:,} (step x{s['measured_knee_step_ratio']:.2f})"
    lines = [
        f"{head} batch {s['batch_from']:,} -> {s['batch_to']:,}: throughput "
        f"x{s['throughput_ratio']:.1f}, step latency x{s['step_latency_ratio']:.2f}",
        f"  knee (step time > batch {s['batch_from']:,} + {threshold}): {measured}; "
        f"roofline: {s['predicted_knee_note']}",
    ]
    if s["matmul_knee"] is not None:
        lines[-1] += f"; weight matmuls alone reach the ridge at batch {s['matmul_knee']:,}"
    if s["best_batch"] != s["batch_to"]:
        lines.append(
            f"  highest throughput at batch {s['best_batch']:,} "
            f"({fmt(s['best_tokens_per_s'])} tok/s), not at the largest batch"
        )
    return lines
