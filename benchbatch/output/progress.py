"""Progress of a long run on stderr: a live bar on a terminal, plain log lines elsewhere.

One live display serves every task of a process (rich allows one at a time), so a task may
open while another runs. The bar shows a spinner, items done of the total, the time
elapsed, the rate (items per second, or seconds per item when slower) and the time left;
it is redrawn REFRESH_PER_S times a second by rich's own thread, so a step that takes
minutes still shows the spinner turning and the elapsed time ticking. Rate and time left
are the task's average since it started (rich's own estimate needs two finished items
within its window: a run of a few long steps would show none until its second step).
Before the first item ends, a task opened with the run's estimated duration (phases and
sweep price every planned step before they start) counts that down instead, marked "~", so
a run of five minute-long steps does not sit at 0/5 with nothing to say.
When stderr is not a terminal (a log file, CI, a pipe) a line is printed every LOG_EVERY_S
seconds while a task is open, whether or not an item finished (a thread wakes to print
it), with the same rate and time left, and one at the end of a task that took longer.
"""

from __future__ import annotations

import contextlib
import threading
import time

from rich import progress as rp
from rich.text import Text

from benchbatch.core.units import duration
from benchbatch.output.render import err_console

LOG_EVERY_S = 10.0
REFRESH_PER_S = 2.0  # the live bar's redraws a second, whether or not an item finished


def average_rate(done: float, elapsed: float | None) -> float | None:
    """Items per second since the task started, once one is done."""
    if not done or not elapsed or elapsed <= 0:
        return None
    return done / elapsed


def rate_text(rate: float | None) -> str:
    """'3.2 it/s', or '12.5 s/it' when an item takes over a second; '' before the first."""
    if rate is None:
        return ""
    return f"{rate:.1f} it/s" if rate >= 1 else f"{1 / rate:.1f} s/it"


def left_s(done: float, total: float | None, elapsed: float | None,
           expected_s: float | None = None) -> float | None:  # fmt: skip
    """Seconds left at the average rate so far; before the first item, what is left of
    expected_s (the run's estimate) when one is given; else None (or without a total)."""
    if not done and expected_s is not None and elapsed is not None and total is not None:
        return max(expected_s - elapsed, 0.0)
    rate = average_rate(done, elapsed)
    if rate is None or total is None:
        return None
    return max(total - done, 0) / rate


def overdue(done: float, elapsed: float | None, expected_s: float | None) -> bool:
    """Before the first item, past the run's estimate of it: a time left would read 0 s
    while the work goes on (phases at 0:00:00 left for 11 s), so none is said."""
    return not done and expected_s is not None and elapsed is not None and elapsed > expected_s


def _expected(task: rp.Task) -> float | None:
    return task.fields.get("expected_s")


class RateColumn(rp.ProgressColumn):
    """Items per second (or seconds per item), averaged since the task started."""

    def render(self, task: rp.Task) -> Text:
        rate = average_rate(task.completed, task.elapsed)
        expected = _expected(task)
        if rate is None and expected and task.total:  # the estimate's, until one is done
            return Text(f"~{rate_text(task.total / expected)}", style="progress.data.speed")
        return Text(rate_text(rate), style="progress.data.speed")


class LeftColumn(rp.TimeRemainingColumn):
    """rich's time-remaining column, from the task's average rate so far: an estimate from
    the first finished item on."""

    def render(self, task: rp.Task) -> Text:
        if task.total is None:
            return Text("")
        if not task.finished and overdue(task.completed, task.elapsed, _expected(task)):
            return Text("past its estimate", style="progress.remaining")
        left = left_s(task.completed, task.total, task.elapsed, _expected(task))
        if task.finished or left is None:
            return Text("-:--:-- left" if not task.finished else "", style="progress.remaining")
        minutes, seconds = divmod(int(left), 60)
        hours, minutes = divmod(minutes, 60)
        mark = "~" if not task.completed else ""  # the estimate's, not yet the run's own
        return Text(f"{mark}{hours:d}:{minutes:02d}:{seconds:02d} left",
                    style="progress.remaining")  # fmt: skip


def columns() -> tuple[rp.ProgressColumn, ...]:
    return (
        rp.SpinnerColumn(),
        rp.TextColumn("{task.description}"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TimeElapsedColumn(),
        RateColumn(),
        LeftColumn(),
    )


def live_progress(console=err_console, get_time=None) -> rp.Progress:
    """The live display: its columns, redrawn by rich's thread REFRESH_PER_S times a second."""
    return rp.Progress(
        *columns(),
        console=console,
        transient=True,
        auto_refresh=True,
        refresh_per_second=REFRESH_PER_S,
        get_time=get_time,
    )


class _Null:
    def advance(self, n: int = 1) -> None:
        pass


class _Bar:
    """A total is an estimate (a real engine's steps from its simulation's): once passed,
    the total follows the count, so the bar never reads 3,996/3,722."""

    def __init__(self, live: rp.Progress, label: str, total: int | None,
                 expected_s: float | None = None):  # fmt: skip
        self._live, self._id = live, live.add_task(label, total=total, expected_s=expected_s)
        self._total, self._done = total, 0

    def advance(self, n: int = 1) -> None:
        self._done += n
        if self._total is not None and self._done > self._total:
            self._total = self._done
            self._live.update(self._id, total=self._total)
        self._live.advance(self._id, n)


class _Log:
    """Log lines: 'phases: 3/8 done, 41 s'."""

    def __init__(self, label: str, total: int | None, expected_s: float | None = None):
        self.label, self.total, self.done, self.expected_s = label, total, 0, expected_s
        self.start = self.last = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.tick(time.monotonic())

    def tick(self, now: float) -> bool:
        """A line if LOG_EVERY_S passed since the last (at an item, or the thread's wake)."""
        if now - self.last < LOG_EVERY_S:
            return False
        self.line(now=now)
        return True

    def line(self, end: bool = False, now: float | None = None) -> None:
        self.last = time.monotonic() if now is None else now
        err_console.print(self.text(self.last - self.start, end), highlight=False, markup=False)

    @contextlib.contextmanager
    def heartbeat(self):
        """While the block runs, a thread wakes every LOG_EVERY_S to print a line, so a step
        that takes minutes still shows its time going by in a log."""
        stop = threading.Event()

        def beat():
            while not stop.wait(LOG_EVERY_S):
                self.tick(time.monotonic())

        thread = threading.Thread(target=beat, name="progress-log", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def text(self, elapsed: float, end: bool = False) -> str:
        """'phases: 3/8 done, 41 s, 13.7 s/it, about 1 min left'."""
        over = bool(self.total) and self.done > self.total  # the total was an estimate
        of = f"/{self.total:,}" if self.total and not over else ""
        state = "finished" if end else "done"
        line = f"{self.label}: {self.done:,}{of} {state}, {elapsed:.0f} s"
        if over:
            line += f" (more than the {self.total:,} estimated)"
        rate = rate_text(average_rate(self.done, elapsed))
        left = None if end else left_s(self.done, self.total, elapsed, self.expected_s)
        if rate:
            line += f", {rate}"
        if not end and overdue(self.done, elapsed, self.expected_s):
            line += f", past the {duration(self.expected_s)} estimated"
        elif left is not None:
            line += f", about {duration(left)} left"
            if not self.done:
                line += " (estimated)"
        return line


class Progress:
    _live: rp.Progress | None = None
    _open = 0

    @classmethod
    @contextlib.contextmanager
    def task(cls, label: str, total: int | None, quiet: bool = False,
             expected_s: float | None = None):  # fmt: skip
        """A task's progress: `total` items, and `expected_s` the run's estimate of them
        all (shown as the time left until the first item is done)."""
        if quiet:
            yield _Null()
        elif not err_console.is_terminal:
            log = _Log(label, total, expected_s)
            with log.heartbeat():
                yield log
            if time.monotonic() - log.start >= LOG_EVERY_S:
                log.line(end=True)
        else:
            with cls._shared() as live:
                bar = _Bar(live, label, total, expected_s)
                try:
                    yield bar
                finally:
                    live.remove_task(bar._id)

    @classmethod
    @contextlib.contextmanager
    def _shared(cls):
        if cls._live is None:
            cls._live = live_progress()
            cls._live.start()
        cls._open += 1
        try:
            yield cls._live
        finally:
            cls._open -= 1
            if cls._open == 0:
                cls._live.stop()
                cls._live = None
