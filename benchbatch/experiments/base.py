"""What an experiment is: a name, its option groups (data), whether it runs under several
ranks, and its run in two parts: `open` makes the run (every input checked, then the folder
and its metadata.json), `measure` fills it with rows. Neither prints: what a user should
read goes through the run (`rec.note`, `rec.warning`) and the experiment's view
(benchbatch/app/views/NAME.py) shows the finished run.

An experiment registers itself once, as `EXPERIMENT = Experiment(...)` in its package's
__init__.py; the command line makes one command of each (benchbatch/app/registry.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Experiment:
    """runs: the module with `open_run(*groups) -> Recorder` (everything checked, the folder
    made) and `measure_run(rec, *groups)` (the rows, into the run), imported only when the
    command runs: --help and a user error never import torch."""

    name: str  # the command: `benchbatch NAME`
    help: str  # --help's text: a first line, then a paragraph or two
    options: tuple[Any, ...]  # options classes, or Use(cls, only=...) for some of a class's fields
    runs: str  # the module of open_run and measure_run
    several_ranks: bool = False  # may run under torchrun (tensor parallelism, all-reduce)
    order: int = 100  # where --help lists it: the three measurements first

    def open(self, *groups):
        return importlib.import_module(self.runs).open_run(*groups)

    def measure(self, rec, *groups) -> None:
        importlib.import_module(self.runs).measure_run(rec, *groups)
