"""The projection for machines nobody here has: the arithmetic, checked against the
accounting and by hand, its inputs (datasheet, given, measured probe.csv), and the command."""

from __future__ import annotations

import json

import pytest

from benchbatch.app.cli import app
from benchbatch.core import accounting as acc
from benchbatch.core import projection
from benchbatch.core.config import preset
from benchbatch.errors import UserError
from benchbatch.experiments.project.options import DEFAULT_LATENCY_US, ProjectOptions

LLAMA70 = preset("llama3-70b")


def machine(**kw) -> projection.Machine:
    base = dict(name="test", tflops=1000.0, gbps=3000.0, memory_bytes=80e9, busbw_gbps=400.0,
                latency_us=10.0)  # fmt: skip
    return projection.Machine(**(base | kw))


def test_one_gpu_is_its_roofline_without_communication():
    m = machine(efficiency=0.5)
    row = projection.project(LLAMA70, "bf16", 1, 8, 512, m)
    cost = acc.decode_cost(LLAMA70, "bf16", 8, 512)
    roof_ms = max(cost.flops / 1e15, cost.bytes / 3e12) * 1e3
    assert row["step_ms"] == pytest.approx(roof_ms / 0.5)
    assert row["allreduce_ms"] == row["gather_ms"] == row["allreduce_share"] == 0
    assert row["bound"] == "memory" and row["tokens_per_s"] == pytest.approx(8e3 / row["step_ms"])


def test_eight_gpus_pay_two_ring_all_reduces_per_layer():
    m = machine()
    row = projection.project(LLAMA70, "bf16", 8, 4, 512, m)
    message = 4 * 8192 * 2  # batch x hidden x bf16
    one = 10e-3 + 2 * 7 / 8 * message / 400e9 * 1e3  # ms: latency + ring traffic / busbw
    assert row["allreduce_ms"] == pytest.approx(160 * one)
    logits = 4 * 128256 * 2
    assert row["gather_ms"] == pytest.approx(10e-3 + 7 / 8 * logits / 400e9 * 1e3)
    cost = acc.decode_cost(LLAMA70, "bf16", 4, 512, 8)
    assert row["model_ms"] == pytest.approx(cost.bytes / 3e12 * 1e3)
    assert row["allreduce_share"] == pytest.approx(row["allreduce_ms"] / row["step_ms"])
    assert row["weights_gib"] * 2**30 == acc.weight_bytes(LLAMA70, "bf16", 8)


def test_speedup_is_over_the_fewest_gpus_that_fit():
    rows = projection.table(LLAMA70, "bf16", (1, 2, 4, 8), (1,), (512,), machine())
    assert [r["fits"] for r in rows] == [False, True, True, True]  # 141 GB on one 80 GB GPU
    assert rows[0]["speedup"] is None and rows[1]["speedup"] == 1
    assert rows[3]["speedup"] == pytest.approx(rows[1]["step_ms"] / rows[3]["step_ms"])
    shares = [r["allreduce_share"] for r in rows]
    assert shares == sorted(shares)  # the all-reduce's share grows with the GPUs


def test_datasheet_machine_and_its_sources():
    m = ProjectOptions().machine()
    assert (m.name, m.tflops, m.gbps, m.busbw_gbps) == ("H100 SXM", 989, 3350, 450)
    assert m.memory_bytes == 80 * 2**30 and m.latency_us == DEFAULT_LATENCY_US
    assert "900" in dict(m.sources)["busbw"]
    given = ProjectOptions(gpu="A100 80GB SXM", busbw=200, allreduce_latency_us=5).machine()
    assert (given.busbw_gbps, given.latency_us, given.tflops) == (200, 5, 312)
    with pytest.raises(UserError, match="no NVLink figure") as e:
        ProjectOptions(gpu="L40S").machine()
    assert e.value.option == "nvlink_gbps"
    assert ProjectOptions(gpu="L40S", nvlink_gbps=64).machine().busbw_gbps == 32
    with pytest.raises(UserError, match="unknown GPU 'B9000'"):
        ProjectOptions(gpu="B9000").machine()


def test_a_measured_probe_csv_replaces_the_datasheet(tmp_path):
    probe = tmp_path / "probe.csv"
    probe.write_text(
        "kind,label,size,dtype,ranks,step_ms,tflops,gbps,status\n"
        "matmul,matmul 8192,8192,bf16,,1.0,700.0,,ok\n"
        "read,read 1 GiB,1073741824,bf16,,1.0,,2500.0,ok\n"
        "allreduce,all-reduce 1 KiB,1024,bf16,8,0.012,0.0,0.15,ok\n"
        "allreduce,all-reduce 256 MiB,268435456,bf16,8,1.0,0.0,360.0,ok\n"
    )
    m = ProjectOptions(ceilings=probe).machine()
    assert (m.tflops, m.gbps, m.busbw_gbps, m.latency_us) == (700, 2500, 360, pytest.approx(12))
    assert "measured" in dict(m.sources)["busbw"] and "8 ranks" in dict(m.sources)["latency"]
    with pytest.raises(UserError, match="measured in bf16") as e:
        ProjectOptions(ceilings=probe, dtype="fp16").machine()
    assert e.value.option == "ceilings"


def test_project_command_prints_the_table_and_its_assumptions(runner, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["project", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "assumptions:" in result.output and "H100 SXM" in result.output
    rows = json.loads(runner.invoke(app, ["project", "--json", "--tp", "1,8", "--out",
                                          str(tmp_path / "j")]).stdout)["rows"]  # fmt: skip
    assert [r["tp"] for r in rows] == [1, 8, 1, 8]  # decode batch 1 and 32
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["machine"]["busbw_gbps"] == 450 and len(meta["assumptions"]) == 4


def test_a_gpu_count_that_does_not_shard_the_model_is_one_line(runner, tmp_path):
    result = runner.invoke(app, ["project", "--tp", "3", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "Error: --tp: 64 attention heads do not split over 3 ranks" in result.output
