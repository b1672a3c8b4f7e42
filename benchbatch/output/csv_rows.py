"""CSV rows written without pandas, cell by cell as results.csv_text writes them (full
precision, whole numbers as integers): a streamed table's writes land mid-run, between two
of the engine's steps or while a client thread times chunks, where pandas' import (~280 ms
the first time, holding the interpreter's lock) and its frames (milliseconds) would be paid
by what is being timed. The run's end writes each table whole through csv_text."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from benchbatch.core.ranks import is_writer
from benchbatch.errors import WriteFailed
from benchbatch.output.results import atomic_write_text


def write_csv_plain(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Rows under these columns written whole (a header, then each cell as append_csv writes
    it), under a temporary name: a streamed table's first write, and its rewrite when its
    columns grow."""
    atomic_write_text(path, _plain_csv(rows, columns, header=True))


def _plain_csv(rows: list[dict], columns: list[str], header: bool) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header:
        writer.writerow(columns)
    writer.writerows([_cell(r.get(c)) for c in columns] for r in rows)
    return out.getvalue()


def append_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Rows added to the end of a CSV written with these columns (no header again; a column
    a row lacks left empty): a streamed table's append is paid between two of the engine's
    steps (pandas took 2-3 ms for a handful of rows). Not atomic: an append cut short is
    made whole by the run's last write of the table. Under torchrun rank 0 alone writes."""
    if not is_writer() or not rows:
        return
    text = _plain_csv(rows, columns, header=False)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise WriteFailed(path, len(text.encode()), e) from None


def _cell(value) -> str:
    """One value as csv_text writes it: empty for None and NaN, a whole float as an
    integer, any other float as the shortest text that reads back the same."""
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    return str(value)
