"""Requests to serve: a lognormal generator (the article's distribution) and CSV traces.

No torch: the simulator and the real engine read the same request lists.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchbatch.core.optkit import require
from benchbatch.errors import UserError


@dataclass(frozen=True)
class Request:
    """One request: its prompt, how many tokens it will generate, and when it arrives.

    output_tokens is forced (generation ignores end-of-sequence), so simulated and real
    runs schedule exactly the same steps; a real engine told to stop at end-of-sequence
    takes it as a cap. prompt_ids: the prompt's real token ids (a tokenized prompt), or
    None for random ids the engine draws per request.
    """

    id: int
    prompt_tokens: int
    output_tokens: int
    arrival_step: int = 0
    prompt_ids: tuple[int, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Inputs are validated where they enter (options, traces): a bad Request is a bug.
        if self.prompt_tokens < 1 or self.output_tokens < 1 or self.arrival_step < 0:
            raise ValueError(f"invalid request: {self}")
        if self.prompt_ids is not None and len(self.prompt_ids) != self.prompt_tokens:
            raise ValueError(f"request {self.id}: {len(self.prompt_ids)} prompt ids")


WORKLOAD_COLUMNS = ("id", "prompt_tokens", "output_tokens", "arrival_step")


@dataclass(frozen=True, eq=False)
class Workload(Sequence[Request]):
    """Many requests as columns (int64 arrays, one entry per request), Request's fields.

    The simulator's fast path reads the columns directly; as a Sequence of Request it also
    goes wherever a list of requests does (an item is built when read).
    """

    id: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_step: np.ndarray

    def __post_init__(self) -> None:
        for name in WORKLOAD_COLUMNS:
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), np.int64))
        if len({getattr(self, name).shape for name in WORKLOAD_COLUMNS}) != 1:
            raise ValueError("workload columns differ in length")
        bad = (self.prompt_tokens < 1) | (self.output_tokens < 1) | (self.arrival_step < 0)
        if bad.any():  # as Request: bad values are a bug here, users are told where they enter
            i = int(np.argmax(bad))
            values = {name: int(getattr(self, name)[i]) for name in WORKLOAD_COLUMNS}
            raise ValueError(f"invalid request: {values}")

    @classmethod
    def of(cls, requests: Iterable[Request]) -> Workload:
        """A Workload of these requests (itself if it is one)."""
        if isinstance(requests, Workload):
            return requests
        requests = list(requests)
        return cls(
            *(
                np.fromiter((getattr(r, name) for r in requests), np.int64, len(requests))
                for name in WORKLOAD_COLUMNS
            )
        )

    def __len__(self) -> int:
        return int(self.id.size)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Workload(*(getattr(self, name)[i] for name in WORKLOAD_COLUMNS))
        return Request(*(int(getattr(self, name)[i]) for name in WORKLOAD_COLUMNS))

    def __iter__(self) -> Iterator[Request]:
        return iter(self.to_requests())

    def to_requests(self) -> list[Request]:
        columns = (getattr(self, name).tolist() for name in WORKLOAD_COLUMNS)
        return [Request(*values) for values in zip(*columns, strict=True)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workload):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, name), getattr(other, name)) for name in WORKLOAD_COLUMNS
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Workload({len(self)} requests)"


def lognormal_workload(
    requests: int,
    *,
    median: float = 70,
    sigma: float = 0.9,
    max_output: int = 2000,
    prompt_len: int = 64,
    arrival_rate: float | None = None,
    seed: int = 0,
    long_prompt_fraction: float = 0.0,
    long_prompt_len: int = 0,
) -> list[Request]:
    """Output lengths lognormal(median, sigma), rounded, clipped to [1, max_output].

    Median 70 and sigma 0.9 reproduce the article's 600-request trace. Every request
    waits at step 0 unless arrival_rate (Poisson, requests per step) is given.
    """
    return lognormal_columns(
        requests,
        median=median,
        sigma=sigma,
        max_output=max_output,
        prompt_len=prompt_len,
        arrival_rate=arrival_rate,
        seed=seed,
        long_prompt_fraction=long_prompt_fraction,
        long_prompt_len=long_prompt_len,
    ).to_requests()


def lognormal_columns(
    requests: int,
    *,
    median: float = 70,
    sigma: float = 0.9,
    max_output: int = 2000,
    prompt_len: int = 64,
    arrival_rate: float | None = None,
    seed: int = 0,
    long_prompt_fraction: float = 0.0,
    long_prompt_len: int = 0,
) -> Workload:
    """lognormal_workload() as columns: the same requests for the same seed, drawn at once."""
    _check_workload_options(
        requests,
        median,
        sigma,
        max_output,
        prompt_len,
        arrival_rate,
        long_prompt_fraction,
        long_prompt_len,
    )
    return Workload(
        np.arange(requests, dtype=np.int64),
        prompt_array(requests, prompt_len, long_prompt_fraction, long_prompt_len, seed),
        output_array(requests, median, sigma, max_output, seed),
        arrival_array(requests, arrival_rate, seed) if arrival_rate else np.zeros(requests, int),
    )


def with_prompts(
    requests: Sequence[Request], prompts: Sequence[Sequence[int]], output_tokens: int | None = None
) -> list[Request]:
    """The requests with real prompts: request i gets prompts[i % len(prompts)] (token ids),
    its length as prompt_tokens; arrivals are kept, and output lengths too unless
    output_tokens is given (with end-of-sequence stopping, the cap every request shares)."""
    if not prompts:
        raise UserError("prompts", "no prompts to serve")
    out = []
    for i, r in enumerate(requests):
        ids = tuple(prompts[i % len(prompts)])
        out.append(
            dataclasses.replace(
                r,
                prompt_tokens=len(ids),
                prompt_ids=ids,
                output_tokens=output_tokens or r.output_tokens,
            )
        )
    return out


def output_lengths(
    requests: int, median: float, sigma: float, max_output: int, seed: int
) -> list[int]:
    return output_array(requests, median, sigma, max_output, seed).tolist()


def output_array(
    requests: int, median: float, sigma: float, max_output: int, seed: int
) -> np.ndarray:
    # numpy's default_rng, not `random`: with it seed 3 gives 10,089 static against 2,576
    # continuous steps on 32 slots (20.4% vs 79.9% occupancy, the article's 3.92x), and seeds
    # 0-4 static 19-24%, continuous 77-95%, as the article's experiment C spreads.
    # + 0.0: numpy refuses a sigma of -0.0 (its sign bit), which means 0.
    draws = np.random.default_rng(seed).lognormal(math.log(median), sigma + 0.0, requests)
    return np.clip(np.rint(draws), 1, max_output).astype(np.int64)


def poisson_arrivals(requests: int, rate: float, seed: int) -> list[int]:
    return arrival_array(requests, rate, seed).tolist()


def arrival_array(requests: int, rate: float, seed: int) -> np.ndarray:
    """Poisson process: exponential gaps (mean 1/rate steps), floored to whole steps."""
    # A separate stream, so adding arrivals does not change the output lengths of a seed.
    gaps = np.random.default_rng([seed, 1]).exponential(1 / rate, requests)
    return np.floor(np.cumsum(gaps)).astype(np.int64)


def prompt_lengths(
    requests: int, prompt_len: int, long_fraction: float, long_len: int, seed: int
) -> list[int]:
    return prompt_array(requests, prompt_len, long_fraction, long_len, seed).tolist()


def prompt_array(
    requests: int, prompt_len: int, long_fraction: float, long_len: int, seed: int
) -> np.ndarray:
    """prompt_len for all, except round(long_fraction x requests) chosen at random."""
    prompts = np.full(requests, prompt_len, dtype=np.int64)
    rng = np.random.default_rng([seed, 2])
    prompts[rng.choice(requests, size=round(long_fraction * requests), replace=False)] = long_len
    return prompts


def _check_workload_options(
    requests: int,
    median: float,
    sigma: float,
    max_output: int,
    prompt_len: int,
    arrival_rate: float | None,
    long_fraction: float,
    long_len: int,
) -> None:
    require(requests >= 1, "requests", f"must be at least 1, got {requests}")
    require(median > 0, "median", f"must be positive, got {median}")
    require(sigma >= 0, "sigma", f"must not be negative, got {sigma}")
    require(max_output >= 1, "max_output", f"must be at least 1, got {max_output}")
    require(prompt_len >= 1, "prompt_len", f"must be at least 1, got {prompt_len}")
    if arrival_rate is not None:
        require(arrival_rate > 0, "arrival_rate", f"must be positive, got {arrival_rate}")
    require(
        0 <= long_fraction <= 1, "long_prompt_fraction", f"must be in [0, 1], got {long_fraction}"
    )
    if long_fraction > 0:
        require(long_len >= 1, "long_prompt_len", f"must be at least 1, got {long_len}")


# --- traces -------------------------------------------------------------------------------

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
    import io

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
    import io

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
    import io

    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=WRITTEN_COLUMNS)
    writer.writeheader()
    writer.writerows(trace_rows(requests))
    return text.getvalue()
