"""Requests to serve: a lognormal generator (the article's distribution) and CSV traces.

No torch: the simulator and the real engine read the same request lists.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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
    outputs = output_lengths(requests, median, sigma, max_output, seed)
    arrivals = poisson_arrivals(requests, arrival_rate, seed) if arrival_rate else [0] * requests
    prompts = prompt_lengths(requests, prompt_len, long_prompt_fraction, long_prompt_len, seed)
    return [Request(i, prompts[i], outputs[i], arrivals[i]) for i in range(requests)]


def with_prompts(
    requests: Sequence[Request], prompts: Sequence[Sequence[int]], output_tokens: int | None = None
) -> list[Request]:
    """The requests with real prompts: request i gets prompts[i % len(prompts)] (token ids),
    its length as prompt_tokens; arrivals are kept, and output lengths too unless
    output_tokens is given (with end-of-sequence stopping, the cap every request shares)."""
    if not prompts:
        raise UserError("--prompts", "no prompts to serve")
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
    # numpy's default_rng, not `random`: with it seed 3 gives 10,089 static against 2,576
    # continuous steps on 32 slots (20.4% vs 79.9% occupancy, the article's 3.92x), and seeds
    # 0-4 static 19-24%, continuous 77-95%, as the article's experiment C spreads.
    draws = np.random.default_rng(seed).lognormal(math.log(median), sigma, requests)
    return [int(n) for n in np.clip(np.rint(draws), 1, max_output)]


def poisson_arrivals(requests: int, rate: float, seed: int) -> list[int]:
    """Poisson process: exponential gaps (mean 1/rate steps), floored to whole steps."""
    # A separate stream, so adding arrivals does not change the output lengths of a seed.
    gaps = np.random.default_rng([seed, 1]).exponential(1 / rate, requests)
    return [int(t) for t in np.floor(np.cumsum(gaps))]


def prompt_lengths(
    requests: int, prompt_len: int, long_fraction: float, long_len: int, seed: int
) -> list[int]:
    """prompt_len for all, except round(long_fraction x requests) chosen at random."""
    prompts = [prompt_len] * requests
    rng = np.random.default_rng([seed, 2])
    for i in rng.choice(requests, size=round(long_fraction * requests), replace=False):
        prompts[int(i)] = long_len
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
    _require(requests >= 1, "--requests", f"must be at least 1, got {requests}")
    _require(median > 0, "--median", f"must be positive, got {median}")
    _require(sigma >= 0, "--sigma", f"must not be negative, got {sigma}")
    _require(max_output >= 1, "--max-output", f"must be at least 1, got {max_output}")
    _require(prompt_len >= 1, "--prompt-len", f"must be at least 1, got {prompt_len}")
    if arrival_rate is not None:
        _require(arrival_rate > 0, "--arrival-rate", f"must be positive, got {arrival_rate}")
    _require(
        0 <= long_fraction <= 1, "--long-prompt-fraction", f"must be in [0, 1], got {long_fraction}"
    )
    if long_fraction > 0:
        _require(long_len >= 1, "--long-prompt-len", f"must be at least 1, got {long_len}")


def _require(ok: bool, option: str, message: str) -> None:
    if not ok:
        raise UserError(option, message)


# --- traces -------------------------------------------------------------------------------

TRACE_OPTION = "--trace"


def read_trace(path: str | Path, prompt_tokens: int = 64) -> list[Request]:
    """Requests from a CSV: column output_tokens, optional prompt_tokens and arrival_step.

    Request ids are the row order (0, 1, ...). Any problem is a UserError naming the file
    and, for a bad value, its line.
    """
    _require(prompt_tokens >= 1, "--prompt-len", f"must be at least 1, got {prompt_tokens}")
    rows, line_numbers = _read_rows(Path(path))
    return [
        _trace_request(i, row, line, path, prompt_tokens)
        for i, (row, line) in enumerate(zip(rows, line_numbers, strict=True))
    ]


def _read_rows(path: Path) -> tuple[list[dict[str, str]], list[int]]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
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
    _require(bool(rows), TRACE_OPTION, f"{path} has a header but no requests")
    return rows, lines


def _reason(e: Exception) -> str:
    return getattr(e, "strerror", None) or str(e).splitlines()[0]


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
        raise UserError(TRACE_OPTION, f"{where}: {column} {text!r} is not an integer") from None
    kind = "positive" if minimum == 1 else "zero or more"
    _require(value >= minimum, TRACE_OPTION, f"{where}: {column} must be {kind}, got {value}")
    return value


TRACE_COLUMNS = ("prompt_tokens", "output_tokens", "arrival_step")


def trace_rows(requests: Sequence[Request]) -> list[dict]:
    """The requests as read_trace reads them back (row order gives the ids)."""
    return [{c: getattr(r, c) for c in TRACE_COLUMNS} for r in requests]


def write_trace(path: str | Path, requests: Sequence[Request]) -> None:
    """A CSV trace of the requests (e.g. the output lengths a real run produced), written
    whole or not at all, for `occupancy --trace` to replay."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=TRACE_COLUMNS)
        writer.writeheader()
        writer.writerows(trace_rows(requests))
    os.replace(tmp, path)
