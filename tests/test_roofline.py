"""Roofline arithmetic: mfu/mbu from the probe's ceilings, the bound flip, probe.csv back."""

from __future__ import annotations

import math

import pytest

from benchbatch.core import peaks
from benchbatch.core.roofline import (
    Ceilings,
    annotate,
    attainable_tflops,
    bound,
    ceilings_from_csv,
    ceilings_from_rows,
    from_datasheet,
    raised,
)
from benchbatch.errors import UserError
from benchbatch.output import results
from benchbatch.output.plots.roofline import roofline_figure

# 100 TFLOP/s and 2000 GB/s: ridge at 100e12 / 2000e9 = 50 FLOP/byte
CEIL = Ceilings("fp16", 100.0, 2000.0, "matmul 8192", "copy 1024 MiB")


def probe_rows() -> list[dict]:
    def row(kind, label, tflops, gbps, status="ok"):
        return {
            "kind": kind,
            "label": label,
            "dtype": "fp16",
            "tflops": tflops,
            "gbps": gbps,
            "status": status,
        }

    return [
        row("matmul", "matmul 2048", 60.0, 30.0),
        row("matmul", "matmul 4096", 100.0, 25.0),
        row("matmul", "matmul 8192", math.nan, math.nan, "oom"),
        row("copy", "copy 1024 MiB", 0.0, 2000.0),
        row("read", "read 1024 MiB", 0.4, 1600.0),
    ]


def test_ridge_is_peak_flops_over_bandwidth():
    assert CEIL.ridge == pytest.approx(50.0)
    assert CEIL.to_dict()["ridge"] == pytest.approx(50.0)


def test_annotate_divides_by_the_measured_ceilings():
    row = {"label": "decode b=1", "tflops": 2.5, "gbps": 1500.0, "arithmetic_intensity": 1.7}
    out = annotate(row, CEIL)
    assert out["mfu"] == pytest.approx(2.5 / 100.0)
    assert out["mbu"] == pytest.approx(1500.0 / 2000.0)
    assert out["bound"] == "memory"
    assert "mfu" not in row  # the input row is left as it was
    assert out["label"] == "decode b=1"


def test_mfu_and_mbu_come_from_the_probe_rows():
    ceil = ceilings_from_rows(probe_rows())
    assert (ceil.peak_tflops, ceil.tflops_source) == (100.0, "matmul 4096")
    assert (ceil.peak_gbps, ceil.gbps_source) == (2000.0, "copy 1024 MiB")
    out = annotate({"tflops": 80.0, "gbps": 400.0, "arithmetic_intensity": 200.0}, ceil)
    assert out["mfu"] == pytest.approx(0.8)
    assert out["mbu"] == pytest.approx(0.2)
    assert out["bound"] == "compute"


def test_bound_flips_at_the_ridge():
    ridge = CEIL.ridge
    assert bound(ridge * 0.999, ridge) == "memory"
    assert bound(ridge, ridge) == "compute"
    assert bound(ridge * 1.001, ridge) == "compute"
    assert [annotate({"arithmetic_intensity": x}, CEIL)["bound"] for x in (49.9, 50.1)] == [
        "memory",
        "compute",
    ]


def test_unmeasured_row_gets_nan_not_an_error():
    out = annotate({"tflops": math.nan, "gbps": None, "arithmetic_intensity": None}, CEIL)
    assert math.isnan(out["mfu"]) and math.isnan(out["mbu"]) and out["bound"] is None


def test_a_skipped_or_oom_row_is_under_no_roof():
    # Its intensity is accounted (2,000 FLOP/B: far above the ridge), but nothing ran.
    for status in ("skipped", "oom"):
        row = {"status": status, "tflops": math.nan, "arithmetic_intensity": 2000.0}
        out = annotate(row, CEIL)
        assert out["bound"] is None and math.isnan(out["mfu"]) and math.isnan(out["mbu"])


def test_a_row_over_a_roof_raises_that_roof_to_it():
    assert raised(CEIL, {"label": "prefill 512", "tflops": 90.0, "gbps": 1900.0}) is None
    higher = raised(CEIL, {"label": "prefill 2048", "tflops": 134.0, "gbps": 20.0})
    assert (higher.peak_tflops, higher.peak_gbps) == (134.0, 2000.0)
    assert higher.tflops_source == "prefill 2048 (over the probe)"
    assert higher.gbps_source == CEIL.gbps_source
    assert higher.ridge == pytest.approx(134e12 / 2000e9)
    both = raised(CEIL, {"label": "x", "tflops": 101.0, "gbps": 2180.0})
    assert (both.peak_tflops, both.peak_gbps) == (101.0, 2180.0)
    assert annotate({"tflops": 134.0, "gbps": 20.0, "arithmetic_intensity": 1e3}, higher)[
        "mfu"
    ] == pytest.approx(1.0)
    assert raised(CEIL, {"status": "oom", "tflops": 500.0}) is None


def test_roof_is_bandwidth_slope_then_flat_peak():
    assert attainable_tflops(10.0, 100.0, 2000.0) == pytest.approx(10.0 * 2000.0 / 1e3)
    assert attainable_tflops(50.0, 100.0, 2000.0) == pytest.approx(100.0)
    assert attainable_tflops(500.0, 100.0, 2000.0) == 100.0


def test_datasheet_ceilings_and_unknown_devices():
    h100 = from_datasheet(peaks.lookup("NVIDIA H100 80GB HBM3"), "fp16")
    assert h100.ridge == pytest.approx(989e12 / 3350e9)  # about 295, as the articles say
    assert from_datasheet(peaks.lookup("AMD EPYC"), "fp32") is None
    assert from_datasheet(peaks.lookup("Tesla T4"), "bf16") is None  # no bf16 on a T4


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),  # not the SXM part: 835 TFLOP/s, not 989
        ("NVIDIA GH200 480GB", None),  # a Grace Hopper superchip, not an H200
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 4090 D", None),  # a cut-down 4090: no guess
        ("Tesla V100-PCIE-32GB", None),  # slower clocks than the SXM2 part
        ("NVIDIA H800", None),
    ],
)
def test_a_datasheet_entry_matches_the_whole_gpu_name(name, entry):
    peak = peaks.lookup(name)
    assert (peak.name if peak else None) == entry


def test_every_datasheet_key_finds_its_own_entry():
    assert all(peaks.lookup(key) is peak for key, peak in peaks.KNOWN)
    assert peaks.lookup("NVIDIA H200 NVL").tflops["fp16"] == 835


def test_probe_rows_without_a_matmul_or_memory_row_are_refused():
    with pytest.raises(ValueError, match="matmul"):
        ceilings_from_rows([r for r in probe_rows() if r["kind"] != "matmul"])
    with pytest.raises(ValueError, match="memory"):
        ceilings_from_rows([r for r in probe_rows() if r["kind"] == "matmul"])


def test_ceilings_from_csv_round_trip(tmp_path):
    path = tmp_path / "probe.csv"
    results.write_csv(path, probe_rows())
    assert ceilings_from_csv(path) == ceilings_from_rows(probe_rows())


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not,a,probe\n1,2,3\n",
        "\x00\x01garbage",
        "kind,label,dtype,tflops,gbps,status\nmatmul,matmul 64,fp32,fast,1,ok\n",
        "kind,label,dtype,tflops,gbps,status\ncopy,copy 1 MiB,fp32,0,5,ok\n",
    ],
)
def test_corrupt_probe_csv_is_a_user_error_naming_the_file(tmp_path, text):
    path = tmp_path / "probe.csv"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        ceilings_from_csv(path)
    assert str(path) in err.value.message


def test_missing_probe_csv_is_a_user_error_naming_the_file(tmp_path):
    path = tmp_path / "nowhere" / "probe.csv"
    with pytest.raises(UserError, match="does not exist") as err:
        ceilings_from_csv(path, option="--probe")
    assert str(path) in err.value.message and err.value.option == "--probe"


def test_roofline_figure_is_written(tmp_path):
    rows = [
        {
            "phase": "prefill",
            "label": "prefill 512",
            "arithmetic_intensity": 300.0,
            "tflops": 70.0,
            "status": "ok",
            "source": "phases",
        },
        {
            "phase": "decode",
            "label": "decode b=1",
            "arithmetic_intensity": 1.0,
            "tflops": 0.3,
            "status": "ok",
            "source": "phases",
        },
        {
            "phase": "decode",
            "label": "b=32",
            "arithmetic_intensity": 30.0,
            "tflops": 12.0,
            "status": "ok",
            "source": "sweep",
        },
        {
            "phase": "decode",
            "label": "b=256",
            "arithmetic_intensity": 200.0,
            "tflops": math.nan,
            "status": "oom",
            "source": "sweep",
        },
    ]
    path = tmp_path / "roofline.png"
    roofline_figure(rows, CEIL, path, datasheet_peak=peaks.lookup("NVIDIA H100"), title="t")
    assert path.exists() and path.stat().st_size > 1000


def test_roofline_figure_without_points_or_datasheet(tmp_path):
    path = tmp_path / "empty.png"
    roofline_figure([], Ceilings("fp32", 0.1, 20.0), path)
    assert path.stat().st_size > 0


def test_a_probe_csv_without_rows_says_which(tmp_path):
    """A file of bytes with no line break was called "empty"."""
    from benchbatch.core.roofline import ceilings_from_csv

    for text, said in (("", "is empty"), ("abc\x00def\n", "has no rows under a header"),
                       ("kind,label\nmatmul,x\n", "lacks column(s) dtype")):  # fmt: skip
        path = tmp_path / "probe.csv"
        path.write_text(text)
        with pytest.raises(UserError) as e:
            ceilings_from_csv(path)
        assert said in e.value.message, e.value.message
