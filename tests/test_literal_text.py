"""Text from users and files is shown as it is: rich markup (`[/]`, `[bold]`), emoji codes
(`:cd:`) and mathtext (`$^$`) in a path, a model name, a label or a CSV value are printed
and drawn literally, on one line; an ASCII-only terminal gets escapes, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchbatch.app.cli import app

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "a[/]b[bold]c:cd:d$^$e"
TINY = ["--device", "cpu", "--repeats", "1", "--min-time", "0"]
CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
          "max_position_embeddings": 256}  # fmt: skip


def results_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("results: ")]
    assert len(lines) == 1, stdout
    return lines[0]


def figures(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.png") if p.stat().st_size > 1000)


def test_a_path_and_a_model_name_are_printed_and_drawn_as_given(runner, tmp_path):
    """The model is named after its config file, the roofline's sources after probe.csv's
    labels, the folder is the user's: all appear exactly, and every figure is drawn."""
    config = tmp_path / f"{HOSTILE}.json"  # the [/] makes a folder 'a[' too
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(CONFIG))
    probe = tmp_path / "probe.csv"
    probe.write_text(
        "kind,label,dtype,tflops,gbps,status\n"
        f"matmul,{HOSTILE} m,fp32,0.5,,ok\nread,{HOSTILE} r,fp32,,20,ok\n"
    )
    out = tmp_path / HOSTILE / "phases"
    args = ["phases", *TINY, "--config", str(config), "--ceilings", str(probe), "--prefill", "8"]
    args += ["--decode-batch", "1,2", "--context", "8", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert results_line(result.stdout) == f"results: {out}"
    assert figures(out) == ["phases.png", "roofline.png"]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["config"]["name"] == config.stem and HOSTILE in meta["ceilings"]["tflops_source"]


def test_a_long_path_stays_on_one_line_in_a_pipe(tmp_path):
    """A real process, stdout a pipe, an 80-column terminal: the path is not wrapped."""
    out = tmp_path / (HOSTILE + "-" + "long" * 30) / "run"
    env = {**os.environ, "COLUMNS": "40", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchbatch", "occupancy", "--requests", "20", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert results_line(done.stdout) == f"results: {out}"


def test_an_ascii_terminal_gets_escapes_not_a_traceback(tmp_path):
    out = tmp_path / "é—ü" / "run"
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchbatch", "occupancy", "--requests", "20", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert b"results: " in done.stdout and b"\\xe9\\u2014\\xfc" in done.stdout
    assert (out / "metadata.json").exists()


def test_compare_labels_and_folders_as_given(runner, tmp_path):
    runs = []
    for name in ("x" + HOSTILE, "y" + HOSTILE):
        folder = tmp_path / name
        args = ["occupancy", "--requests", "20", "--out", str(folder)]
        assert runner.invoke(app, args).exit_code == 0
        runs.append(str(folder))
    out = tmp_path / "cmp"
    labels = f"{HOSTILE}1,{HOSTILE}2"
    wide = {"COLUMNS": "400"}  # every cell on one line, to find it
    result = runner.invoke(app, ["compare", *runs, "--label", labels, "--out", str(out)], env=wide)
    assert result.exit_code == 0, result.output
    assert f"{HOSTILE}1" in result.stdout and f"{HOSTILE}2" in result.stdout
    assert figures(out) == ["compare-occupancy.png"]
    result = runner.invoke(app, ["compare", *runs, "--out", str(tmp_path / "cmp2")], env=wide)
    assert result.exit_code == 0, result.output
    assert "x" + HOSTILE in result.stdout


def test_an_error_names_a_path_as_given(runner, tmp_path):
    missing = tmp_path / f"{HOSTILE}.csv"
    result = runner.invoke(app, ["occupancy", "--trace", str(missing)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"Error: --trace: cannot read {missing}: no such file"


def test_a_newline_in_a_path_does_not_break_the_line(runner, tmp_path):
    out = tmp_path / "two\nlines"
    result = runner.invoke(app, ["occupancy", "--requests", "20", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert results_line(result.stdout) == f"results: {tmp_path}/two\\nlines"


@pytest.mark.parametrize("label", [HOSTILE, "$x$", "[red]x[/red]", ":thumbs_up:"])
def test_every_kind_of_figure_draws_text_as_given(tmp_path, label):
    """Titles, legends and categorical tick labels: drawn, not parsed (a `$^$` used to fail
    when the figure was saved, after every row was measured)."""
    import pandas as pd

    from benchbatch.output.plots import compare as plots

    phases = pd.DataFrame(
        [{"run": r, "label": f"{label} {i}", "phase": "decode", "batch": 1, "tokens": 1,
          "step_ms": 1.0 + i, "us_per_token": 10.0, "tflops": 0.1, "status": "ok"}
         for r in (label, "b") for i in range(2)]
    )  # fmt: skip
    plots.compare_phases_figure(phases, [label, "b"], tmp_path / "p.png", label)
    assert figures(tmp_path) == ["p.png"]
