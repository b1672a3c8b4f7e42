"""Prompt and output lengths drawn from a distribution: fixed, uniform or lognormal (no torch).

The serving benchmarks draw synthetic lengths the same three ways (vLLM's random dataset is
uniform around a length, GuideLLM's synthetic data takes a spread and bounds); a trace
replaces them with a user's own traffic (trace.read_trace_columns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchbatch.errors import UserError

KINDS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class LengthDist:
    """Token counts: `fixed` is `center` for all; `uniform` integers in [low, high] (each
    equally likely); `lognormal` has median `center` and log-space sigma `sigma`, rounded and
    clipped to [low, high]. `name` is the option that describes it (for errors)."""

    kind: str
    center: float
    sigma: float
    low: int
    high: int
    name: str = "length"

    def check(self, options: dict[str, str]) -> None:
        """A UserError naming the option of the first bad parameter. options maps 'center',
        'low', 'high' to the option (field) names that set them."""
        if self.kind not in KINDS:  # choices are checked on the command line: a bug here
            raise ValueError(f"unknown length distribution {self.kind!r}")
        low, high = (f"--{options[k].replace('_', '-')}" for k in ("low", "high"))  # as typed
        if self.low > self.high:
            high = f"{high} {self.high:,}"
            raise UserError(options["low"], f"{self.low:,} is more than {high}")
        if self.kind == "fixed" and round(self.center) < 1:
            message = f"a fixed length must be at least 1, got {self.center:g}"
            raise UserError(options["center"], message)
        if self.kind != "uniform" and not (self.low <= round(self.center) <= self.high):
            raise UserError(
                options["center"],
                f"{self.center:g} lies outside [{self.low:,}, {self.high:,}] ({low}, {high})",
            )

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n lengths as int64."""
        if self.kind == "fixed":
            return np.full(n, round(self.center), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, n, endpoint=True, dtype=np.int64)
        draws = rng.lognormal(math.log(self.center), self.sigma, n)
        return np.clip(np.rint(draws), self.low, self.high).astype(np.int64)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{round(self.center):,}"
        if self.kind == "uniform":
            return f"uniform {self.low:,}-{self.high:,}"
        return f"lognormal median {self.center:g}, sigma {self.sigma:g}, {self.low:,}-{self.high:,}"
