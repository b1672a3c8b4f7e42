"""scripts/gpu_check.sh and its Python helper on a CPU: the step budget stays under six
minutes, the preflight stops with one line, the lifetime check's logic runs end to end
through the fake CUDA (and would crash on a replay that did not own its inputs), and the
expected ranges judge an H200's numbers and only an H200's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.sh"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location(
        "gpu_lifetime_check", REPO / "scripts" / "gpu_lifetime_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_timeouts_add_up_to_under_six_minutes(tmp_path):
    env = {**os.environ, "BUDGET_ONLY": "1"}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    budget = int(done.stdout.split()[1])
    assert budget < 360 and "15 steps" in done.stdout
    text = SCRIPT.read_text()
    for step in ("preflight", "graph-lifetime", "attention", "ranges", "phases-compile"):
        assert f'"{step} ' in text  # each new check has its own timeout in the budget
    assert "TORCH_LOGS=cudagraphs,recompiles" in text


def test_preflight_stops_with_one_line_naming_what_is_missing(check, monkeypatch, capsys):
    assert check.preflight(dry=True) == 0
    monkeypatch.setattr(check, "TEST_DEPENDENCIES", (*check.TEST_DEPENDENCIES, "no_such_dep"))
    assert check.preflight(dry=True) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("preflight FAILED: cannot import no_such_dep")


def test_the_lifetime_check_runs_through_the_fake_cuda(check, tmp_path, capsys):
    with check.machine(dry=True) as (api, dev, name, dtype):
        failed = check.lifetime(api, dev, name, dtype, tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert failed == 0, lines
    verdicts = [line for line in lines if " ok: " in line or " FAILED: " in line]
    assert len(verdicts) == 6 and all(" ok: " in line for line in verdicts)
    assert "== prefill 512" in (tmp_path / "kernels.txt").read_text()
    assert any("statuses ['oom', 'ok']" in line for line in lines)


def write_run(folder: Path, gpu: str, decode_ms: float, tflops: float, tbps: float) -> Path:
    folder.mkdir()
    (folder / "metadata.json").write_text(json.dumps({"environment": {"device_name": gpu}}))
    probe = [{"kind": "matmul", "tflops": tflops, "gbps": 0.0, "status": "ok"},
             {"kind": "copy", "tflops": 0.0, "gbps": tbps * 1e3, "status": "ok"}]  # fmt: skip
    pd.DataFrame(probe).to_csv(folder / "probe.csv", index=False)
    phases = [{"label": "decode b=1", "step_ms": decode_ms, "status": "ok"}]
    pd.DataFrame(phases).to_csv(folder / "phases.csv", index=False)
    return folder


def test_ranges_judge_an_h200_and_only_an_h200(check, tmp_path, capsys):
    assert check.ranges(write_run(tmp_path / "a", "NVIDIA H200", 0.41, 710, 4.0)) == 0
    assert check.ranges(write_run(tmp_path / "b", "NVIDIA H200", 0.9, 710, 2.1)) == 2
    out = capsys.readouterr().out
    assert "decode b=1 with graphs (ms) FAILED: 0.9 (an H200 SXM: 0.33-0.5)" in out
    # Another GPU's numbers are printed, not judged: an H200 NVL is not an H200 SXM.
    assert check.ranges(write_run(tmp_path / "c", "NVIDIA H200 NVL", 0.9, 500, 2.1)) == 0
    assert "not judged on NVIDIA H200 NVL" in capsys.readouterr().out


def test_the_attention_check_times_new_shapes_and_fails_a_slow_backend(check, monkeypatch, capsys):
    """On the CPU cuDNN's attention is not there (said, not judged) and the others take a
    new shape quickly; a backend whose new shapes cost more than the limit fails."""
    import torch

    cpu = torch.device("cpu")
    assert check.attention(cpu, torch.float32, dry=True) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("cudnn" in line and "not available" in line for line in lines) == 2
    ok = [line for line in lines if " ok: " in line]
    assert len(ok) == 2 and all("a new shape" in line for line in ok)

    seen = set()

    def slow_first_call(q, make, sync, backends, masked, length):
        first = (tuple(backends), masked, length) not in seen
        seen.add((tuple(backends), masked, length))
        return 40.0 if first else 0.05  # a graph built for each new shape

    monkeypatch.setattr(check, "_timed_attention", slow_first_call)
    assert check.attention(cpu, torch.float32, dry=True, limit_ms=1.0) == 2
    lines = capsys.readouterr().out.splitlines()
    assert any("cudnn, masked: a new shape 40 ms a call, the same shape again 0.05" in x
               for x in lines)  # fmt: skip
    assert sum(" FAILED: " in line for line in lines) == 2
