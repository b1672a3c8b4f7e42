"""Progress of a long run on stderr: a live bar on a terminal, plain log lines elsewhere.

One live display serves every task of a process (rich allows one at a time), so a task may
open while another runs. When stderr is not a terminal (a log file, CI, a pipe) a line is
printed at most every LOG_EVERY_S seconds, and one at the end of a task that took longer.
"""

from __future__ import annotations

import contextlib
import time

from rich import progress as rp

from benchbatch.output.render import err_console

LOG_EVERY_S = 10.0


class _Null:
    def advance(self, n: int = 1) -> None:
        pass


class _Bar:
    def __init__(self, live: rp.Progress, label: str, total: int | None):
        self._live, self._id = live, live.add_task(label, total=total)

    def advance(self, n: int = 1) -> None:
        self._live.advance(self._id, n)


class _Log:
    """Log lines: 'phases: 3/8 done, 41 s'."""

    def __init__(self, label: str, total: int | None):
        self.label, self.total, self.done = label, total, 0
        self.start = self.last = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done += n
        if time.monotonic() - self.last >= LOG_EVERY_S:
            self.line()

    def line(self, end: bool = False) -> None:
        self.last = time.monotonic()
        of = f"/{self.total:,}" if self.total else ""
        state = "finished" if end else "done"
        err_console.print(
            f"{self.label}: {self.done:,}{of} {state}, {self.last - self.start:.0f} s",
            highlight=False,
            markup=False,
        )


class Progress:
    _live: rp.Progress | None = None
    _open = 0

    @classmethod
    @contextlib.contextmanager
    def task(cls, label: str, total: int | None, quiet: bool = False):
        if quiet:
            yield _Null()
        elif not err_console.is_terminal:
            log = _Log(label, total)
            yield log
            if time.monotonic() - log.start >= LOG_EVERY_S:
                log.line(end=True)
        else:
            with cls._shared() as live:
                bar = _Bar(live, label, total)
                try:
                    yield bar
                finally:
                    live.remove_task(bar._id)

    @classmethod
    @contextlib.contextmanager
    def _shared(cls):
        if cls._live is None:
            cls._live = rp.Progress(
                rp.TextColumn("{task.description}"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            cls._live.start()
        cls._open += 1
        try:
            yield cls._live
        finally:
            cls._open -= 1
            if cls._open == 0:
                cls._live.stop()
                cls._live = None
