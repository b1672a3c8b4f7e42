"""Requests to serve: a lognormal generator (the article's distribution); CSV traces are
core/trace.py.

No torch: the simulator and the real engine read the same request lists.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

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
