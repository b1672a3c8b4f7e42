import time

import pytest
import torch

from benchbatch import backend, timing
from benchbatch.timing import Measurement, TimingOptions, measure


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
        *("step_ms", "step_ms_min", "step_ms_iqr", "cv", "repeats", "noisy"),
        *("host_ms", "launch_bound"),
    }
    # On a CPU the host runs the work: its time is the device time, and nothing is queued.
    assert m.summary()["host_ms"] == m.median_ms and m.summary()["launch_bound"] is False
