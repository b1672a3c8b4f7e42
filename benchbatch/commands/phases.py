"""`benchbatch phases`: prefill against decode steps, timed and accounted."""

from __future__ import annotations

from math import nan

from benchbatch import render
from benchbatch.commands import common as c
from benchbatch.commands.params import command
from benchbatch.experiments import PhasesOptions
from benchbatch.options import ModelOptions, RunOptions

# Short headers so the table fits 80 columns (MBU stands for GB/s); the CSV has every column.
COLUMNS = {
    "label": "step",
    "step_ms": "ms",
    "spread_ms": "p10-p90",
    "us_per_token": "us/tok",
    "tflops": "TFLOP/s",
    "arithmetic_intensity": "FLOP/B",
    "mfu_pct": "MFU %",
    "mbu_pct": "MBU %",
    "bound": "bound",
}


@command(PhasesOptions, ModelOptions, RunOptions)
def phases(opts: PhasesOptions, model: ModelOptions, run: RunOptions) -> None:
    """Prefill vs decode: step time, achieved TFLOP/s, bandwidth and arithmetic intensity.

    Prefill multiplies each weight by a whole prompt (compute-bound); decode by one token per
    sequence (memory-bound). Default model: the article's (12 layers, hidden 2048) on CUDA,
    cpu-small on a CPU.
    """
    from benchbatch.probes import phases as probe

    rec = c.open_model_run("phases", model, run, opts, check=opts.check)
    with rec:
        c.use_ceilings(rec, run)
        net, _ = c.build_model(rec, model, run)
        _estimate(rec, net, opts, run)
        rows = measure(rec, net, opts, run)
        rec.meta["summary"] = probe.summary(rows)
        rec.meta["untrusted"] = rec.untrusted("phases", lambda r: r["label"])
        if rec.ceilings:
            c.roofline_plot(rec, rows, "phases", c.title(rec, "roofline", rows))
    _report(rec, run.json_out)


def _estimate(rec, net, opts: PhasesOptions, run: RunOptions) -> None:
    """The run's duration first, and a shorter one when it is long: one prefill and two
    decode batches (the claims' minimum) are kept."""
    from dataclasses import replace

    from benchbatch.probes import phases as probe

    lists = {"prefill": opts.prefill, "decode_batch": opts.decode_batch, "context": opts.context}
    keep = {"decode_batch": min(2, len(opts.decode_batch))}
    c.estimate_run(rec, net, run, lists, keep, lambda ls: probe.plan(replace(opts, **ls)))


def measure(rec, net, opts: PhasesOptions, run: RunOptions, timing=None) -> list[dict]:
    """phases.csv as each step is measured, and phases.png (phases and reproduce, whose
    `timing` measures a noisy group again)."""
    from benchbatch.plots.phases import phases_figure
    from benchbatch.probes import phases as probe

    timing = timing or run.timing()
    steps = probe.rows(net, rec.target.dtype_name, opts, timing, run.cuda_graphs)
    rows = rec.record("phases", steps, total=len(probe.plan(opts)))
    phases_figure(rows, rec.folder / "phases.png", c.title(rec, "prefill vs decode", rows))
    c.allreduce_plot(rec, rows, "each step's all-reduces")
    return rows


def _shown(rows: list[dict]) -> list[dict]:
    """Rows as the terminal shows them: MFU and MBU in percent (the CSV keeps fractions)."""
    return [
        {
            **r,
            "mfu_pct": 100 * r.get("mfu", nan),
            "mbu_pct": 100 * r.get("mbu", nan),
            "allreduce_pct": 100 * r.get("allreduce_share", nan),
        }
        for r in rows
    ]


def _columns(rows: list[dict]) -> dict:
    """Under tensor parallelism the all-reduces' share of the step too."""
    if any(r.get("tp", 1) > 1 for r in rows):
        return {**COLUMNS, "allreduce_pct": "AR%"}
    return COLUMNS


def _report(rec, json_out: bool) -> None:
    rows, s = rec.rows("phases"), rec.meta.get("summary", {})
    if json_out:
        return c.report_json(rec, summary=s, rows=rows)
    shown, columns = render.with_flop_unit(_shown(rows), _columns(rows))
    render.table(shown, columns, "prefill vs decode (ms: median of the repeats)")
    failed = [f"{r['label']}: {r['status']}" for r in rows if r["status"] != "ok"]
    if failed:
        render.labelled("not measured:", ", ".join(failed))
    if "prefill_over_decode_tflops" in s:
        render.out_console.print(
            f"{s['prefill_label']} ran at {s['prefill_over_decode_tflops']:.1f}x the FLOP/s "
            f"of {s['decode_label']}."
        )
    if "decode_token_cost_ratio" in s:
        b0, b1 = s["decode_batches"]
        render.out_console.print(
            f"Batching {b1} decodes made each token {s['decode_token_cost_ratio']:.1f}x cheaper "
            f"than batch {b0}."
        )
    render.warn_untrusted(rec.meta["untrusted"])
    render.results_line(rec.folder)
