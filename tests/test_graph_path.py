"""`--cuda-graphs/--no-cuda-graphs` reaches the timer: a spy in place of the step timer
records what each command passes it (on the CPU the flag changes nothing measurable, so
only a spy can tell whether it got through), and the timer replays a graph exactly when
asked on CUDA, for decode steps."""

from __future__ import annotations

import time

import pytest
import torch
from typer.testing import CliRunner

from benchbatch.app.cli import app
from benchbatch.experiments import common
from benchbatch.experiments.piggyback import probe as piggyback
from benchbatch.runtime import steps
from benchbatch.runtime.timing import Measurement

TINY = ["--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time", "0"]
COMMANDS = {
    "phases": ["phases", *TINY, "--no-roofline", "--prefill", "8", "--decode-batch", "1,2"]
    + ["--context", "8"],
    "sweep": ["sweep", *TINY, "--no-roofline", "--batch", "1,2", "--context", "8"],
    "reproduce": ["reproduce", *TINY, "--prefill", "8,16", "--decode-batch", "1,2"]
    + ["--batch", "1,2", "--context", "8", "--requests", "20", "--slots", "4"]
    + ["--median", "5", "--max-output", "20", "--probe-sizes", "32", "--probe-buffer-mb", "1"],
}
FLAGS = {"--cuda-graphs": True, "--no-cuda-graphs": False, None: True}  # None: the default


@pytest.fixture
def timed(monkeypatch):
    """(phase, cuda_graphs) of every step timed; each 'takes' 1, 2 and 3 ms."""
    calls = []

    def spy(model, step, opts, cuda_graphs=True, seed=0, **layout):
        calls.append((step.phase, cuda_graphs))
        return Measurement([1.0, 2.0, 3.0])

    def prepared(model, step, opts, cuda_graphs=True, seed=0, **layout):
        calls.append((step.phase, cuda_graphs))  # a group's step: timed with the others
        return lambda: time.sleep(0.001)  # a millisecond: a step time every reader accepts

    monkeypatch.setattr(steps, "time_step", spy)
    monkeypatch.setattr(steps, "prepare", prepared)
    # The duration estimate's two quick eager steps are not the measurement.
    monkeypatch.setattr(common, "estimate_run", lambda *args, **kwargs: None)
    return calls


@pytest.mark.parametrize("flag", list(FLAGS), ids=lambda f: f or "default")
@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_flag_reaches_the_step_timer(tmp_path, timed, command, flag):
    args = [*COMMANDS[command], *([flag] if flag else []), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    phases = {phase for phase, _ in timed}
    assert "decode" in phases and (command == "sweep" or "prefill" in phases), timed
    assert {graphs for _, graphs in timed} == {FLAGS[flag]}, timed


@pytest.mark.parametrize("flag", ["--cuda-graphs", "--no-cuda-graphs"])
def test_the_flag_reaches_the_mixed_step_timer(tmp_path, monkeypatch, flag):
    calls = []

    def spy(model, step, opts, cuda_graphs=False, seed=0):
        calls.append((step.decode_batch, cuda_graphs))
        return lambda: time.sleep(0.001)

    monkeypatch.setattr(piggyback, "prepare_mixed", spy)  # timed together, interleaved
    args = ["piggyback", *TINY, "--decode-batch", "2", "--context", "8", "--prefill", "4"]
    args += ["--chunk-prompt", "16", "--chunks", "8", "--tiles", "8,9", flag]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    asked = flag == "--cuda-graphs"
    with_decodes = [graphs for batch, graphs in calls if batch]
    assert len(with_decodes) == 2 and set(with_decodes) == {asked}, calls  # 0 and 4 riding
    assert asked or not any(graphs for _, graphs in calls), calls  # tiles run eagerly anyway


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "cpu"])
@pytest.mark.parametrize("phase", ["decode", "prefill"])
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_a_graph_is_replayed_on_cuda_when_asked(device, phase, cuda_graphs):
    """Decode and prefill steps alike: both replay a graph on CUDA unless told not to."""
    step = steps.Step(phase, 2, 1 if phase == "decode" else 8, 8 if phase == "decode" else 0)
    expected = device.startswith("cuda") and cuda_graphs
    assert steps.replays_graph(torch.device(device), step, cuda_graphs) is expected


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_a_step_timed_alone_gets_the_flag_too(timed, tiny_model, cuda_graphs):
    """run_step (a group of one, --try-oom, under torchrun) passes the flag on as given."""
    from benchbatch.runtime.timing import TimingOptions

    opts = TimingOptions(min_repeats=1, min_time_s=0.0, warmup=0)
    row = steps.run_step(tiny_model, "fp32", steps.decode(2, 8), opts, cuda_graphs)
    assert row["status"] == "ok" and timed == [("decode", cuda_graphs)]
