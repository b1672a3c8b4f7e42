"""`benchbatch phases`: prefill against decode steps, timed and accounted."""

from __future__ import annotations

from math import nan
from typing import Annotated

import typer

from benchbatch import results
from benchbatch.commands import common as c
from benchbatch.commands.render import rows_table
from benchbatch.device import device_name
from benchbatch.engines.model import Transformer
from benchbatch.errors import UserError
from benchbatch.plots.phases import phases_figure
from benchbatch.probes import phases as probe
from benchbatch.roofline import annotate

# Short headers so the table fits 80 columns; the CSV holds every column.
COLUMNS = {
    "label": "step",
    "step_ms": "ms",
    "us_per_token": "us/tok",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "arithmetic_intensity": "FLOP/B",
    "mfu_pct": "MFU%",
    "mbu_pct": "MBU%",
    "bound": "bound",
}


def phases(
    prefill: Annotated[
        str, typer.Option(help="Prompt lengths to prefill, comma-separated.")
    ] = "512,2048",
    decode_batch: Annotated[
        str, typer.Option(help="Decode batch sizes (sequences per step), comma-separated.")
    ] = "1,32",
    context: Annotated[
        int, typer.Option(help="Tokens already in each sequence's KV cache when it decodes.")
    ] = 512,
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
    """Prefill vs decode: step time, achieved TFLOP/s, bandwidth and arithmetic intensity.

    Prefill multiplies each weight by a whole prompt (compute-bound); decode by one token per
    sequence (memory-bound). Defaults are the article's: 12 layers, hidden 2048.
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
    prompts = c.parse_int_list(prefill, "--prefill")
    batches = c.parse_int_list(decode_batch, "--decode-batch")
    check_lengths(cfg.max_context, prompts, context)
    opts = c.timing_options(repeats, min_time)
    target = c.resolve_target(device, dtype)
    c.check_model_fits(cfg, target, c.model_option(preset, config, model_opts))
    given = c.load_ceilings(ceilings, target)
    folder = results.run_dir(out, "phases", force)
    model = Transformer(cfg, target.device, target.dtype, seed)
    steps = probe.plan(prompts, batches, context)
    options = dict(
        prefill=prompts,
        decode_batch=batches,
        context=context,
        repeats=repeats,
        min_time=min_time,
        cuda_graphs=cuda_graphs,
        seed=seed,
    )
    run = c.start_run(folder, "phases", target, cfg, options)
    with c.recording(run, target):
        roof = c.device_ceilings(given, roofline, run, target)
        with c.progress(json_out) as bar, c.throttle_watch(target) as watch:
            task = bar.add_task("phases", total=len(steps))
            for row in probe.run(model, target.dtype_name, steps, opts, cuda_graphs):
                row = {**row, "throttled": watch.throttled() and row["status"] == "ok"}
                run.add("phases", annotate(row, roof) if roof else row)
                bar.advance(task)
        rows = run.rows("phases")
        run.meta["summary"] = summary(rows)
        run.meta["untrusted"] = c.untrusted(rows, lambda r: r["label"])
        phases_figure(rows, folder / "phases.png", _title(cfg, target))
        if roof:
            c.roofline_plot(rows, "phases", roof, target, folder, _title(cfg, target))
    _report(rows, run, json_out)


def check_lengths(max_context: int, prompts: list[int], context: int) -> None:
    if context < 0:
        raise UserError("--context", "must be zero or more tokens")
    if context + 1 > max_context:
        raise UserError("--context", f"{context} + 1 new token exceeds --max-context {max_context}")
    if prompts[-1] > max_context:
        raise UserError("--prefill", f"{prompts[-1]} exceeds --max-context {max_context}")


def _title(cfg, target) -> str:
    return (
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {target.dtype_name}, "
        f"{device_name(target.device)}"
    )


def summary(rows: list[dict]) -> dict:
    """The article's two claims as measured: the TFLOP/s gap and the batching factor."""
    ok = [r for r in rows if r["status"] == "ok"]
    pre = [r for r in ok if r["phase"] == "prefill"]
    dec = sorted((r for r in ok if r["phase"] == "decode"), key=lambda r: r["batch"])
    out: dict = {}
    if pre and dec:
        best = max(pre, key=lambda r: r["tflops"])
        out["prefill_over_decode_tflops"] = best["tflops"] / dec[0]["tflops"]
        out["prefill_label"], out["decode_label"] = best["label"], dec[0]["label"]
    if len(dec) > 1:
        out["decode_token_cost_ratio"] = dec[0]["us_per_token"] / dec[-1]["us_per_token"]
        out["decode_batches"] = [dec[0]["batch"], dec[-1]["batch"]]
    return out


def _shown(rows: list[dict]) -> list[dict]:
    """Rows as the terminal shows them: rates in GFLOP/s too, MFU and MBU in percent."""
    return [
        {
            **r,
            "gflops": 1e3 * r["tflops"],
            "mfu_pct": 100 * r.get("mfu", nan),
            "mbu_pct": 100 * r.get("mbu", nan),
        }
        for r in rows
    ]


def _columns(rows: list[dict]) -> dict:
    """TFLOP/s as in the article, or GFLOP/s where every rate is below one (a CPU)."""
    if max((r["tflops"] for r in rows if r["status"] == "ok"), default=0) >= 1:
        return COLUMNS
    return {
        ("gflops" if k == "tflops" else k): ("GFLOP/s" if k == "tflops" else v)
        for k, v in COLUMNS.items()
    }


def _report(rows: list[dict], run, json_out: bool) -> None:
    s = run.meta.get("summary", {})
    if json_out:
        c.print_json({"folder": str(run.folder), "summary": s, "rows": rows})
        return
    table = rows_table(_shown(rows), _columns(rows), title="prefill vs decode")
    c.out_console.print(table)
    failed = [f"{r['label']}: {r['status']}" for r in rows if r["status"] != "ok"]
    if failed:
        c.err_console.print(f"[yellow]not measured:[/] {', '.join(failed)}")
    if "prefill_over_decode_tflops" in s:
        c.out_console.print(
            f"{s['prefill_label']} ran at {s['prefill_over_decode_tflops']:.1f}x the TFLOP/s "
            f"of {s['decode_label']}."
        )
    if "decode_token_cost_ratio" in s:
        b0, b1 = s["decode_batches"]
        c.out_console.print(
            f"Batching {b1} decodes made each token {s['decode_token_cost_ratio']:.1f}x cheaper "
            f"than batch {b0}."
        )
    c.warn_untrusted(run.meta["untrusted"])
    c.out_console.print(f"results: {run.folder}")
