"""One typer command per registered experiment, and the one runner they all go through:
open the run, show the view's header, measure inside the run's `with` (which ends it marked
complete, failed or interrupted), then the view, or with --json one document on stdout.

Experiments are found, not listed: every package under benchbatch/experiments/ whose
__init__ defines EXPERIMENT is a command, shown by benchbatch/app/views/<package>.py. A new
experiment needs no edit here or in the CLI."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from benchbatch import experiments
from benchbatch.app.params import command
from benchbatch.errors import Interrupted
from benchbatch.experiments.base import Experiment
from benchbatch.output import render


def registered() -> list[tuple[Experiment, ModuleType]]:
    """Every experiment with its view, in --help's order."""
    found = []
    for info in pkgutil.iter_modules(experiments.__path__):
        if not info.ispkg:
            continue
        package = importlib.import_module(f"{experiments.__name__}.{info.name}")
        experiment = getattr(package, "EXPERIMENT", None)
        if experiment is not None:
            found.append((experiment, importlib.import_module(f"benchbatch.app.views.{info.name}")))
    return sorted(found, key=lambda pair: (pair[0].order, pair[0].name))


def several_ranks() -> tuple[str, ...]:
    return tuple(e.name for e, _ in registered() if e.several_ranks)


def run(experiment: Experiment, view: ModuleType, groups: tuple) -> None:
    json_out = any(getattr(g, "json_out", False) for g in groups)
    rec = experiment.open(*groups)
    rec.metrics = lambda: view.document(rec)  # result.json's metrics, written as the run ends
    if not json_out and hasattr(view, "before"):
        view.before(rec)
    try:
        with rec:
            experiment.measure(rec, *groups)
    except Interrupted:
        if json_out:  # what was measured, as result.json has it: a script reads that too
            render.print_json({"folder": str(rec.folder), "status": rec.meta.get("status"),
                               **(rec.result_metrics or {})})  # fmt: skip
        raise
    if json_out:  # the same document as result.json's
        document = rec.result_metrics if rec.result_metrics is not None else view.document(rec)
        render.print_json({"folder": str(rec.folder), **document})
    else:
        view.show(rec)


def command_of(experiment: Experiment, view: ModuleType):
    """The typer callback: the experiment's options as flags, then the runner."""

    def callback(*groups) -> None:
        run(experiment, view, groups)

    callback.__doc__ = experiment.help
    callback.__name__ = experiment.name.replace("-", "_")
    return command(*experiment.options)(callback)
