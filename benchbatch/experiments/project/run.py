"""`benchbatch project`: decode step time and all-reduce share at TP 1, 2, 4, 8 on a machine
you do not have (no torch, nothing measured)."""

from __future__ import annotations

from dataclasses import replace

from benchbatch.core.config import named_shape
from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.core.optkit import record
from benchbatch.experiments.fields import check_context
from benchbatch.experiments.project.options import ProjectOptions
from benchbatch.output.recorder import Recorder

DEFAULT_PRESET = "llama3-70b"


def open_run(opts: ProjectOptions, model: ModelOptions, run: RunOptions) -> Recorder:
    """Every input checked (the shape splits over each TP, the machine reads) and the
    projection made before the folder exists."""
    cfg, _, _ = _projected(opts, model)
    return Recorder.open("project", run, None, cfg, record(opts, model, run))


def measure_run(rec, opts: ProjectOptions, model: ModelOptions, run: RunOptions) -> None:
    """project.csv, project.png, and in metadata the machine and the assumptions the view
    lists."""
    from benchbatch.core import projection
    from benchbatch.output.plots.project import project_figure

    cfg, machine, rows = _projected(opts, model)  # arithmetic: as open_run made it
    if not model.chosen():
        rec.note(f"projecting {cfg.name}: sizes given without --preset or --config start from "
                 f"the {DEFAULT_PRESET} preset, project's default" if model.overrides() else
                 f"projecting the {DEFAULT_PRESET} preset, project's default; pass --preset or "
                 "--config to change it")  # fmt: skip
    foreign = opts.foreign_ceilings()
    if foreign:
        rec.warning(foreign)
    rec.put("project", rows)
    rec.meta["machine"] = machine.to_dict()
    rec.meta["assumptions"] = projection.assumptions(cfg, opts.dtype, machine, opts.tp)
    title = (f"{cfg.name} in {opts.dtype} on {machine.name} (projected from the accounting, "
             f"not measured; all-reduce bus {machine.busbw_gbps:,.0f} GB/s, "
             f"{machine.latency_us:g} us each)")  # fmt: skip
    project_figure(rows, rec.folder / "project.png", title)


def _projected(opts: ProjectOptions, model: ModelOptions):
    """(the model's shape, the machine, the projected rows): pure arithmetic, no torch."""
    from benchbatch.core import projection, sharding

    cfg = model.shape(DEFAULT_PRESET)
    if model.model is None and model.overrides():  # "llama3-70b with hidden 64, heads 4"
        bare = replace(model, **{k: None for k in ModelOptions.SIZES})
        cfg = named_shape(bare.shape(DEFAULT_PRESET), cfg, model.overrides())
    for tp in opts.tp:
        sharding.check(cfg, tp)
    check_context(cfg, opts.context)
    machine = opts.machine()
    rows = projection.table(cfg, opts.dtype, opts.tp, opts.decode_batch, opts.context, machine)
    return cfg, machine, rows
