"""FLOP rates in a unit that suits their size (no torch): TFLOP/s where some rate reaches one
(a GPU), GFLOP/s where none does (a CPU: 0.121 TFLOP/s reads better as 121 GFLOP/s). One
table, plot or report uses one unit for all its rates, the article's included."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FlopUnit:
    name: str  # "TFLOP/s" or "GFLOP/s"
    per_tflops: float  # how many of this unit one TFLOP/s is

    def __call__(self, tflops):
        """A rate in TFLOP/s (or None) in this unit."""
        return None if tflops is None else tflops * self.per_tflops


TFLOPS = FlopUnit("TFLOP/s", 1.0)
GFLOPS = FlopUnit("GFLOP/s", 1e3)


def flop_unit(tflops: Iterable) -> FlopUnit:
    """TFLOP/s when the largest finite rate is at least 1 TFLOP/s (or none is known),
    else GFLOP/s."""
    finite = [float(v) for v in tflops if _number(v) and math.isfinite(float(v))]
    return GFLOPS if finite and max(finite) < 1 else TFLOPS


def _number(value) -> bool:
    if value is None or isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def duration(seconds: float) -> str:
    """'45 s', '12 min', '1.5 h': a duration for people."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
