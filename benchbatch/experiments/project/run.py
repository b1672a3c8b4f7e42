"""`benchbatch project`: decode step time and all-reduce share at TP 1, 2, 4, 8 on a machine
you do not have (no torch, nothing measured)."""

from __future__ import annotations

from benchbatch.core.options import ModelOptions, RunOptions, record, use
from benchbatch.experiments.project.options import ProjectOptions
from benchbatch.output import render
from benchbatch.output.recorder import Recorder

DEFAULT_PRESET = "llama3-70b"
COLUMNS = {  # short headers: eleven columns in 80 (project.csv has every column)
    "tp": "GPUs",
    "batch": "batch",
    "context": "ctx",
    "memory_gib": "GiB/GPU",
    "fits_text": "fits",
    "model_ms": "model ms",
    "allreduce_ms": "AR ms",
    "share_pct": "AR %",
    "step_ms": "step ms",
    "tokens_per_s": "tok/s",
    "speedup": "speedup",
}


@command(
    ProjectOptions,
    use(ModelOptions, skip=("model",)),
    use(RunOptions, only=("out", "force", "json_out")),
)
def project(opts: ProjectOptions, model: ModelOptions, run: RunOptions) -> None:
    """Projected decode step on several GPUs: how much goes to the all-reduce, and how many
    GPUs are worth it, before renting them.

    From the accounting (one rank's FLOPs, bytes, weights and KV cache), one GPU's roofline
    (datasheet, or a probe.csv measured on it) and the all-reduce's latency and bus bandwidth
    (half the datasheet's NVLink figure, or measured). Default: llama3-70b on H100 SXM over
    NVLink 4, TP 1, 2, 4, 8. Prints the table with its assumptions; nothing is measured.
    """
    from benchbatch.core import projection, sharding

    cfg = model.shape(DEFAULT_PRESET)
    for tp in opts.tp:
        sharding.check(cfg, tp)
    machine = opts.machine()
    rows = projection.table(cfg, opts.dtype, opts.tp, opts.decode_batch, opts.context, machine)
    rec = Recorder.open("project", run, None, cfg, record(opts, model, run))
    with rec:
        rec.put("project", rows)
        rec.meta["machine"] = machine.to_dict()
        rec.meta["assumptions"] = projection.assumptions(cfg, opts.dtype, machine)
    _report(rec, run.json_out)


def _report(rec, json_out: bool) -> None:
    rows, notes = rec.rows("project"), rec.meta["assumptions"]
    if json_out:
        render.print_json({"folder": str(rec.folder), "assumptions": notes, "rows": rows})
        return
    shown = [
        {
            **r,
            "share_pct": 100 * r["allreduce_share"],
            "fits_text": "yes" if r["fits"] else "no",
            "memory_gib": r["weights_gib"] + r["kv_gib"],
        }
        for r in rows
    ]
    render.table(shown, COLUMNS, "projected decode step, per GPU (weights and KV cache; AR: "
                 "the step's all-reduces; speedup over the fewest GPUs that fit)")  # fmt: skip
    render.out_console.print("assumptions:", highlight=False)
    for line in notes:
        render.out_console.print(f"- {line}", highlight=False)
    render.results_line(rec.folder)
