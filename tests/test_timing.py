import math
import time

import pytest
import torch

from benchbatch.runtime import backend, timing
from benchbatch.runtime.timing import (
    Measurement,
    TimingOptions,
    measure,
    measure_interleaved,
    rounds,
)


def test_statistics_of_known_times():
    m = Measurement([4.0, 1.0, 3.0, 2.0, 5.0])
    assert m.median_ms == 3.0 and m.min_ms == 1.0 and m.repeats == 5
    assert m.iqr_ms == pytest.approx(2.0)  # quartiles 2 and 4 (inclusive method)
    assert m.cv == pytest.approx(1.5811388 / 3.0)
    assert m.noisy  # 53% spread
    assert not Measurement([10.0, 10.1, 9.9]).noisy


class FakeClock:
    """The harness's clock, advanced by the timed calls only: no test depends on how busy
    the machine is (with real sleeps, a loaded machine stretched them past the time bound)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    thread_time = perf_counter  # one compute thread: the CPU's timer reads its CPU clock


def test_repeats_reach_both_count_and_time(monkeypatch):
    clock, calls = FakeClock(), []
    monkeypatch.setattr(timing, "time", clock)
    monkeypatch.setattr(backend, "time", clock)  # the CPU's timer of each call

    def work() -> None:
        calls.append(1)
        clock.now += 1 / 64  # binary fractions: the sums are exact

    opts = TimingOptions(min_repeats=3, min_time_s=4 / 64, warmup=2, warmup_s=0.0)
    m = measure(work, torch.device("cpu"), opts)
    assert m.repeats == 4  # the time bound: 4 calls of 1/64 s, one more than min_repeats
    assert len(calls) == m.repeats + 2  # warm-up calls are not timed
    assert m.times_ms == [1000 / 64] * 4


def test_count_bound_when_calls_are_slow():
    opts = TimingOptions(min_repeats=3, min_time_s=0.0, warmup=1, warmup_s=0.0)
    m = measure(lambda: time.sleep(0.002), torch.device("cpu"), opts)
    assert m.repeats == 3
    assert set(m.summary()) == {
        *("step_ms", "step_ms_min", "step_ms_iqr", "step_ms_p10", "step_ms_p90", "cv"),
        *("repeats", "noisy", "attempts", "interleaved", "host_ms", "launch_bound"),
        *("queued_ms", "queued_host_ms"),  # CUDA's queued launch-bound probe: NaN here
        *("clock", "wall_ms", "core_share"),  # a CPU's clocks (tests/test_cpu_clock.py)
    }
    # On a CPU the host runs the work: its time is the device time, and nothing is queued.
    assert m.summary()["host_ms"] == m.median_ms and m.summary()["launch_bound"] is False


def test_percentiles_interpolate_between_repeats():
    m = Measurement([float(x) for x in range(1, 12)])  # 1 .. 11 ms
    assert m.percentile_ms(10) == pytest.approx(2.0)
    assert m.percentile_ms(50) == pytest.approx(m.median_ms) == 6.0
    assert m.percentile_ms(90) == pytest.approx(10.0)
    # one repeat measures no spread: unknown, and the step flagged (a p10-p90 of 7.0-7.0,
    # CV 0 and "not noisy" said a single wall-clock sample 160x the step's time was clean)
    once = Measurement([7.0])
    assert math.isnan(once.percentile_ms(90)) and math.isnan(once.cv)
    assert math.isnan(once.iqr_ms) and once.noisy
    assert not Measurement([7.0, 7.0]).noisy and Measurement([7.0, 7.0]).cv == 0.0


class ScriptedBackend:
    """A device whose calls take the time they return (ms): timing without a clock."""

    graphs = queued = False
    flush_error = None
    device = torch.device("cpu")

    def activate(self):
        import contextlib

        return contextlib.nullcontext()

    def flusher(self):
        return None

    def timer(self):
        return ScriptedTimer()


class ScriptedTimer:
    def __init__(self):
        self.ms = []

    def time(self, fn):
        self.ms.append(fn())

    def read(self):
        return list(self.ms), list(self.ms)


def test_rounds_spread_each_calls_repeats_over_every_round():
    assert rounds([5, 13, 5]) == [[1, 2, 1], [1, 3, 1], [1, 2, 1], [1, 3, 1], [1, 3, 1]]
    assert [sum(col) for col in zip(*rounds([4, 9, 30]), strict=True)] == [4, 9, 30]
    assert len(rounds([4, 9, 30])) == 4


def test_interleaved_repeats_alternate_between_the_calls():
    order = []
    slow = lambda: (order.append("A"), 40.0)[1]  # noqa: E731
    fast = lambda: (order.append("B"), 10.0)[1]  # noqa: E731
    opts = TimingOptions(min_repeats=3, min_time_s=0.1, warmup=1, warmup_s=0.0)
    with backend.use(ScriptedBackend()):
        a, b = measure_interleaved([slow, fast], torch.device("cpu"), opts)
    # Warm-up: each call once, alone; then 3 rounds (A needs 100 / 40 -> 3 repeats, B
    # 100 / 10 -> 10), B's ten spread as 3, 3, 4.
    assert order[:2] == ["A", "B"]
    timed = "".join(order[2:])
    assert timed == "ABBB" + "ABBB" + "ABBBB"
    assert (a.repeats, b.repeats) == (3, 10)
    assert a.median_ms == 40.0 and b.median_ms == 10.0
    assert a.interleaved == b.interleaved == 2 and a.attempts == 1


def test_a_noisy_group_is_measured_again_and_the_steadier_attempt_kept():
    times = iter([5.0, 5.0] + [5.0, 50.0, 5.0] + [5.0, 5.1, 5.0])  # warm-ups, then repeats
    calls = []

    def fn():
        calls.append(1)
        return next(times, 5.0)

    opts = TimingOptions(min_repeats=3, min_time_s=0.0, warmup=1, warmup_s=0.0, retry_noisy=1)
    with backend.use(ScriptedBackend()):
        [m] = measure_interleaved([fn], torch.device("cpu"), opts)
    assert m.attempts == 2 and not m.noisy and m.times_ms == [5.0, 5.1, 5.0]
    once = TimingOptions(min_repeats=3, min_time_s=0.0, warmup=1, warmup_s=0.0)
    times = iter([5.0, 5.0] + [5.0, 50.0, 5.0])
    with backend.use(ScriptedBackend()):
        [m] = measure_interleaved([fn], torch.device("cpu"), once)
    assert m.attempts == 1 and m.noisy
