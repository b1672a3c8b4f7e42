"""The ceilings probe on the CPU (tiny sizes) and the `benchbatch probe` command."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from benchbatch.app.cli import app
from benchbatch.core.roofline import ceilings_from_csv
from benchbatch.runtime import ceilings as probes
from benchbatch.runtime import layout
from benchbatch.runtime.timing import TimingOptions

CPU = torch.device("cpu")
FAST = TimingOptions(min_repeats=2, min_time_s=0.0, warmup=1, warmup_s=0.0)
RUNNER = CliRunner()
TINY = ["--sizes", "64,128", "--buffer-mb", "2", "--repeats", "2", "--min-time", "0"]


def test_counted_work_of_each_probe():
    assert probes.cost(probes.Probe("matmul", 1024), "fp16") == (2 * 1024**3, 3 * 1024**2 * 2)
    assert probes.cost(probes.Probe("copy", 8 * probes.MiB), "fp32") == (0, 16 * probes.MiB)
    read = probes.cost(probes.Probe("read", 8 * probes.MiB), "bf16")
    assert read == (4 * probes.MiB, 8 * probes.MiB)  # one add per 2-byte element


def test_probe_gives_positive_finite_ceilings_on_cpu():
    plan = probes.plan([64, 128], 2 * probes.MiB)
    rows, ceil = probes.measure_ceilings(CPU, "fp32", FAST, plan)
    assert [r["kind"] for r in rows] == ["matmul", "matmul", "copy", "read"]
    assert all(r["status"] == "ok" and r["step_ms"] > 0 for r in rows)
    for value in (ceil.peak_tflops, ceil.peak_gbps, ceil.ridge):
        assert math.isfinite(value) and value > 0
    assert ceil.peak_tflops == max(r["tflops"] for r in rows if r["kind"] == "matmul")
    assert ceil.peak_gbps == max(r["gbps"] for r in rows if r["kind"] != "matmul")
    assert ceil.dtype == "fp32"


def test_operands_are_random_not_zeros():
    # zeros run faster on some hardware: a ceiling measured on them would be too high
    fn = probes.work(probes.Probe("read", probes.MiB), CPU, "fp32")
    assert fn().item() != 0.0


def test_default_plan_fits_a_cpu():
    plan = probes.default_plan(CPU)
    assert {p.kind for p in plan} == {"matmul", "copy", "read"}
    assert max(p.size for p in plan if p.kind == "matmul") <= 2048
    assert plan[-1].size <= 256 * probes.MiB


@pytest.mark.parametrize("call_ms, sizes", [
    (0.5, (1024, 2048)),  # a 2048 product 256 ms: the defaults kept
    (7.0, (1024,)),  # 1024 at 0.45 s kept, 2048 (3.6 s) halved to 1024
    (100.0, (256,)),  # fp16 with no fp16 units: a 256 product 0.1 s, nothing larger fits
])  # fmt: skip
def test_a_slow_dtypes_products_are_sized_to_finish(monkeypatch, call_ms, sizes):
    """--dtype fp16 on a CPU probed 1024 and 2048 products (43 s a call): minutes."""
    from benchbatch.runtime.timing import Measurement

    monkeypatch.setattr(probes, "measure", lambda fn, dev, opts: Measurement([call_ms]))
    assert probes.cpu_sizes(CPU, "fp16") == sizes
    assert probes.cpu_sizes(CPU, "fp32") == probes.MATMUL_SIZES["cpu"]  # not timed
    planned = [p for p in probes.default_plan(CPU, "bf16") if p.kind == "matmul"]
    assert [p.size for p in planned if not p.packed] == list(sizes)
    # each size packed too where the engine may run bf16 packed (runtime/layout.py)
    packed = [p.size for p in planned if p.packed]
    assert packed == (list(sizes) if layout.packable(CPU, torch.bfloat16) else [])


@pytest.mark.skipif(not layout.packable(CPU, torch.float32), reason="no oneDNN linear here")
def test_a_packed_matmul_probe_computes_the_same_product():
    """A packed probe (the engine's packed projections' kernel) computes the a @ b its
    strided twin does, on the same operands: its 2 n^3 FLOPs are the product's."""
    plain = probes.work(probes.Probe("matmul", 96), CPU, "fp32", seed=3)()
    packed = probes.work(probes.Probe("matmul", 96, packed=True), CPU, "fp32", seed=3)()
    torch.testing.assert_close(packed, plain, rtol=1e-4, atol=1e-4)
    assert probes.Probe("matmul", 96, packed=True).label == "matmul 96 packed"
    assert probes.cost(probes.Probe("matmul", 96, packed=True), "fp32") == probes.cost(
        probes.Probe("matmul", 96), "fp32")  # fmt: skip


def test_probe_command_writes_probe_csv(tmp_path):
    out = tmp_path / "run"
    result = RUNNER.invoke(app, ["probe", "--device", "cpu", "--out", str(out), *TINY])
    assert result.exit_code == 0, result.output
    for name in ("probe.csv", "metadata.json", "roofline.png"):
        assert (out / name).stat().st_size > 0, name
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "complete"
    measured = meta["summary"]["measured"]
    assert ceilings_from_csv(out / "probe.csv").peak_tflops == pytest.approx(
        measured["peak_tflops"], rel=1e-5
    )  # the CSV keeps 6 significant digits
    assert meta["summary"]["datasheet_name"] == "unknown"
    assert "H200 SXM" in result.output and "RTX 5080" in result.output


def test_probe_command_json(tmp_path):
    args = ["probe", "--device", "cpu", "--out", str(tmp_path), "--force", "--json", *TINY]
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    packed = layout.packable(CPU, torch.float32)  # each matmul timed packed too
    assert len(doc["rows"]) == (6 if packed else 4)
    assert doc["summary"]["measured"]["peak_gbps"] > 0
    labels = [r["label"] for r in doc["rows"] if r["kind"] == "matmul"]
    assert any(label.endswith(" packed") for label in labels) == packed


@pytest.mark.parametrize(
    "args, option",
    [(["--sizes", "64,x"], "--sizes"), (["--buffer-mb", "0"], "--buffer-mb")],
)
def test_bad_sizes_are_user_errors(tmp_path, args, option):
    result = RUNNER.invoke(app, ["probe", "--device", "cpu", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert option in result.output


def test_out_of_memory_is_a_row_and_the_rest_still_counts(monkeypatch):
    real = probes.time_probe

    def failing(probe, dev, dtype, opts):
        if probe.size == 128:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(probe, dev, dtype, opts)

    monkeypatch.setattr(probes, "time_probe", failing)
    plan = probes.plan([64, 128], probes.MiB)
    rows, ceil = probes.measure_ceilings(CPU, "fp32", FAST, plan)
    assert [r["status"] for r in rows] == ["ok", "oom", "ok", "ok"]
    assert list(rows[0]) == list(rows[1])  # same columns, so the CSV stays rectangular
    assert ceil.tflops_source == "matmul 64"
