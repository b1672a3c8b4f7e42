"""`benchbatch sweep`: batch size against decode throughput and step latency."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box

from benchbatch import device as devices
from benchbatch import peaks, results
from benchbatch.commands import common as c
from benchbatch.commands.render import fmt, rows_table
from benchbatch.engines.model import Transformer
from benchbatch.errors import UserError
from benchbatch.plots.sweep import sweep_figure
from benchbatch.probes import sweep as probe
from benchbatch.roofline import Ceilings, annotate

# Short headers: nine columns fit an 80-column terminal (the CSV has every column).
COLUMNS = {
    "context": "ctx",
    "batch": "batch",
    "step_ms": "step ms",
    "tokens_per_s": "tok/s",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "arithmetic_intensity": "FLOP/B",
    "kv_cache_mib": "KV MiB",
    "status": "status",
}


def sweep(
    batch: Annotated[
        str, typer.Option(help="Decode batch sizes (sequences per step), comma-separated.")
    ] = "1,8,32,128,256",
    context: Annotated[
        str,
        typer.Option(
            help="Tokens already in each sequence's KV cache, comma-separated: one curve each."
        ),
    ] = "512",
    knee_threshold: Annotated[
        float,
        typer.Option(
            help="The knee is the first batch whose step time exceeds the smallest batch's "
            "by more than this fraction (0.25: 25%)."
        ),
    ] = 0.25,
    try_oom: Annotated[
        bool,
        typer.Option(
            "--try-oom",
            help="Also run batches over the predicted memory ceiling (out of memory is recorded "
            "as oom; on a CPU the operating system may kill the process instead).",
        ),
    ] = False,
    preset: c.PresetOpt = None,
    config: c.ConfigOpt = None,
    hidden: c.HiddenOpt = None,
    layers: c.LayersOpt = None,
    heads: c.HeadsOpt = None,
    kv_heads: c.KvHeadsOpt = None,
    intermediate: c.IntermediateOpt = None,
    vocab: c.VocabOpt = None,
    max_context: c.MaxContextOpt = None,
    seed: c.SeedOpt = 0,
    device: c.DeviceOpt = "auto",
    dtype: c.DtypeOpt = None,
    repeats: c.RepeatsOpt = 5,
    min_time: c.MinTimeOpt = 0.2,
    cuda_graphs: c.CudaGraphsOpt = True,
    out: c.OutOpt = None,
    force: c.ForceOpt = False,
    ceilings: c.CeilingsOpt = None,
    roofline: c.RooflineOpt = True,
    json_out: c.JsonOpt = False,
) -> None:
    """Batch size vs decode throughput and step latency: the knee and the memory ceiling.

    A decode step reads every weight once whatever the batch, so batching raises throughput
    while each user's wait (the step time) barely grows, until compute takes over (the knee)
    or the KV cache fills memory. Defaults are the article's: 12 layers, hidden 2048.
    """
    model_opts = dict(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
        max_context=max_context,
    )
    cfg = c.build_config(preset, config, **model_opts)
    batches = c.parse_int_list(batch, "--batch")
    contexts = c.parse_int_list(context, "--context")
    _check(cfg.max_context, contexts, knee_threshold)
    opts = c.timing_options(repeats, min_time)
    target = c.resolve_target(device, dtype)
    c.check_model_fits(cfg, target, c.model_option(preset, config, model_opts))
    given = c.load_ceilings(ceilings, target)
    folder = results.run_dir(out, "sweep", force)
    # Read before the model exists: max_batch subtracts the weights itself.
    free_bytes = devices.free_memory_bytes(target.device)
    ceiling = probe.ceilings(cfg, target.dtype_name, contexts, free_bytes)
    if not json_out:
        _print_ceiling(ceiling, free_bytes, target, try_oom)
    steps = probe.plan(contexts, batches)
    options = dict(
        batch=batches,
        context=contexts,
        knee_threshold=knee_threshold,
        try_oom=try_oom,
        repeats=repeats,
        min_time=min_time,
        cuda_graphs=cuda_graphs,
        seed=seed,
    )
    run = c.start_run(folder, "sweep", target, cfg, options)
    with c.recording(run, target):
        roof = c.device_ceilings(given, roofline, run, target)
        ridge, ridge_source = _ridge(target, roof)
        run.meta.update(
            free_memory_bytes_before_model=free_bytes,
            predicted_max_batch={str(k): v for k, v in ceiling.items()},
            ridge_flop_per_byte=ridge,
            ridge_source=ridge_source,
        )
        model = Transformer(cfg, target.device, target.dtype, seed)
        with c.progress(json_out) as bar, c.throttle_watch(target) as watch:
            task = bar.add_task("sweep", total=len(steps))
            rows = probe.run(model, target.dtype_name, steps, opts, ceiling, try_oom, cuda_graphs)
            for row in rows:
                row = {**row, "throttled": watch.throttled() and row["status"] == "ok"}
                run.add("sweep", annotate(row, roof) if roof else row)
                bar.advance(task)
        rows = run.rows("sweep")
        summary = probe.summarize(rows, cfg, target.dtype_name, ceiling, ridge, knee_threshold)
        run.meta["knees"] = {str(s["context"]): _knees(s) for s in summary}
        run.meta["summary"] = summary
        run.meta["untrusted"] = c.untrusted(rows, _row_name)
        if any(r["status"] == "ok" for r in rows):  # nothing to draw when all were skipped
            sweep_figure(rows, summary, folder / "sweep.png", _title(cfg, target))
            if roof:
                c.roofline_plot(rows, "sweep", roof, target, folder, _title(cfg, target))
    _report(rows, run, json_out)


def _check(max_context: int, contexts: list[int], knee_threshold: float) -> None:
    if contexts[-1] + 1 > max_context:
        raise UserError(
            "--context", f"{contexts[-1]} + 1 new token exceeds --max-context {max_context}"
        )
    if not knee_threshold > 0:
        raise UserError("--knee-threshold", f"must be more than 0, got {knee_threshold}")


def _ridge(target, measured: Ceilings | None) -> tuple[float | None, str]:
    """The ridge point: measured on this device when probed, else a known GPU's datasheet;
    a CPU or an unknown GPU without a probe gets no prediction."""
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


def _title(cfg, target) -> str:
    return (
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {target.dtype_name}, "
        f"{devices.device_name(target.device)}: decode batch sweep"
    )


def _print_ceiling(ceiling: dict[int, int], free_bytes: int, target, try_oom: bool) -> None:
    where = "free GPU memory" if target.device.type == "cuda" else "available RAM"
    fits = ", ".join(f"context {k:,}: {v:,}" for k, v in ceiling.items())
    over = "tried anyway (--try-oom)" if try_oom else "skipped"
    c.out_console.print(
        f"memory ceiling from {fmt(free_bytes / 2**30)} GiB {where} (weights, KV cache and "
        f"workspace, 10% held back): largest batch {fits}; batches above it are {over}."
    )


def _report(rows: list[dict], run, json_out: bool) -> None:
    summary = run.meta.get("summary", [])
    if json_out:
        c.print_json({"folder": str(run.folder), "summary": summary, "rows": rows})
        return
    shown = [{**r, "kv_cache_mib": r["kv_cache_bytes"] / 2**20} for r in rows]
    table = rows_table(shown, COLUMNS, title="decode step vs batch size")
    table.box, table.pad_edge = box.SIMPLE_HEAD, False
    c.out_console.print(table)
    for s in summary:
        for line in _summary_lines(s):
            c.out_console.print(line)
    c.warn_untrusted(run.meta["untrusted"])
    c.out_console.print(f"results: {run.folder}")


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
