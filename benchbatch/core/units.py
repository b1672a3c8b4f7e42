"""Units (no torch). FLOP rates in a unit that suits their size: TFLOP/s where some rate
reaches one (a GPU), GFLOP/s where none does (a CPU: 0.121 TFLOP/s reads better as 121
GFLOP/s); one table, plot or report uses one unit for all its rates, the article's included.
Durations as latency options take them: a unit ('200ms', '2s', '500us') or a bare number
of milliseconds, as vLLM's."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from benchbatch.errors import UserError


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


def significant(value: float, digits: int) -> str:
    """value to `digits` significant digits, written out (330, 0.0088, 9.06), never in
    e-notation ('3.3e+02'), which a line read by people should not hold; NaN as 'nan'."""
    import numpy as np  # here: --help imports this module and no numpy

    value = float(value)
    if not math.isfinite(value):
        return str(value)
    return np.format_float_positional(value, precision=digits, unique=False, fractional=False,
                                      trim="-")  # fmt: skip


def figure(value: float) -> str:
    """A number for people: three significant digits (0.0123, 4.02, 662), 1,000 and over
    whole, with thousands separators (1,142): never e-notation."""
    if math.isfinite(value) and abs(value) >= 1e3:
        return f"{value:,.0f}"
    return significant(value, 3)


def duration(seconds: float) -> str:
    """'45 s', '12 min', '1.5 h': a duration for people."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --- durations on the command line ----------------------------------------------------------

# Seconds in one of each unit a latency option takes ("us" and "µs" both microseconds).
TIME_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION = re.compile(r"\s*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)\s*([a-zµ]*)\s*")


def parse_duration(text, option: str, bare: str = "ms", zero: bool = False,
                   small: bool = False) -> float:  # fmt: skip
    """A latency as typed, in seconds: '200ms', '2s', '2 s', '500us'; a bare number is in
    `bare` units (milliseconds, as vLLM's --goodput ttft:200). A bare number under 1 ms is
    refused: it is the old spelling in seconds ('0.2'), which would silently mean 0.2 ms;
    unless `small` (a latency of microseconds, an all-reduce's: 0.02 is 20 us).
    Negative, zero (unless `zero`), NaN, infinite and malformed values are a UserError
    naming the option. A number that is no text (a default, a Python caller) is already
    in seconds."""
    if not isinstance(text, str):
        return float(text)
    shown = text if len(text) <= 40 else text[:40] + "..."
    match = _DURATION.fullmatch(text.lower())
    unit = match.group(2) if match else None
    if match is None or (unit and unit not in TIME_UNITS):
        raise UserError(option, f"{shown!r} is not a duration (200ms, 2s, 500us, or a bare "
                        "number of milliseconds)")  # fmt: skip
    seconds = float(match.group(1)) * TIME_UNITS[unit or bare]
    if not math.isfinite(seconds):
        raise UserError(option, f"must be a finite duration, got {shown}")
    if seconds < 0 or (seconds == 0 and not zero):
        word = "at least 0" if zero else "more than 0"
        raise UserError(option, f"must be {word}, got {shown}")
    if not unit and bare == "ms" and 0 < seconds < 1e-3 and not small:
        raise UserError(option, f"a bare number is milliseconds, so {shown} is {shown} ms: "
                        f"write {shown}s for seconds, or {shown}ms if you mean it")  # fmt: skip
    return seconds


def duration_text(seconds: float) -> str:
    """A duration as an option takes it back: '2s', '200ms', '20us'."""
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= size or unit == "us":
            return f"{seconds / size:g}{unit}"
    raise AssertionError  # pragma: no cover
