"""Energy and cost per token: the arithmetic checked exactly against a fake counter (NVML
through a fake pynvml, RAPL through a fake sysfs folder, wraparound included), "not
available" said where there is no counter, and --price-per-hour's cost per million tokens
in sweep.csv and in serve-sweep's columns."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
from test_telemetry import FakeNvml, on_gpu

from benchbatch.app.cli import app
from benchbatch.core import energy
from benchbatch.errors import UserError
from benchbatch.experiments.serve.options import ServeOptions
from benchbatch.experiments.sweep import probe as sweep_probe
from benchbatch.experiments.sweep.options import SweepOptions
from benchbatch.runtime import energy_meter
from benchbatch.runtime.timing import TimingOptions

GPU = torch.device("cuda", 1)


class EnergyNvml(FakeNvml):
    """The fake GPUs with a total-energy counter (millijoules) read from a list in turn."""

    def __init__(self, millijoules, **kw):
        super().__init__(**kw)
        self.counter = iter(millijoules)
        self.asked = []

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.asked.append(h)
        return next(self.counter)


@pytest.fixture(autouse=True)
def no_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def fake_clock(monkeypatch, *times):
    ticks = iter(times)
    monkeypatch.setattr(energy_meter._Span, "clock", staticmethod(lambda: next(ticks)))


def test_nvml_counter_gives_the_span_energy_and_joules_per_token(monkeypatch):
    # 1,000,000 mJ then 1,012,500 mJ (the first read checks the call exists): 12.5 J in
    # 0.25 s is 50 W; a step of 2 ms making 4 tokens then costs 50 x 0.002 / 4 = 0.025 J.
    nvml = EnergyNvml([0, 1_000_000, 1_012_500])
    with on_gpu(monkeypatch, nvml):
        meter = energy_meter.EnergyMeter(GPU)
        fake_clock(monkeypatch, 10.0, 10.25)
        with meter.span() as span:
            pass
        meter.close()
    assert meter.available and meter.source == "NVML total energy (cuda:1)"
    assert span.reading == energy.Reading(12.5, 0.25, "NVML total energy (cuda:1)")
    assert span.reading.power_w == 50.0
    row = energy.with_step_energy({"status": "ok", "step_ms": 2.0, "batch": 4}, span.reading)
    assert row["joules_per_token"] == pytest.approx(0.025, rel=1e-12)
    assert row["avg_power_w"] == 50.0 and row["energy_span_s"] == 0.25
    assert len(set(nvml.asked)) == 1  # one GPU's counter, found by its UUID


def test_laps_read_consecutive_runs(monkeypatch):
    nvml = EnergyNvml([0, 5_000, 9_000, 30_000])
    with on_gpu(monkeypatch, nvml):
        meter = energy_meter.EnergyMeter(GPU)
        fake_clock(monkeypatch, 0.0, 2.0, 3.0)
        meter.start()
        first, second = meter.lap(), meter.lap()
    assert (first.joules, first.seconds) == (4.0, 2.0)
    assert (second.joules, second.seconds) == (21.0, 1.0)


def test_a_gpu_without_the_counter_says_not_available(monkeypatch):
    # FakeNvml has no nvmlDeviceGetTotalEnergyConsumption: AttributeError, as a binding
    # too old for the call; a pre-Volta GPU answers NotSupported the same way
    with on_gpu(monkeypatch, FakeNvml()):
        meter = energy_meter.EnergyMeter(GPU)
        with meter.span() as span:
            pass
    assert not meter.available
    assert meter.source.startswith("not available: this GPU or driver has no total-energy")
    assert span.reading.joules is None and span.reading.source == meter.source
    row = energy.with_step_energy({"status": "ok", "step_ms": 2.0, "batch": 4}, span.reading)
    assert math.isnan(row["joules_per_token"]) and row["energy_source"] == meter.source


def rapl(folder, zones: dict[str, tuple[int, int]], sub: bool = True):
    """A fake /sys/class/powercap: zone -> (energy_uj, max_energy_range_uj)."""
    for name, (uj, wrap) in zones.items():
        zone = folder / name
        zone.mkdir(parents=True, exist_ok=True)
        (zone / "energy_uj").write_text(f"{uj}\n")
        (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
        (zone / "name").write_text(f"package-{name[-1]}\n")
        if sub:  # a core subzone: part of the package, never added to it
            core = folder / f"{name}:0"
            core.mkdir(exist_ok=True)
            (core / "energy_uj").write_text("999999999\n")
            (core / "max_energy_range_uj").write_text("1000000000\n")
    return folder


def test_rapl_packages_summed_through_their_wraparound(tmp_path, monkeypatch):
    root = rapl(tmp_path, {"intel-rapl:0": (999_000, 1_000_000), "intel-rapl:1": (5_000, 10**9)})
    meter = energy_meter.EnergyMeter(torch.device("cpu"), rapl_root=root)
    assert meter.available and meter.source == "RAPL package-0, package-1"
    fake_clock(monkeypatch, 0.0, 0.5)
    with meter.span() as span:
        # package 0 wraps: 999,000 -> 1,000,000 -> 0 -> 3,000 is 4,000 uJ; package 1 grows
        # 300,000 uJ: 0.304 J in all
        rapl(tmp_path, {"intel-rapl:0": (3_000, 1_000_000), "intel-rapl:1": (305_000, 10**9)})
    assert span.reading.joules == pytest.approx(0.304, rel=1e-12)
    assert span.reading.power_w == pytest.approx(0.608, rel=1e-12)


def test_counter_growth_and_a_reset():
    assert energy.counter_growth(10, 25) == 15
    assert energy.counter_growth(990, 15, wrap=1000) == 25
    with pytest.raises(ValueError, match="went down"):
        energy.counter_growth(990, 15)


def test_rapl_absent_or_unreadable_is_not_available(tmp_path):
    zones, why = energy.rapl_zones(tmp_path / "nope")
    assert zones == [] and why.startswith("no RAPL counters")
    root = rapl(tmp_path / "ro", {"intel-rapl:0": (1, 10)}, sub=False)
    (root / "intel-rapl:0" / "energy_uj").unlink()
    (root / "intel-rapl:0" / "energy_uj").mkdir()  # unreadable as a file, even by root
    meter = energy_meter.EnergyMeter(torch.device("cpu"), rapl_root=root)
    assert not meter.available
    assert meter.source.startswith("not available: RAPL counters not readable")
    assert meter.describe() == {"available": False, "source": meter.source}


def test_cost_per_million_tokens_is_price_over_seconds_per_token():
    # $3.60 an hour is $0.001 a second: 8,000 tokens in 40 s cost $0.04, $5 a million
    assert energy.cost_per_million_tokens(3.6, 40.0, 8000) == pytest.approx(5.0, rel=1e-12)
    assert math.isnan(energy.cost_per_million_tokens(3.6, 40.0, 0))
    step = {"status": "ok", "step_ms": 5.0, "batch": 8}
    assert energy.step_cost_columns(step, 7.2)["usd_per_million_tokens"] == pytest.approx(1.25)
    assert energy.step_cost_columns(step, None) == {}
    skipped = energy.step_cost_columns({**step, "status": "skipped"}, 7.2)
    assert math.isnan(skipped["usd_per_million_tokens"])


def test_serve_columns_of_a_real_and_a_simulated_point():
    row = {"duration_s": 40.0, "output_tokens": 8000}
    real = energy.serve_columns(row, energy.Reading(200.0, 40.0, "NVML total energy"), 3.6)
    assert real["joules_per_output_token"] == pytest.approx(0.025, rel=1e-12)
    assert real["avg_power_w"] == 5.0 and real["energy_j"] == 200.0
    assert real["usd_per_million_output_tokens"] == pytest.approx(5.0, rel=1e-12)
    # a span longer than the point (the engine's warm-up before it): its average power,
    # 300 J / 60 s = 5 W, times the point's own 40 s
    longer = energy.serve_columns(row, energy.Reading(300.0, 60.0, "NVML total energy"), None)
    assert longer["energy_j"] == 200.0 and longer["joules_per_output_token"] == 0.025
    external = energy.serve_columns(row, None, None, why="served at http://host:8000")
    assert external["energy_source"] == "not available: served at http://host:8000"
    sim = energy.serve_columns(row, None, None)
    assert math.isnan(sim["joules_per_output_token"])
    assert sim["energy_source"] == "not available: simulated (no device ran)"
    assert "usd_per_million_output_tokens" not in sim


def test_price_must_be_positive():
    with pytest.raises(UserError) as e:
        SweepOptions(price_per_hour=0.0)
    assert e.value.option == "price_per_hour"
    with pytest.raises(UserError):
        ServeOptions(price_per_hour=-1.0)
    assert ServeOptions(price_per_hour=2.5).price_per_hour == 2.5


class FakeMeter:
    """A meter whose every span read 3 J over 0.5 s (6 W)."""

    def __init__(self, device):
        self.spans = 0

    def span(self):
        meter = self

        class Span:
            reading = None

            def __enter__(self):
                meter.spans += 1
                return self

            def __exit__(self, *exc):
                self.reading = energy.Reading(3.0, 0.5, "fake counter")

        return Span()

    def close(self):
        pass


def test_sweep_rows_carry_the_span_power_times_their_step(monkeypatch, tiny_model):
    monkeypatch.setattr(energy_meter, "EnergyMeter", FakeMeter)
    plan = sweep_probe.plan([8], [1, 2, 64])
    timing = TimingOptions(min_repeats=1, min_time_s=0.0, warmup=0, warmup_s=0.0)
    rows = list(sweep_probe.rows(tiny_model, "fp32", plan, timing, {8: 4}))
    ok = [r for r in rows if r["status"] == "ok"]
    assert [r["batch"] for r in ok] == [1, 2]
    for r in ok:  # 6 W x the row's own step time over its tokens
        assert r["joules_per_token"] == pytest.approx(6.0 * r["step_ms"] / 1e3 / r["batch"])
        assert r["energy_source"] == "fake counter"
    (skipped,) = [r for r in rows if r["status"] == "skipped"]
    assert math.isnan(skipped["joules_per_token"])
    assert skipped["energy_source"] == "not available: the step was not timed"


def test_sweep_csv_and_view_say_not_available_and_price_the_steps(runner, tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device", "cpu",
            "--no-roofline", "--batch", "1,2", "--context", "8", "--price-per-hour", "3.6",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "sweep.csv")
    expected = 3.6 / 3600 * df["step_ms"] / 1e3 / df["batch"] * 1e6
    assert (df["usd_per_million_tokens"] - expected).abs().max() < 1e-9 * expected.max()
    assert "joules_per_token" in df.columns
    meta = json.loads((out / "metadata.json").read_text())
    if not energy_meter.EnergyMeter(torch.device("cpu")).available:  # no RAPL here
        assert df["joules_per_token"].isna().all()
        assert df["energy_source"].str.startswith("not available").all()
        assert meta["energy"]["available"] is False
        assert "energy per token: not available" in result.output
    assert "cost per million tokens at $3.6/h" in result.output


def test_a_serving_runs_energy_is_said_of_its_measured_points_in_both_places():
    """serve-sweep's metadata said "simulated (no device ran)" while the terminal, from the
    real points, said no RAPL counters: both now read the measured points (else the max)."""
    from benchbatch.core import energy

    rows = [{"source": "sim", "rate": "max", "energy_source": "not available: simulated"},
            {"source": "sim", "rate": "2"},
            {"source": "real", "rate": "2", "energy_source": "not available: no RAPL"}]  # fmt: skip
    assert energy.measured_points(rows) == rows[2:]
    assert energy.measured_points(rows[:2]) == rows[:1]
    assert energy.summary(energy.measured_points(rows))["source"].endswith("no RAPL")
