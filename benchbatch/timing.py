"""The one timing harness: warm-up, repeats bounded by a count and a time, raw times kept.

Every probe times through `measure`. On CUDA each repeat is bracketed by CUDA events (the
host clock would time the launch, not the work) and, when asked, preceded by an L2 flush
outside the timed region; on CPU the host clock is the device clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchbatch import cuda
from benchbatch.noise import DEFAULT_CV_THRESHOLD


@dataclass(frozen=True)
class TimingOptions:
    min_repeats: int = 5
    min_time_s: float = 0.2
    warmup: int = 2
    warmup_s: float = 0.05
    max_repeats: int = 1000
    l2_flush: bool = True
    cv_threshold: float = DEFAULT_CV_THRESHOLD


@dataclass
class Measurement:
    times_ms: list[float] = field(repr=False)
    cv_threshold: float = DEFAULT_CV_THRESHOLD

    @property
    def repeats(self) -> int:
        return len(self.times_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def iqr_ms(self) -> float:
        if len(self.times_ms) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times_ms, n=4, method="inclusive")
        return q3 - q1

    @property
    def cv(self) -> float:
        """Coefficient of variation: standard deviation over mean."""
        if len(self.times_ms) < 2:
            return 0.0
        return statistics.stdev(self.times_ms) / statistics.fmean(self.times_ms)

    @property
    def noisy(self) -> bool:
        return self.cv > self.cv_threshold

    def summary(self) -> dict:
        return {
            "step_ms": self.median_ms,
            "step_ms_min": self.min_ms,
            "step_ms_iqr": self.iqr_ms,
            "cv": self.cv,
            "repeats": self.repeats,
            "noisy": self.noisy,
        }


def measure(fn: Callable[[], object], device: torch.device, opts: TimingOptions) -> Measurement:
    """Time fn: warm up, then repeat until both min_repeats and min_time_s are reached."""
    _warm_up(fn, device, opts)
    timer = cuda.EventTimer() if device.type == "cuda" else HostTimer()
    flush = cuda.l2_flusher(device) if device.type == "cuda" and opts.l2_flush else None
    start = time.perf_counter()
    while timer.count < opts.max_repeats and (
        timer.count < opts.min_repeats or time.perf_counter() - start < opts.min_time_s
    ):
        if flush is not None:
            flush()
        timer.time(fn)
    return Measurement(timer.elapsed_ms(), opts.cv_threshold)


def _warm_up(fn, device: torch.device, opts: TimingOptions) -> None:
    """Keep first-call costs (allocation, autotuning, lazy init) out of the measurement."""
    start = time.perf_counter()
    done = 0
    while done < opts.warmup or time.perf_counter() - start < opts.warmup_s:
        fn()
        done += 1
        synchronize(device)
        if done >= 100:
            break


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class HostTimer:
    """perf_counter around each call: right where the host runs the work itself (CPU)."""

    def __init__(self):
        self._ms: list[float] = []

    @property
    def count(self) -> int:
        return len(self._ms)

    def time(self, fn) -> None:
        t0 = time.perf_counter()
        fn()
        self._ms.append((time.perf_counter() - t0) * 1e3)

    def elapsed_ms(self) -> list[float]:
        return list(self._ms)
