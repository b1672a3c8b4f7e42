"""What the commands share beyond their options: opening a run that times a model.

Every input is checked before the run folder exists; once it does, metadata.json says what
the run is, and notes (the device's dtype, the default model) are printed, since no user
error can follow any more. Under torchrun every rank checks, and an error on any rank
stops them all (distributed.together); rank 0 makes the folder and writes, the metadata
records every rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from benchbatch import distributed, render
from benchbatch.errors import UserError
from benchbatch.options import INT_MAX, ModelOptions, RunOptions, device_preset, preset_note, record
from benchbatch.run import Recorder


def check_numbers(values: dict, options: dict[str, str]) -> None:
    """No command takes NaN, infinity or an integer past 64 bits: a UserError naming the
    option. values: a command's parsed parameters; options: their names on the command line."""
    for name, value in values.items():
        option = options.get(name, f"--{name.replace('_', '-')}")
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(option, f"must be a finite number, got {value}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX:
            text = str(value)
            text = text if len(text) <= 40 else text[:40] + "..."
            raise UserError(option, f"{text} is too large (at most {INT_MAX:,})")


def open_model_run(
    command: str,
    model: ModelOptions,
    run: RunOptions,
    *options,
    check: Callable | None = None,
    before: Callable | None = None,
) -> Recorder:
    """A run that times the model: device, shape and options checked, the folder made and
    metadata.json written (before the model is built), then before(cfg) (a header) and the
    notes printed."""
    target = run.target()
    rec = distributed.together(lambda: _open(command, model, run, target, options, check))
    join(rec)
    if before is not None:
        before(rec.cfg)
    print_notes(target.notice, preset_note(model, target))
    if run.threads is not None:
        import torch

        torch.set_num_threads(run.threads)
    return rec


def _open(command: str, model: ModelOptions, run: RunOptions, target, options, check):
    from benchbatch import sharding
    from benchbatch.options import check_fits

    cfg = model.shape(device_preset(target))
    if check is not None:
        check(cfg)
    sharding.check(cfg, target.tp)
    check_fits(cfg, target, model.source())
    given = load_ceilings(run, target)
    applied = dataclasses.replace(run, cuda_graphs=run.graphs(target), tp=target.tp)
    rec = Recorder.open(command, applied, target, cfg, record(*options, model, applied))
    rec.given_ceilings = given
    rec.cfg = cfg
    return rec


def join(rec: Recorder) -> None:
    """Under torchrun: every rank takes rank 0's folder, and metadata.json records the
    world (size, backend, tp, each rank's host and device)."""
    world = rec.target.world if rec.target is not None else None
    if world is None or not world.distributed:
        return
    rec.folder = distributed.gather(rec.folder)[0]
    rec.meta["distributed"] = distributed.metadata(rec.target.device)
    rec.write_meta()


def build_model(rec: Recorder, model: ModelOptions, run: RunOptions, target=None):
    """The model and its config (ModelOptions.build), its weight layout in metadata.json and,
    with --compile, its steps through torch.compile: metadata's "compile" holds the mode,
    what was applied (eager after a failure, said in one line) and the compile seconds."""
    target = target or rec.target
    net, cfg = model.build(target, run.seed)
    rec.meta["weight_layout"] = net.layout.name
    if run.compile:
        from benchbatch.engines import compiled

        def fell_back(line: str) -> None:
            render.warning(line)
            rec.write_meta()

        # The state's info dict itself: metadata.json gets its latest compile seconds.
        rec.meta["compile"] = compiled.compile_model(net, run.graphs(target), fell_back).info
    return net, cfg


def print_notes(*notes: str | None) -> None:
    for text in notes:
        if text:
            render.note(text)


def load_ceilings(run: RunOptions, target):
    """Ceilings from a probe.csv given with --ceilings, checked against this run's dtype."""
    if run.ceilings is None:
        return None
    from benchbatch.roofline import ceilings_from_csv

    ceilings = ceilings_from_csv(run.ceilings, option="--ceilings")
    if ceilings.dtype != target.dtype_name:
        raise UserError(
            "--ceilings",
            f"{run.ceilings} was measured in {ceilings.dtype}, this run is {target.dtype_name}",
        )
    return ceilings


def use_ceilings(rec: Recorder, run: RunOptions):
    """The run's one set of ceilings: given with --ceilings, or measured now into probe.csv
    (unless --no-roofline). Every row recorded afterwards is placed against them."""
    ceilings = rec.given_ceilings
    if ceilings is None and run.roofline:
        from benchbatch.probes import ceilings as probes
        from benchbatch.roofline import ceilings_from_rows

        plan = probes.default_plan(rec.target.device)
        rows = rec.record("probe", probes.run(plan, rec.target.device, rec.target.dtype_name,
                                              run.timing()), total=len(plan),
                          label="measuring the device's ceilings")  # fmt: skip
        ceilings = ceilings_from_rows(rows)
        interconnect_ceiling(rec, run)
    if ceilings is not None:
        rec.meta["ceilings"] = ceilings.to_dict()
    rec.ceilings = ceilings
    return ceilings


def interconnect_ceiling(rec: Recorder, run: RunOptions) -> list[dict]:
    """Under torchrun: all-reduce bus bandwidth over message sizes between every rank, into
    probe.csv (the roof a step's all-reduces sit under). Nothing on one process."""
    world = rec.target.world
    if world is None or not world.distributed:
        return []
    from benchbatch.probes import interconnect

    t = rec.target
    sizes = interconnect.plan(t.device)
    rows = interconnect.sweep(world, t.device, t.dtype_name, run.timing(), sizes, run.graphs(t))
    return rec.record("probe", rows, total=len(sizes), label="measuring the all-reduce")


def allreduce_plot(rec: Recorder, rows: list[dict], what: str) -> None:
    """allreduce.png: a tensor-parallel run's step all-reduces under the measured sweep."""
    if rec.target.tp == 1:
        return
    from benchbatch.plots.interconnect import allreduce_figure

    probe = [r for r in rec.rows("probe") if r.get("kind") == "allreduce"]
    allreduce_figure(probe, rows, rec.folder / "allreduce.png", title(rec, what))


def roofline_plot(rec: Recorder, rows: list[dict], source: str, title: str) -> None:
    """roofline.png: the rows against the measured roof (and the datasheet's, if known)."""
    from benchbatch import device, peaks
    from benchbatch.plots.roofline import roofline_figure

    target = rec.target
    sheet = (
        peaks.lookup(device.device_name(target.device)) if target.device.type == "cuda" else None
    )
    tagged = [{**r, "source": source} for r in rows]
    roofline_figure(tagged, rec.ceilings, rec.folder / "roofline.png", sheet, title)


def title(rec: Recorder, what: str = "") -> str:
    """The figures' title: the model, the dtype and the device."""
    from benchbatch.device import device_name

    cfg, t = rec.cfg, rec.target
    ranks = f", tensor-parallel over {t.tp} ranks" if t.tp > 1 else ""
    head = (
        f"{cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, {t.dtype_name}, "
        f"{device_name(t.device)}{ranks}"
    )
    return f"{head}: {what}" if what else head


def report_json(rec: Recorder, **parts) -> None:
    render.print_json({"folder": str(rec.folder), **parts})
