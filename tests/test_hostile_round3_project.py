"""Issue 29, item 9: `project --gpu` took fuzzy junk ('h1000', 'zzz h100', '[bold]h100' all
became "H100 SXM" silently). Whole names or known aliases only, and the projection says
which GPU it priced."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchbatch.app.cli import app


@pytest.mark.parametrize("junk", ["h1000", "zzz h100", "[bold]h100", "h100x", "GH200"])
def test_project_refuses_a_gpu_name_it_does_not_know(tmp_path, junk):
    done = CliRunner().invoke(app, ["project", "--gpu", junk, "--out", str(tmp_path / "p")])
    assert done.exit_code == 2, done.output
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert lines[-1].startswith("Error: --gpu: unknown GPU") and "Traceback" not in done.output
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(("given", "priced"), [("h100", "H100 SXM"), ("H200 NVL", "H200 NVL")])
def test_project_says_which_gpu_it_priced(tmp_path, given, priced):
    done = CliRunner().invoke(app, ["project", "--gpu", given, "--out", str(tmp_path / "p")])
    assert done.exit_code == 0, done.output
    assert f"one GPU: {priced}," in done.output
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["options"]["gpu"] == given


def test_compare_of_a_folder_that_points_at_itself_is_one_line(tmp_path):
    """A RUN_DIR that is a symlink to itself: labels resolved it and raised RuntimeError
    (found by scripts/hostile_attack.py)."""
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    done = CliRunner().invoke(app, ["compare", str(loop), str(tmp_path), "--out",
                                    str(tmp_path / "cmp")])  # fmt: skip
    assert done.exit_code == 2, done.output
    assert "Traceback" not in done.output and "Error: RUN_DIR:" in done.output


@pytest.mark.parametrize(
    "env",
    [{"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
     {"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"},
     {"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "5"},
     {"RANK": "0", "WORLD_SIZE": "\u0662", "LOCAL_RANK": "0"}],
)  # fmt: skip
def test_torchruns_variables_that_make_no_sense_are_one_line(tmp_path, monkeypatch, env):
    """RANK=x under a launcher: torch.distributed raised ValueError from int() (found by
    scripts/hostile_attack.py); now one line naming torchrun, before any folder."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = ["phases", "--preset", "tiny", "--prefill", "8", "--decode-batch", "1", "--context",
            "8", "--no-roofline", "--out", str(tmp_path / "run")]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2, done.output
    assert "Error: torchrun environment:" in done.output and "Traceback" not in done.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args", [["--help"], ["project", "--help"]])
def test_help_on_a_full_stdout_is_one_line(args):
    """typer writes --help itself: on /dev/full that was a traceback (found by
    scripts/hostile_attack.py); now one line and exit 1."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with open("/dev/full", "w") as full:
        command = [sys.executable, "-m", "benchbatch", *args]
        done = subprocess.run(command, cwd=root, stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=900)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: cannot write the output: No space left on device"
    ]


def test_a_torch_logs_setting_torch_refuses_is_one_line(tmp_path):
    """TORCH_LOGS=garbage made torch raise a ValueError at its import, a traceback (found by
    scripts/hostile_attack.py); now one line naming TORCH_LOGS, exit 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    args = ["phases", "--preset", "tiny", "--prefill", "8", "--decode-batch", "1", "--context",
            "8", "--no-roofline", "--out", str(tmp_path / "run")]  # fmt: skip
    env = {**os.environ, "TORCH_LOGS": "garbage", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "benchbatch", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("Error: TORCH_LOGS: torch refuses")


@pytest.mark.parametrize("flag", ["--nvlink-gbps", "--busbw"])
@pytest.mark.parametrize("value", ["1e-320", "1e-7"])
def test_a_link_too_slow_to_price_is_one_line(tmp_path, flag, value):
    """1e-320 GB/s priced an all-reduce at infinity and the figure's axis raised
    (ValueError: Axis limits cannot be NaN or Inf; found by scripts/hostile_attack.py)."""
    done = CliRunner().invoke(app, ["project", "--tp", "1,2", flag, value, "--out",
                                    str(tmp_path / "p")])  # fmt: skip
    assert done.exit_code == 2, done.output
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert lines[-1].startswith(f"Error: {flag}: ") and "at least 1e-06 GB/s" in lines[-1]
    assert not (tmp_path / "p").exists()


def test_the_slowest_link_taken_is_priced_finite(tmp_path):
    done = CliRunner().invoke(app, ["project", "--tp", "1,2", "--busbw", "1e-6", "--out",
                                    str(tmp_path / "p")])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert (tmp_path / "p" / "project.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "shape"),
    [(["project"], "llama3-70b"), (["phases", "--preset", "llama3-8b"], "llama3-8b")],
)
def test_heads_that_the_shapes_kv_heads_do_not_divide_name_the_shape(tmp_path, args, shape):
    """--heads 4 over a shape with 8 KV heads blamed --kv-heads, which the user never gave
    (project starts from llama3-70b without saying so): the error names --heads, the shape
    its KV heads came from, and the way out."""
    done = CliRunner().invoke(app, [*args, "--heads", "4", "--out", str(tmp_path / "p")])
    assert done.exit_code == 2, done.output
    assert done.stderr.strip() == (
        f"Error: --heads: 4 query heads cannot share the {shape} shape's 8 KV heads evenly: "
        "give --kv-heads too (a divisor of --heads)"
    )
    assert not (tmp_path / "p").exists()


def test_heads_over_a_shape_whose_kv_heads_follow_its_heads_are_taken():
    """The article's shape has as many KV heads as heads (no grouping): --heads 4 alone
    takes 4 of each, as before the check above."""
    from benchbatch.core.options import ModelOptions

    cfg = ModelOptions(hidden=64, layers=2, heads=4, vocab=256).shape("article")
    assert (cfg.heads, cfg.kv_heads, cfg.head_dim) == (4, 4, 16)
    cfg = ModelOptions(preset="llama3-8b", heads=16).shape()  # 8 KV heads divide 16
    assert (cfg.heads, cfg.kv_heads) == (16, 8)


def test_project_names_the_shape_it_projects_and_where_it_started(tmp_path):
    args = ["project", "--hidden", "1024", "--heads", "16", "--kv-heads", "4", "--tp", "1,2",
            "--out", str(tmp_path / "p")]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    name = "llama3-70b with hidden 1024, heads 16, kv heads 4"
    assert f"note: projecting {name}: sizes given without --preset or --config start from the " \
        "llama3-70b preset, project's default" in " ".join(done.stderr.split())
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["config"]["name"] == name
    assert meta["config"]["kv_heads"] == 4 and meta["config"]["layers"] == 80
