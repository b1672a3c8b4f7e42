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


PROBE_HEAD = "kind,label,size,dtype,ranks,step_ms,tflops,gbps,status\n" \
    "matmul,matmul 8192,8192,bf16,,1.0,700.0,,ok\nread,read 1 GiB,1073741824,bf16,,1.0,,2500.0,ok\n"


@pytest.mark.parametrize("row", [
    "allreduce,all-reduce,abc,bf16,2,0.012,0.0,0.15,ok",   # no size in bytes
    "allreduce,all-reduce,256.0,bf16,2,0.012,0.0,0.15,ok",  # not a whole size
    "allreduce,all-reduce,1024,bf16,2,,0.0,0.15,ok",       # no time
    "allreduce,all-reduce,1024,bf16,2,nan,0.0,0.15,ok",    # priced as nan us
    "allreduce,all-reduce,1024,bf16,2,-1,0.0,0.15,ok",     # priced as -1000 us
    "allreduce,all-reduce,1024,bf16,2,0.012,0.0,0,ok",     # divided by zero
])  # fmt: skip
def test_a_probe_csvs_bad_all_reduce_row_is_one_line_naming_ceilings(runner, tmp_path, row):
    """Its all-reduce rows were read unchecked: a traceback, or a projection priced at nan
    or a negative latency with exit 0."""
    probe = tmp_path / "probe.csv"
    probe.write_text(PROBE_HEAD + row + "\n")
    result = runner.invoke(app, ["project", "--ceilings", str(probe), "--tp", "1,2", "--out",
                                 str(tmp_path / "x")])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --ceilings:"), lines
    assert not (tmp_path / "x").exists()


def test_the_options_project_takes_are_recorded_as_given(runner, tmp_path):
    """--tp, --dtype and --ceilings were recorded as RunOptions' unset ones (null)."""
    probe = tmp_path / "probe.csv"
    probe.write_text(PROBE_HEAD)
    out = tmp_path / "run"
    result = runner.invoke(app, ["project", "--ceilings", str(probe), "--tp", "1,2",
                                 "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    options = json.loads((out / "metadata.json").read_text())["options"]
    assert (options["tp"], options["dtype"], options["ceilings"]) == ([1, 2], "bf16", str(probe))


def test_a_context_past_the_models_is_refused(runner, tmp_path):
    result = runner.invoke(app, ["project", "--context", "8192", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "Error: --context: 8192 + 1 new token exceeds" in result.output
    assert runner.invoke(app, ["project", "--context", "8191", "--out",
                               str(tmp_path / "y")]).exit_code == 0  # fmt: skip


def test_a_gpu_of_unknown_memory_fits_unknown_not_yes():
    """A V100 (no memory in the table) showed "fits yes" at 132 GiB a GPU: unknown now, and
    the speedup over the fewest GPUs."""
    rows = projection.table(LLAMA70, "fp16", (1, 2), (1,), (512,), machine(memory_bytes=None))
    assert [(r["fits"], r["max_batch"]) for r in rows] == [(None, None)] * 2
    assert rows[1]["speedup"] == pytest.approx(rows[0]["step_ms"] / rows[1]["step_ms"])
    said = projection.assumptions(LLAMA70, "fp16", machine(memory_bytes=None), (1, 2))
    assert "memory unknown" in said[1] and "fits ?" in said[-1]


def test_gpu_counts_past_one_nvlink_domain_are_said():
    m = ProjectOptions().machine()
    said = projection.assumptions(LLAMA70, "bf16", m, (8, 16))
    assert "16 GPUs are past one NVLink domain" in said[-1]
    assert not any("NVLink domain" in s for s in projection.assumptions(LLAMA70, "bf16", m, (8,)))
    given = ProjectOptions(busbw=50).machine()  # a network given: its own figure
    assert not any("NVLink domain" in s for s in projection.assumptions(LLAMA70, "bf16", given,
                                                                         (16,)))


@pytest.mark.parametrize("probe_text, said", [
    (PROBE_HEAD, None),  # 700 of 989 TFLOP/s, 2500 of 3350 GB/s: an H100's own
    (PROBE_HEAD.replace("700.0", "0.5"), "at 0.1% of its datasheet bf16 TFLOP/s"),
    ("kind,label,size,dtype,ranks,step_ms,tflops,gbps,status,clock\n"
     "matmul,matmul 8192,8192,bf16,,1.0,700.0,,ok,cpu\n"
     "read,read 1 GiB,1073741824,bf16,,1.0,,2500.0,ok,cpu\n", "timed on a CPU's clock"),
])  # fmt: skip
def test_a_probe_csv_from_another_device_is_flagged(runner, tmp_path, probe_text, said):
    """A CPU's probe.csv priced H100s at a CPU's ceilings unsaid."""
    probe = tmp_path / "probe.csv"
    probe.write_text(probe_text)
    out = tmp_path / "run"
    result = runner.invoke(app, ["project", "--ceilings", str(probe), "--tp", "1,2",
                                 "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    warnings = json.loads((out / "metadata.json").read_text()).get("warnings", [])
    flagged = [w for w in warnings if "another device's ceilings" in w]
    if said is None:
        assert not flagged
    else:
        assert len(flagged) == 1 and said in flagged[0] and said in result.stderr
