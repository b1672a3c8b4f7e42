"""`benchbatch phases`: prefill against decode steps, timed and accounted."""

from __future__ import annotations

from dataclasses import replace

from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.experiments import ceilings as roofs
from benchbatch.experiments import common as c
from benchbatch.experiments.phases import probe
from benchbatch.experiments.phases.options import PhasesOptions


def open_run(opts: PhasesOptions, model: ModelOptions, run: RunOptions):
    return c.open_model_run("phases", model, run, opts, check=opts.check)


def measure_run(rec, opts: PhasesOptions, model: ModelOptions, run: RunOptions) -> None:
    roofs.use_ceilings(rec, run)
    net, _ = c.build_model(rec, model, run)
    _estimate(rec, net, opts, run)
    rows = measure(rec, net, opts, run)
    name = _namer(rows)
    c.say_allreduce_over_step(rec, rows, name)
    rec.meta["summary"] = probe.summary(rows)
    rec.meta["untrusted"] = rec.untrusted("phases", name)
    if rec.ceilings:
        roofs.roofline_plot(rec, rows, "phases", c.title(rec, "roofline", rows))


def _namer(rows: list[dict]):
    """A row's name in a warning: its label, and a decode's context where the run timed
    several ("decode b=1, decode b=2, decode b=1" named no context)."""
    contexts = {r.get("context") for r in rows if r.get("phase") == "decode"}
    if len(contexts) < 2:
        return lambda r: r["label"]
    return lambda r: (f"{r['label']} at context {r['context']}" if r.get("phase") == "decode"
                      else r["label"])  # fmt: skip


def _estimate(rec, net, opts: PhasesOptions, run: RunOptions) -> None:
    """The run's duration first, and a shorter one when it is long: one prefill and two
    decode batches (the claims' minimum) are kept."""
    lists = {"prefill": opts.prefill, "decode_batch": opts.decode_batch, "context": opts.context}
    keep = {"decode_batch": min(2, len(opts.decode_batch))}
    c.estimate_run(rec, net, run, lists, keep, lambda ls: probe.plan(replace(opts, **ls)))


def measure(rec, net, opts: PhasesOptions, run: RunOptions, timing=None) -> list[dict]:
    """phases.csv as each step is measured, and phases.png (phases and reproduce, whose
    `timing` measures a noisy group again)."""
    from benchbatch.output.plots.phases import phases_figure

    timing = timing or run.timing()
    steps = probe.rows(net, rec.target.dtype_name, opts, timing, run.cuda_graphs)
    total = len(probe.plan(opts))
    rows = rec.record("phases", steps, total=total, expected_s=c.expected_s(rec, total))
    phases_figure(rows, rec.folder / "phases.png", c.title(rec, "prefill vs decode", rows))
    roofs.allreduce_plot(rec, rows, "each step's all-reduces")
    return rows
