"""What an experiment is: a name, its option groups (data), whether it runs under several
ranks, and its run in two parts: `open` makes the run (every input checked, then the folder
and its metadata.json), `measure` fills it with rows. Neither prints: what a user should
read goes through the run (`rec.note`, `rec.warning`) and the experiment's view
(benchbatch/app/views/NAME.py) shows the finished run.

An experiment registers itself once, as `EXPERIMENT = Experiment(...)` in its package's
__init__.py; the command line makes one command of each (benchbatch/app/registry.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Experiment:
    name: str  # the command: `benchbatch NAME`
    help: str  # --help's text: a first line, then a paragraph or two
    options: tuple[Any, ...]  # options classes, or Use(cls, only=...) for some of a class's fields
    open: Callable[..., Any]  # open(*groups) -> the run (a Recorder), folder made
    measure: Callable[..., None]  # measure(rec, *groups): its rows, into the run
    several_ranks: bool = False  # may run under torchrun (tensor parallelism, all-reduce)
    order: int = 100  # where --help lists it: the three measurements first
