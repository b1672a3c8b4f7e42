"""`benchbatch phases`: prefill against decode steps, timed and accounted."""

from __future__ import annotations

from math import nan

from benchbatch import render
from benchbatch.commands import common as c
from benchbatch.commands.params import command
from benchbatch.experiments import PhasesOptions
from benchbatch.options import ModelOptions, RunOptions

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
        rows = measure(rec, net, opts, run)
        rec.meta["summary"] = probe.summary(rows)
        rec.meta["untrusted"] = rec.untrusted("phases", lambda r: r["label"])
        if rec.ceilings:
            c.roofline_plot(rec, rows, "phases", c.title(rec, "roofline"))
    _report(rec, run.json_out)


def measure(rec, net, opts: PhasesOptions, run: RunOptions) -> list[dict]:
    """phases.csv as each step is measured, and phases.png (phases and reproduce)."""
    from benchbatch.plots.phases import phases_figure
    from benchbatch.probes import phases as probe

    steps = probe.rows(net, rec.target.dtype_name, opts, run.timing(), run.cuda_graphs)
    rows = rec.record("phases", steps, total=len(probe.plan(opts)))
    phases_figure(rows, rec.folder / "phases.png", c.title(rec, "prefill vs decode"))
    c.allreduce_plot(rec, rows, "each step's all-reduces")
    return rows


def _shown(rows: list[dict]) -> list[dict]:
    """Rows as the terminal shows them: rates in GFLOP/s too, MFU and MBU in percent."""
    return [
        {
            **r,
            "gflops": 1e3 * r["tflops"],
            "mfu_pct": 100 * r.get("mfu", nan),
            "mbu_pct": 100 * r.get("mbu", nan),
            "allreduce_pct": 100 * r.get("allreduce_share", nan),
        }
        for r in rows
    ]


def _columns(rows: list[dict]) -> dict:
    """TFLOP/s as in the article, or GFLOP/s where every rate is below one (a CPU); under
    tensor parallelism the all-reduces' share of the step too."""
    columns = dict(COLUMNS)
    if any(r.get("tp", 1) > 1 for r in rows):
        columns["allreduce_pct"] = "AR%"
    if max((r["tflops"] for r in rows if r["status"] == "ok"), default=0) >= 1:
        return columns
    return {
        ("gflops" if k == "tflops" else k): ("GFLOP/s" if k == "tflops" else v)
        for k, v in columns.items()
    }


def _report(rec, json_out: bool) -> None:
    rows, s = rec.rows("phases"), rec.meta.get("summary", {})
    if json_out:
        return c.report_json(rec, summary=s, rows=rows)
    render.table(_shown(rows), _columns(rows), "prefill vs decode")
    failed = [f"{r['label']}: {r['status']}" for r in rows if r["status"] != "ok"]
    if failed:
        render.err_console.print(f"[yellow]not measured:[/] {', '.join(failed)}")
    if "prefill_over_decode_tflops" in s:
        render.out_console.print(
            f"{s['prefill_label']} ran at {s['prefill_over_decode_tflops']:.1f}x the TFLOP/s "
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
