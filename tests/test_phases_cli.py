"""`benchbatch phases` end to end on a tiny model, and its answers to bad input."""

import json

import pandas as pd
import pytest
import torch

from benchbatch.app.cli import app

FAST = ["--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device", "cpu", "--no-roofline"]


def run_phases(runner, out, *extra):
    fast = [a for a in FAST if a != "--no-roofline" or "--ceilings" not in extra]
    return runner.invoke(
        app,
        [
            "phases",
            *fast,
            "--prefill",
            "16,32",
            "--decode-batch",
            "1,4",
            "--context",
            "24",
            "--out",
            str(out),
            *extra,
        ],
    )


def test_phases_writes_rows_metadata_and_plot(runner, tmp_path):
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    assert list(df["label"]) == ["prefill 16", "prefill 32", "decode b=1", "decode b=4"]
    for column in (
        "phase",
        "batch",
        "tokens",
        "context",
        "step_ms",
        "us_per_token",
        "flops",
        "bytes",
        "tflops",
        "gbps",
        "arithmetic_intensity",
        "noisy",
    ):
        assert column in df.columns
    assert (df["status"] == "ok").all() and (df["step_ms"] > 0).all()
    new_tokens = df["batch"] * df["tokens"]
    # The CSV keeps 6 significant digits.
    assert ((df["us_per_token"] / (df["step_ms"] * 1e3 / new_tokens) - 1).abs() < 1e-5).all()
    assert ((df["tflops"] / (df["flops"] / df["step_ms"] / 1e9) - 1).abs() < 1e-5).all()
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["config"]["name"] == "tiny"
    assert meta["environment"]["dtype"] == "fp32"
    assert meta["environment"]["torch_version"] == torch.__version__
    assert meta["telemetry_before"]["available"] is False
    # one thread count in one file (the environment's was read before the run set its own)
    assert meta["environment"]["cpu"]["torch_threads"] == meta["threads"]["threads"]
    assert (tmp_path / "run" / "phases.png").stat().st_size > 1000
    assert "ran at" in result.stdout


def test_rows_and_metadata_say_which_sdpa_backend_ran(runner, tmp_path):
    """torch's own selector, asked with each step's attention shapes: on this CPU build in
    fp32 the flash kernel for every kind; metadata has each kind at the article's sizes."""
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    assert list(df["sdpa_backend"]) == ["flash"] * 4
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["sdpa_backends"] == {"prefill": "flash", "decode": "flash", "masked": "flash"}


def test_the_sdpa_backend_follows_what_torch_allows():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchbatch.core.config import preset
    from benchbatch.runtime import sdpa

    cfg, cpu = preset("tiny"), torch.device("cpu")
    with sdpa_kernel(SDPBackend.MATH):  # only math enabled: torch must pick it
        assert sdpa.by_kind(cfg, cpu, torch.float32) == dict.fromkeys(sdpa.KINDS, "math")
        assert sdpa.for_step(cfg, "decode", 1, 8, cpu, torch.float32) == "math"
    assert sdpa.name_of(SDPBackend.CUDNN_ATTENTION.value) == "cudnn"
    assert sdpa.name_of(SDPBackend.EFFICIENT_ATTENTION.value) == "memory-efficient"


def test_json_output_is_one_document(runner, tmp_path):
    result = run_phases(runner, tmp_path / "run", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert len(doc["rows"]) == 4 and doc["folder"].endswith("run")
    assert doc["summary"]["decode_batches"] == [1, 4]


def test_existing_results_are_never_overwritten_silently(runner, tmp_path):
    assert run_phases(runner, tmp_path / "run").exit_code == 0
    before = (tmp_path / "run" / "phases.csv").read_text()
    again = run_phases(runner, tmp_path / "run")
    assert again.exit_code == 2 and "--force" in again.stderr
    assert (tmp_path / "run" / "phases.csv").read_text() == before
    assert run_phases(runner, tmp_path / "run", "--force").exit_code == 0


def test_out_of_memory_on_one_row_is_recorded_and_the_run_goes_on(runner, tmp_path, monkeypatch):
    from benchbatch.runtime import steps

    real = steps.prepare

    def fail_big(model, step, opts, cuda_graphs=True, seed=0, **layout):
        if step.batch == 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, step, opts, cuda_graphs, seed, **layout)

    monkeypatch.setattr(steps, "prepare", fail_big)
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    assert list(df["status"]) == ["ok", "ok", "ok", "oom"]
    assert df["step_ms"].isna().tolist() == [False, False, False, True]


def test_a_cublas_allocation_failure_is_an_oom_row_and_the_run_goes_on(
    runner, tmp_path, monkeypatch
):
    """cuBLAS allocates its workspace on a step's first matmul, outside torch's allocator:
    a full GPU raises its RuntimeError from the timed call, not torch's OutOfMemoryError.
    The group it fails is timed step by step, and only that step is an oom row."""
    from benchbatch.runtime import steps

    real = steps.prepare
    error = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"

    def fail_big(model, step, opts, cuda_graphs=True, seed=0, **layout):
        call = real(model, step, opts, cuda_graphs, seed, **layout)
        if step.batch != 4:
            return call

        def run():
            raise RuntimeError(error)

        return run

    monkeypatch.setattr(steps, "prepare", fail_big)
    result = run_phases(runner, tmp_path / "run")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    assert list(df["status"]) == ["ok", "ok", "ok", "oom"]
    assert df["step_ms"].isna().tolist() == [False, False, False, True]


BAD = [
    (["--prefill", "1,,x"], "--prefill"),
    (["--prefill", "0"], "--prefill"),
    (["--decode-batch", "-4"], "--decode-batch"),
    (["--decode-batch", "2;3"], "--decode-batch"),
    (["--hidden", "100", "--heads", "3"], "--heads"),
    (["--kv-heads", "3"], "--kv-heads"),
    (["--hidden", "0"], "--hidden"),
    (["--context", "4096"], "--context"),
    (["--prefill", "5000"], "--prefill"),
    (["--preset", "nonesuch"], "--preset"),
    (["--config", "/no/such/config.json"], "--config"),
    (["--repeats", "0"], "--repeats"),
    (["--min-time", "-1"], "--min-time"),
    (["--device", "tpu"], "--device"),
    (["--dtype", "fp8"], "--dtype"),
    (["--hidden", "abc"], "--hidden"),
    (["--out", "/proc/benchbatch-cannot-write"], "--out"),
]


@pytest.mark.parametrize("args,option", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_naming_the_option(runner, args, option):
    result = runner.invoke(app, ["phases", *FAST, "--context", "16", "--prefill", "8", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and option in lines[0], lines
    assert "Traceback" not in result.output


def test_malformed_config_file(runner, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    result = runner.invoke(app, ["phases", "--config", str(bad)])
    assert result.exit_code == 2 and "--config" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda(runner):
    result = runner.invoke(app, ["phases", "--device", "cuda"])
    assert result.exit_code == 2
    assert "Error: --device: CUDA is not available" in result.stderr


# Far above what the tiny model reaches (no step raises them), ridge at 10 FLOP/byte.
PROBE_CSV = """kind,label,dtype,tflops,gbps,status
matmul,matmul 1024,fp32,200,,ok
matmul,matmul 2048,fp32,250,,ok
copy,copy 256 MiB,fp32,,20000,ok
read,read 256 MiB,fp32,,25000,ok
"""


def test_rows_are_placed_on_given_ceilings(runner, tmp_path):
    probe = tmp_path / "probe.csv"
    probe.write_text(PROBE_CSV)
    result = run_phases(runner, tmp_path / "run", "--ceilings", str(probe))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    # The CSV keeps 6 significant digits.
    assert ((df["mfu"] / (df["tflops"] / 250) - 1).abs() < 1e-5).all()
    assert ((df["mbu"] / (df["gbps"] / 25000) - 1).abs() < 1e-5).all()
    ridge = 250e12 / 25000e9  # 10 FLOP/byte
    expected = ["compute" if x >= ridge else "memory" for x in df["arithmetic_intensity"]]
    assert list(df["bound"]) == expected
    assert (tmp_path / "run" / "roofline.png").stat().st_size > 1000
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["ceilings"]["peak_gbps"] == 25000.0


def test_ceilings_measured_under_other_conditions_are_flagged(runner, tmp_path):
    """A probe.csv of 2 threads on the wall clock, a row timed once, beside its run's
    metadata naming another CPU, placed a 1-thread CPU-clock run's rows unsaid."""
    probe = tmp_path / "probe.csv"
    lines = PROBE_CSV.strip().splitlines()
    head = lines[0] + ",clock,repeats"
    rows = [line + (",wall,1" if i == 0 else ",wall,5") for i, line in enumerate(lines[1:])]
    probe.write_text("\n".join([head, *rows]) + "\n")
    meta = {"environment": {"device_name": "Some Other CPU"}, "threads": {"threads": 2}}
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    result = run_phases(runner, tmp_path / "run", "--ceilings", str(probe), "--threads", "1")
    assert result.exit_code == 0, result.output
    said = [w for w in json.loads((tmp_path / "run" / "metadata.json").read_text())["warnings"]
            if w.startswith("--ceilings")]  # fmt: skip
    assert len(said) == 1, said
    for part in ("on Some Other CPU", "with 2 threads, not 1", "on the wall clock, not cpu",
                 "matmul 1024 noisy or timed once"):  # fmt: skip
        assert part in said[0], said[0]
    # its own conditions: nothing said
    (tmp_path / "metadata.json").unlink()
    probe.write_text(PROBE_CSV)
    result = run_phases(runner, tmp_path / "again", "--ceilings", str(probe))
    assert result.exit_code == 0, result.output
    warnings = json.loads((tmp_path / "again" / "metadata.json").read_text()).get("warnings", [])
    assert not [w for w in warnings if w.startswith("--ceilings")]


def test_ceilings_of_another_dtype_are_refused(runner, tmp_path):
    probe = tmp_path / "probe.csv"
    probe.write_text(PROBE_CSV.replace("fp32", "fp16"))
    result = run_phases(runner, tmp_path / "run", "--ceilings", str(probe))
    assert result.exit_code == 2 and "--ceilings" in result.stderr and "fp16" in result.stderr


def test_default_run_measures_the_ceilings(runner, tmp_path, monkeypatch):
    from benchbatch.runtime import ceilings

    small = ceilings.plan([128], 4 * 2**20)
    monkeypatch.setattr(ceilings, "default_plan", lambda dev, dtype=None: small)
    args = [a for a in FAST if a != "--no-roofline"]
    result = runner.invoke(
        app,
        [
            "phases",
            *args,
            "--prefill",
            "16",
            "--decode-batch",
            "1",
            "--context",
            "8",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    probe = pd.read_csv(tmp_path / "run" / "probe.csv")
    assert set(probe["kind"]) == {"matmul", "copy", "read"}
    df = pd.read_csv(tmp_path / "run" / "phases.csv")
    assert (df["mfu"] > 0).all() and (df["mbu"] > 0).all()


def test_several_contexts_say_each_rows_context(runner, tmp_path):
    """Two contexts made two rows each labelled "decode b=1" in the table, and the ratios
    did not say which context they were at: the table shows each row's context, and the
    ratios theirs (the first); one context shows neither."""
    out = tmp_path / "run"
    args = ["phases", "--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time",
            "0", "--prefill", "16", "--decode-batch", "1,4", "--context", "8,24",
            "--no-roofline", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["summary"]["decode_context"] == 8
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert any(line.startswith("decode b=1 8 ") for line in lines), result.stdout
    assert any(line.startswith("decode b=1 24 ") for line in lines), result.stdout
    assert "of decode b=1 at context 8" in " ".join(lines)
    assert "than batch 1 at context 8" in " ".join(lines)
    single = [a if a != "8,24" else "8" for a in args[:-1]] + [str(tmp_path / "one")]
    one = runner.invoke(app, single)
    assert one.exit_code == 0 and "at context" not in one.stdout


def test_noisy_steps_are_named_with_their_context_when_there_are_several(runner, tmp_path):
    """Timed once (FAST's --repeats 1), every step is flagged: with two contexts the list
    read "decode b=1, decode b=4, decode b=1, decode b=4"."""
    result = run_phases(runner, tmp_path / "run", "--context", "8,24")
    assert result.exit_code == 0, result.output
    noisy = json.loads((tmp_path / "run" / "metadata.json").read_text())["untrusted"]["noisy"]
    assert "decode b=1 at context 8" in noisy and "decode b=1 at context 24" in noisy
    assert "prefill 16" in noisy  # a prefill has no context to name
