"""The terminal's view of a run: rich tables of result rows, notes, warnings, JSON.

Probes never print; commands and the report print through these helpers. stdout carries
the results (tables, the folder); stderr the notes, warnings and progress.

Text is printed as it is: paths, labels, model names and CSV values come from users and
files, so neither console reads rich markup (`[bold]`) or emoji codes (`:cd:`) in it; a
style is given as a Text span instead. Lines are never wrapped (soft wrap): a path stays
whole on one line in a pipe or a narrow terminal, for scripts to read.
"""

from __future__ import annotations

import math

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from benchbatch.core.ranks import is_writer
from benchbatch.core.units import (
    duration,  # noqa: F401  (render.duration: the commands use it)
    figure,
)
from benchbatch.errors import OutputFailed, one_line


class _Stream:
    """The console's stream (looked up when written, as rich does), its failed writes
    handled: stderr's dropped (notes and progress cannot stop a run, and nothing is left to
    say them on: `2>/dev/full`, a closed terminal), stdout's raised as OutputFailed (one line
    on stderr, exit 1; a closed pipe, `| head`, stays a BrokenPipeError)."""

    def __init__(self, stream, raises: bool):
        self._stream, self._raises = stream, raises

    def write(self, text: str) -> int:
        return self._guard(self._stream.write, text) or len(text)

    def flush(self) -> None:
        self._guard(self._stream.flush)

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except BrokenPipeError:
            if self._raises:
                raise
        except (OSError, ValueError) as e:  # ValueError: the stream was closed
            if self._raises:
                raise OutputFailed(e if isinstance(e, OSError) else OSError(str(e))) from None
        return None

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _Console(Console):
    @property
    def file(self):
        return _Stream(Console.file.fget(self), raises=not self.stderr)

    @file.setter
    def file(self, new_file) -> None:
        Console.file.fset(self, new_file)


# Under torchrun every rank runs the command and rank 0 alone prints (errors excepted).
# Text is printed as given: no rich markup or emoji codes in paths, labels or names.
out_console = _Console(markup=False, emoji=False, soft_wrap=True, quiet=not is_writer())
err_console = _Console(stderr=True, markup=False, emoji=False, quiet=not is_writer())

NOISY_HINT = "try more --repeats or --min-time"


def fmt(value) -> str:
    """Numbers to 3 significant figures; big counts with thousands separators."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "", None: "-"}[value]
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return figure(value)
    return str(value)


def rows_table(rows: list[dict], columns: dict[str, str], title: str | None = None) -> Table:
    """columns maps a row key to its header; numbers are right-aligned."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    first = rows[0] if rows else {}
    cells = [[fmt(row.get(key)) for key in columns] for row in rows]
    for i, (key, header) in enumerate(columns.items()):
        numeric = isinstance(first.get(key), int | float) and not isinstance(first.get(key), bool)
        # A cell too wide folds onto a second line (a number is never cut short, "0.000…"),
        # but never inside a number or a header's word: a column is at least as wide as
        # its longest cell without a space ("1.12-1.82", which folded read "1.12-1"), and
        # its header's longest word; a table that needs more runs past the width instead.
        whole = [c for c in (row[i] for row in cells) if " " not in c]
        least = max([len(c) for c in whole] + [len(w) for w in header.split()], default=0)
        table.add_column(header, justify="right" if numeric else "left", no_wrap=i == 0,
                         overflow="fold", min_width=least or None)  # fmt: skip
    for row in cells:
        table.add_row(*row)
    return table


def table(rows: list[dict], columns: dict[str, str], title: str) -> None:
    """Print rows as a table with the given columns (key -> header)."""
    t = rows_table(rows, columns, title=title)
    t.box, t.pad_edge = box.SIMPLE_HEAD, False
    out_console.print(t)


def with_flop_unit(rows: list[dict], columns: dict[str, str], key: str = "tflops"):
    """Rows and headers with the FLOP rate in the unit that suits the measured rates
    (GFLOP/s on a CPU, units.py) and each step's spread: p10-p90 of its repeats (ms)."""
    from benchbatch.core.units import flop_unit

    unit = flop_unit(r.get(key) for r in rows if r.get("status", "ok") == "ok")
    shown = [{**r, "flop_rate": unit(r.get(key)), "spread_ms": spread(r)} for r in rows]
    headers = {("flop_rate" if k == key else k): (unit.name if k == key else v)
               for k, v in columns.items()}  # fmt: skip
    return shown, headers


def spread(row: dict) -> str:
    """'15.1-17.3': the 10th and 90th percentiles of a step's repeats, in ms."""
    lo, hi = row.get("step_ms_p10"), row.get("step_ms_p90")
    if not isinstance(lo, float | int) or not isinstance(hi, float | int):
        return "-"
    if math.isnan(lo) or math.isnan(hi):
        return "-"
    return f"{fmt(float(lo))}-{fmt(float(hi))}"


def note(text: str) -> None:
    labelled("note:", text)


def warning(text: str) -> None:
    labelled("warning:", text)


def labelled(label: str, text: str, style: str = "yellow") -> None:
    """'label: text' on stderr, the label in colour, the text exactly as given."""
    err_console.print(Text.assemble((label, style), " ", one_line(text)), highlight=False,
                      soft_wrap=True)  # fmt: skip


def line(text: str) -> None:
    """One line of results on stdout, exactly as given, never wrapped."""
    out_console.print(one_line(text), highlight=False)


def results_line(rec) -> None:
    """The last lines of a run's view: the warnings the run kept for under its finished
    tables (Recorder.warning(later=True); metadata has them too), then its folder."""
    for text in getattr(rec, "later", ()):
        warning(text)
    line(f"results: {rec.folder}")


def print_json(document: dict) -> None:
    from benchbatch.output.results import json_text

    out_console.out(json_text(document), highlight=False)


def noisy_hint(threads: int | None = None) -> str:
    """NOISY_HINT, or on a CPU whose load says other processes compete (the likely cause),
    fewer threads and less other work first (core/noise.py); `threads`: the run's own."""
    from benchbatch.core import machine, noise

    load = machine.load_average()
    return noise.noisy_hint(load[0] if load else None, machine.core_count(), threads)


def run_threads(meta: dict) -> int | None:
    """The run's compute threads (metadata's threads.threads), None where it set none."""
    return (meta.get("threads") or {}).get("threads")


def warn_untrusted(flagged: dict[str, list[str]], threads: int | None = None) -> None:
    """Say which rows are noisy or throttled, and what to try (`threads`: the run's compute
    threads, metadata's threads.threads, so the advice is not what the run already did)."""
    from benchbatch.core.noise import DEFAULT_CV_THRESHOLD

    if flagged.get("noisy"):
        warning(
            f"noisy (CV over {DEFAULT_CV_THRESHOLD:.0%}, or timed once): "
            f"{', '.join(flagged['noisy'])}; something else may be using the device: "
            f"{noisy_hint(threads)}."
        )
    if flagged.get("throttled"):
        warning(
            "the GPU slowed its clocks (thermal or power limit) during: "
            f"{', '.join(flagged['throttled'])}; those times are pessimistic: let it cool or "
            "check its power limit (nvidia-smi -q -d PERFORMANCE) and rerun, with more "
            "--repeats or --min-time."
        )
    if flagged.get("power_capped"):
        note(
            "the GPU held its power limit during: "
            f"{', '.join(flagged['power_capped'])} (routine under heavy matmul load on big "
            "GPUs): those times are what this board's power limit allows."
        )
