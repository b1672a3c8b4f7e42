"""Request traces as CSV files: read (output_tokens, optional prompt_tokens and arrival_step;
a plain numeric file parsed in one pass, anything else row by row, any problem a UserError
naming the file, line and column) and written back (`occupancy --trace` replays what a real
run produced). No torch."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchbatch.core.optkit import require
from benchbatch.core.workload import Request, Workload
from benchbatch.errors import UserError

TRACE_OPTION = "trace"
INT64_MAX = 2**63 - 1


def read_trace(path: str | Path, prompt_tokens: int = 64) -> list[Request]:
    """Requests from a CSV: column output_tokens, optional prompt_tokens and arrival_step.

    Request ids are the row order (0, 1, ...). Any problem is a UserError naming the file
    and, for a bad value, its line.
    """
    return read_trace_columns(path, prompt_tokens).to_requests()


def read_trace_columns(path: str | Path, prompt_tokens: int = 64) -> Workload:
    """read_trace() as columns. A plain trace (digits, commas and newlines after the header,
    every value valid) is parsed by pandas at once; anything else, or any doubt, goes to the
    row-by-row reader, which accepts the same files and names the line of a bad value."""
    require(prompt_tokens >= 1, "prompt_len", f"must be at least 1, got {prompt_tokens}")
    data = _trace_bytes(Path(path))
    fast = plain_trace(Path(path), prompt_tokens, data)
    return fast if fast is not None else Workload.of(_read_trace_rows(path, prompt_tokens, data))


def _trace_bytes(path: Path) -> bytes:
    """The file's bytes (a regular file: a FIFO is refused, never read forever), without
    the byte-order mark a spreadsheet may write first."""
    from benchbatch.core.inputs import read_bytes

    return read_bytes(path, TRACE_OPTION).removeprefix(b"\xef\xbb\xbf")


def _read_trace_rows(
    path: str | Path, prompt_tokens: int, data: bytes | None = None
) -> list[Request]:
    data = _trace_bytes(Path(path)) if data is None else data
    rows, line_numbers = _read_rows(Path(path), data)
    return [
        _trace_request(i, row, line, path, prompt_tokens)
        for i, (row, line) in enumerate(zip(rows, line_numbers, strict=True))
    ]


def _read_rows(path: Path, data: bytes) -> tuple[list[dict[str, str]], list[int]]:

    try:
        with io.StringIO(data.decode("utf-8"), newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise UserError(TRACE_OPTION, f"{path} is empty")
            _check_columns(path, reader.fieldnames)
            rows, lines = [], []
            for row in reader:
                if None in row:  # csv puts the values past the last column under None
                    raise UserError(
                        TRACE_OPTION, f"{path} line {reader.line_num} has more values than columns"
                    )
                rows.append({k.strip(): (v or "").strip() for k, v in row.items()})
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(TRACE_OPTION, f"cannot read {path}: {_reason(e)}") from e
    require(bool(rows), TRACE_OPTION, f"{path} has a header but no requests")
    return rows, lines


def _reason(e: Exception) -> str:
    from benchbatch.core.inputs import reason

    return reason(e)


def _check_columns(path: Path, fieldnames: list[str]) -> None:
    columns = [name.strip() for name in fieldnames]
    if "output_tokens" not in columns:
        found = ", ".join(columns) or "none"
        raise UserError(TRACE_OPTION, f"{path} has no column 'output_tokens' (columns: {found})")


def _trace_request(
    i: int, row: dict[str, str], line: int, path: str | Path, prompt_tokens: int
) -> Request:
    where = f"{path} line {line}"
    return Request(
        id=i,
        prompt_tokens=_int_field(row, "prompt_tokens", where, default=prompt_tokens, minimum=1),
        output_tokens=_int_field(row, "output_tokens", where, default=None, minimum=1),
        arrival_step=_int_field(row, "arrival_step", where, default=0, minimum=0),
    )


def _int_field(
    row: dict[str, str], column: str, where: str, default: int | None, minimum: int
) -> int:
    text = row.get(column, "")
    if text == "" and default is not None:
        return default
    try:
        value = int(text)
    except ValueError:
        shown = text[:40]
        raise UserError(TRACE_OPTION, f"{where}: {column} {shown!r} is not an integer") from None
    kind = "positive" if minimum == 1 else "zero or more"
    require(value >= minimum, TRACE_OPTION, f"{where}: {column} must be {kind}, got {value}")
    # Requests are held as int64 columns; no run could get anywhere near this anyway.
    require(value <= INT64_MAX, TRACE_OPTION, f"{where}: {column} is more than {INT64_MAX:,}")
    return value


# --- plain traces, parsed at once -----------------------------------------------------------

TRACE_COLUMNS = ("output_tokens", "prompt_tokens", "arrival_step")
_NOT_PLAIN = b"0123456789,\r\n"  # what a plain trace's body may hold
_EXACT = 2**53  # integers parsed through float64 are exact below this


def plain_trace(path: Path, prompt_tokens: int, data: bytes | None = None) -> Workload | None:
    """The trace's requests if the file is plain and valid, else None (read it row by row).

    Plain: a UTF-8 header of distinct names with output_tokens and no quotes, then lines of
    digits and commas, each empty (skipped, as csv skips it) or with the header's number of
    fields; line ends \n or \r\n. Every such file means the same to the csv module.
    """
    if data is None:
        try:
            data = _trace_bytes(path)
        except UserError:
            return None
    header, _, body = data.partition(b"\n")
    names = _plain_header(header)
    if names is None or not body.strip(b"\r\n") or body.translate(None, _NOT_PLAIN):
        return None
    if not _same_field_counts(body, names):
        return None
    columns = _parse_plain(body, names, {"prompt_tokens": prompt_tokens, "arrival_step": 0})
    if columns is None or (columns["output_tokens"] < 1).any():
        return None
    n = columns["output_tokens"].size
    prompts = columns.get("prompt_tokens", np.full(n, prompt_tokens, np.int64))
    if (prompts < 1).any():
        return None
    arrivals = columns.get("arrival_step", np.zeros(n, np.int64))
    return Workload(np.arange(n, dtype=np.int64), prompts, columns["output_tokens"], arrivals)


def _plain_header(header: bytes) -> list[str] | None:
    if header.endswith(b"\r"):
        header = header[:-1]
    if not header or any(c in header for c in b'"\r\x00'):
        return None
    try:
        names = [name.strip() for name in header.decode("utf-8").split(",")]
    except UnicodeDecodeError:
        return None
    if len(set(names)) != len(names) or "output_tokens" not in names:
        return None
    return names


def _same_field_counts(body: bytes, names: list[str]) -> bool:
    """Every line empty or with len(names) - 1 commas; a \r only before a \n."""
    if body.count(b"\r") != body.count(b"\r\n"):
        return False
    text = np.frombuffer(body, np.uint8)
    ends = np.flatnonzero(text == ord("\n"))
    if not body.endswith(b"\n"):
        ends = np.append(ends, text.size)
    commas = np.flatnonzero(text == ord(","))
    per_line = np.diff(np.searchsorted(commas, ends), prepend=0)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts - (text[np.maximum(ends - 1, 0)] == ord("\r"))
    return bool(np.all((per_line == len(names) - 1) | ((lengths <= 0) & (per_line == 0))))


def _parse_plain(
    body: bytes, names: list[str], defaults: dict[str, int]
) -> dict[str, np.ndarray] | None:
    """The trace's columns as int64, an empty value taking its default; None where an
    output_tokens is missing or a value too large to be exact."""

    import pandas as pd

    wanted = [i for i, name in enumerate(names) if name in TRACE_COLUMNS]
    try:
        frame = pd.read_csv(
            io.BytesIO(body), header=None, names=range(len(names)), usecols=wanted, dtype=float
        )
    except ValueError:  # pandas' parser errors are ValueErrors: let the csv reader say why
        return None
    columns = {}
    for i in wanted:
        values = frame[i].to_numpy()
        missing = np.isnan(values)
        if (values[~missing] >= _EXACT).any():
            return None
        if missing.any():
            if names[i] not in defaults:
                return None
            values = np.where(missing, defaults[names[i]], values)
        columns[names[i]] = values.astype(np.int64)
    return columns


# --- traces written -----------------------------------------------------------------------

WRITTEN_COLUMNS = ("prompt_tokens", "output_tokens", "arrival_step")


def trace_rows(requests: Sequence[Request]) -> list[dict]:
    """The requests as read_trace reads them back (row order gives the ids)."""
    return [{c: getattr(r, c) for c in WRITTEN_COLUMNS} for r in requests]


def trace_text(requests: Sequence[Request]) -> str:
    """A CSV trace of the requests (e.g. the output lengths a real run produced), for
    `occupancy --trace` to replay (benchbatch/output/results.py writes it)."""

    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=WRITTEN_COLUMNS)
    writer.writeheader()
    writer.writerows(trace_rows(requests))
    return text.getvalue()


def within_limits(requests, where: str, most_requests: int, most_tokens: int,
                  most_span: int):  # fmt: skip
    """A trace's requests (read_trace_columns'), its size, lengths and arrivals checked
    within the limits generated workloads have (WorkloadOptions'); `where` names it."""
    require(
        len(requests) <= most_requests,
        "trace",
        f"{where}: {len(requests):,} requests (at most {most_requests:,})",
    )
    longest = int(max(requests.prompt_tokens.max(), requests.output_tokens.max()))
    require(
        longest <= most_tokens,
        "trace",
        f"{where}: a request of {longest:,} tokens (at most {most_tokens:,} a prompt or an "
        "output)",
    )
    last = int(requests.arrival_step.max())
    require(
        last <= most_span,
        "trace",
        f"{where}: a request arrives at step {last:,}, beyond the {most_span:,} steps a run "
        "may span",
    )
    return requests
