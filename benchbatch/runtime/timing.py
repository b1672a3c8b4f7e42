"""The one timing harness: warm-up, repeats sized from the device's own time, raw times kept.

Every probe times through `measure`, on the device's backend (benchbatch/runtime/backend.py): on
CUDA each repeat is bracketed by CUDA events on the device's stream and preceded by an L2
flush outside the timed region; on CPU the host clock is the device clock.

The repeat count comes from the warm-up, as triton's do_bench sizes it: each warm-up call
is synchronised and timed on the device, and min_time / (one call's device time) repeats
follow. Counting min_time on the host clock instead would be wrong on a GPU: the host only
enqueues, runs far ahead of the device, and would queue hundreds of repeats. The warm-up
calls (queue empty) also give the host's time to enqueue one call. Whether a step is
launch-bound (the GPU waits for launches) comes from QUEUED_CALLS calls queued back to back
after the warm-up: see Measurement.launch_bound.

Steps whose times a verdict compares (prefill against decode, batch 1 against batch 128)
are timed together by `measure_interleaved`: their repeats alternate (A B A B, not A A B B),
so a load that comes and goes on a shared machine slows each of them alike and the ratio
between them holds. A noisy measurement can be taken again once (`retry_noisy`); the less
spread of the two attempts is kept.

Under torchrun every rank times the same call, and a call may hold collectives (a
tensor-parallel step's all-reduces) that need every rank to make it: the ranks agree on
each warm-up call and on the repeat count (the largest any rank wants), so each rank makes
exactly as many calls (benchbatch/runtime/distributed.py; without torchrun agreeing is free).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from benchbatch.core.noise import DEFAULT_CV_THRESHOLD
from benchbatch.core.options import TimingOptions  # noqa: F401  (the harness's options)
from benchbatch.runtime import backend, distributed

MAX_WARMUP_CALLS = 100
QUEUED_CALLS = 8  # calls queued back to back to see whether the device waits for the host
LAUNCH_MARGIN = 0.1  # a device within 10% of the host's enqueue rate waits for it


@dataclass
class Measurement:
    """Device times of the repeats; `host_times_ms` is the host's time to enqueue one call
    (None where the host runs the work itself, as on a CPU: there it is the device time)."""

    times_ms: list[float] = field(repr=False)
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    host_times_ms: list[float] | None = field(default=None, repr=False)
    attempts: int = 1  # 2: the first attempt was noisy, so it was measured again (the less
    # spread attempt is kept)
    interleaved: int = 1  # steps whose repeats alternated with this one's (itself included)
    queued_ms: float | None = None  # device time per call of QUEUED_CALLS queued at once
    queued_host_ms: float | None = None  # the host's time per call to enqueue them
    # Where the host runs the work (CPU): each repeat's wall time, and the clock of times_ms
    # ("cpu": the compute thread's CPU time; "wall"; "device": a GPU's events).
    wall_times_ms: list[float] | None = field(default=None, repr=False)
    clock: str = "device"

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
        if len(self.times_ms) < 2:  # one repeat measures no spread: unknown, not none
            return math.nan
        q1, _, q3 = statistics.quantiles(self.times_ms, n=4, method="inclusive")
        return q3 - q1

    def percentile_ms(self, q: int) -> float:
        """The q-th percentile (10, 90, ...) of the repeats, interpolated between them; NaN
        for one repeat (a p10-p90 of zero width would say the step had no noise)."""
        if len(self.times_ms) < 2:
            return math.nan
        return statistics.quantiles(self.times_ms, n=100, method="inclusive")[q - 1]

    @property
    def cv(self) -> float:
        """Coefficient of variation: standard deviation over mean (NaN for one repeat: its
        noise is unknown)."""
        mean = statistics.fmean(self.times_ms)
        if len(self.times_ms) < 2:
            return math.nan
        if mean <= 0:
            return 0.0
        return statistics.stdev(self.times_ms) / mean

    @property
    def noisy(self) -> bool:
        """Spread past the threshold, or timed once (nothing vouches for it: --repeats 1
        with a short --min-time; one wall-clock sample came out 160x the step's time)."""
        return self.repeats < 2 or self.cv > self.cv_threshold

    @property
    def host_ms(self) -> float:
        if not self.host_times_ms:
            return self.median_ms
        return statistics.median(self.host_times_ms)

    @property
    def wall_ms(self) -> float:
        """The median repeat's wall time where the host runs the work (NaN on a GPU)."""
        return statistics.median(self.wall_times_ms) if self.wall_times_ms else math.nan

    @property
    def core_share(self) -> float:
        """The share of its wall time the compute thread held a core (its CPU time over its
        wall time, all repeats): 1 on a quiet machine, 0.5 when another process took the
        core half the time. NaN where the device time is not a CPU clock."""
        if self.clock != "cpu" or not self.wall_times_ms or sum(self.wall_times_ms) <= 0:
            return math.nan
        return min(1.0, sum(self.times_ms) / sum(self.wall_times_ms))

    @property
    def launch_bound(self) -> bool:
        """The device waits for the host's launches (capture a graph, or batch more).

        A starved device's event time is the host's enqueue time plus the last kernel, so
        comparing one call's host and device times is a coin flip. N calls queued back to
        back take a device that keeps up N x its own time (plus one host enqueue before the
        first kernel), and a starved one N x the host's (plus its last kernel): so
        launch-bound when the queued time per call is at most the host's x (1 + 1/N +
        LAUNCH_MARGIN). Without that probe: one call's times, with the same margin."""
        if self.queued_ms is not None and self.queued_host_ms:
            slack = 1 + 1 / QUEUED_CALLS + LAUNCH_MARGIN
            return self.queued_ms <= self.queued_host_ms * slack
        return bool(self.host_times_ms) and self.host_ms >= self.median_ms * (1 - LAUNCH_MARGIN)

    def summary(self) -> dict:
        return {
            "step_ms": self.median_ms,
            "step_ms_min": self.min_ms,
            "step_ms_iqr": self.iqr_ms,
            "step_ms_p10": self.percentile_ms(10),
            "step_ms_p90": self.percentile_ms(90),
            "cv": self.cv,
            "repeats": self.repeats,
            "noisy": self.noisy,
            "attempts": self.attempts,
            "interleaved": self.interleaved,
            "host_ms": self.host_ms,
            "queued_ms": math.nan if self.queued_ms is None else self.queued_ms,
            "queued_host_ms": math.nan if self.queued_host_ms is None else self.queued_host_ms,
            "launch_bound": self.launch_bound,
            "clock": self.clock,
            "wall_ms": self.wall_ms,
            "core_share": self.core_share,
        }


def unmeasured() -> dict:
    """summary()'s columns for a row that was not measured (out of memory, skipped)."""
    nan = math.nan
    return {
        "step_ms": nan,
        "step_ms_min": nan,
        "step_ms_iqr": nan,
        "step_ms_p10": nan,
        "step_ms_p90": nan,
        "cv": nan,
        "repeats": 0,
        "noisy": False,
        "attempts": 0,
        "interleaved": 0,
        "host_ms": nan,
        "queued_ms": nan,
        "queued_host_ms": nan,
        "launch_bound": False,
        "clock": "",
        "wall_ms": nan,
        "core_share": nan,
    }


def prepare(device: torch.device, opts: TimingOptions) -> None:
    """Allocate what timing needs (the L2-flush buffer, once per device) before a step
    allocates its own tensors, so the buffer can never be what runs the step out of memory.
    """
    if opts.l2_flush:
        backend.of(device).flusher()


def measure(fn: Callable[[], object], device: torch.device, opts: TimingOptions) -> Measurement:
    """Time fn: warm up (synchronised, timed), then as many repeats as min_time_s of the
    device's time needs, at least min_repeats and at most max_repeats."""
    return measure_interleaved([fn], device, opts)[0]


def measure_interleaved(
    fns: Sequence[Callable[[], object]], device: torch.device, opts: TimingOptions
) -> list[Measurement]:
    """Time several prepared calls together: each is warmed up (and its repeat count sized
    from its own device time, as `measure` does), then the repeats run in rounds, every
    call in every round, so each call's repeats spread over the same stretch of time. A
    call that needs more repeats than the slowest takes several in each round. When
    opts.retry_noisy allows and any call came out noisy, the whole group is measured again
    (the ratios between the calls must come from one stretch of time): the attempt whose
    worst spread is smaller is kept."""
    best = _attempt(fns, device, opts)
    for attempt in range(2, 2 + opts.retry_noisy):
        # every rank retries, or none; a call timed once is retried to no purpose
        if not distributed.agree_any(any(m.noisy and m.repeats > 1 for m in best)):
            break
        again = _attempt(fns, device, opts)
        if _worst_cv(again) <= _worst_cv(best):
            best = again
        for m in best:
            m.attempts = attempt
    return best


def _worst_cv(ms: list[Measurement]) -> float:
    return max(m.cv if math.isfinite(m.cv) else math.inf for m in ms)


def _attempt(fns, device: torch.device, opts: TimingOptions) -> list[Measurement]:
    b = backend.of(device)
    with b.activate():
        flush = b.flusher() if opts.l2_flush else None
        warm = [_warm_up(fn, b, opts) for fn in fns]
        queued = [_queued(fn, b, flush) for fn in fns]
        # Under torchrun every rank makes as many calls: the largest count any rank wants.
        counts = [distributed.agree_max(repeat_count(warm_ms, opts)) for warm_ms, _ in warm]
        timers = [b.timer() for _ in fns]
        for per_call in rounds(counts):
            for fn, timer, n in zip(fns, timers, per_call, strict=True):
                for _ in range(n):
                    if flush is not None:
                        flush()
                    timer.time(fn)
        out = []
        for timer, (_, warm_host_ms), (q_ms, q_host) in zip(timers, warm, queued, strict=True):
            times_ms, host_ms = timer.read()  # queued: a running-ahead queue's, unused
            host = warm_host_ms if b.queued else None
            m = Measurement(times_ms, opts.cv_threshold, host, interleaved=len(fns))
            if not b.queued:  # the host ran each call: host_ms are their wall times
                m.wall_times_ms, m.clock = host_ms, getattr(timer, "clock", "wall")
            m.queued_ms, m.queued_host_ms = q_ms, q_host
            out.append(m)
    return out


def _queued(fn, b, flush) -> tuple[float | None, float | None]:
    """(device ms, host ms) per call of QUEUED_CALLS calls enqueued back to back, after a
    flush and an empty queue; (None, None) where nothing is queued (the host runs it)."""
    if not b.queued:
        return None, None
    if flush is not None:
        flush()
    b.synchronize()
    timer = b.timer()
    timer.time(lambda: [fn() for _ in range(QUEUED_CALLS)])
    (device_ms,), (host_ms,) = timer.read()
    return device_ms / QUEUED_CALLS, host_ms / QUEUED_CALLS


def rounds(counts: list[int]) -> list[list[int]]:
    """Repeats of each call in each round: as many rounds as the fewest repeats any call
    needs, each call's repeats spread evenly over them (a call needing 13 in 5 rounds takes
    2, 3, 2, 3, 3)."""
    n = min(counts)
    return [[(r + 1) * c // n - r * c // n for c in counts] for r in range(n)]


def repeat_count(call_ms: list[float], opts: TimingOptions) -> int:
    """min_time_s over one call's device time (the median of the timed warm-up calls)."""
    one = statistics.median(call_ms)
    wanted = math.ceil(opts.min_time_s * 1e3 / one) if one > 0 else opts.max_repeats
    return min(opts.max_repeats, max(opts.min_repeats, wanted))


def _warm_up(fn, b, opts: TimingOptions) -> tuple[list[float], list[float]]:
    """Keep first-call costs (allocation, autotuning, lazy init) out of the measurement.
    Each call is timed alone and waited for, so the queue is empty when the next one is
    enqueued: (device ms, host enqueue ms) of each call after the first."""
    device_ms: list[float] = []
    host_ms: list[float] = []
    start = time.perf_counter()
    while len(device_ms) < MAX_WARMUP_CALLS and distributed.agree_any(
        len(device_ms) < max(1, opts.warmup) or time.perf_counter() - start < opts.warmup_s
    ):
        timer = b.timer()
        timer.time(fn)
        d, h = timer.read()
        device_ms += d
        host_ms += h
    first = 1 if len(device_ms) > 1 else 0
    return device_ms[first:], host_ms[first:]


def synchronize(device: torch.device) -> None:
    """Wait until the device has run everything queued so far (a no-op on a CPU)."""
    backend.of(device).synchronize()
