"""The real engine's step rows are labelled with the run's name (issue 28: serve-sweep's
real_steps.csv called the chunked policy's steps "continuous", its scheduler's policy
overwriting the run's name); under another key (ablation's scheme, the memory policies) the
scheduler's policy stays a column of its own; occupancy's engine_steps.csv keeps its columns."""

from __future__ import annotations

import pandas as pd

from benchbatch.app.cli import app
from benchbatch.runtime.runs import EngineRun, Finished, engine_events

CHUNKED = {"chunked_prefill": True, "max_num_batched_tokens": 6, "chunk_size": 4, "mixed": True}


def steps_of(model, requests, runs) -> list[dict]:
    return [e for e in engine_events(model, requests, runs, seed=0) if not isinstance(e, Finished)]


def test_the_run_name_labels_its_steps_not_the_scheduler_policy(tiny_model, tiny_workload,
                                                                one_thread):  # fmt: skip
    runs = [
        EngineRun("chunked", 2, "continuous", CHUNKED, columns={"rate": "0.5"}),
        EngineRun("static", 2, "static", columns={"rate": "0.5"}),
    ]
    rows = steps_of(tiny_model, tiny_workload, runs)
    frame = pd.DataFrame(rows)
    assert list(frame.columns[:2]) == ["policy", "rate"]
    assert "scheduler_policy" not in frame.columns
    chunked, static = frame[frame["policy"] == "chunked"], frame[frame["policy"] == "static"]
    assert set(frame["policy"]) == {"chunked", "static"}
    assert len(chunked) + len(static) == len(frame)
    # The chunked run's steps are the chunked scheduler's: no step prefills more than the
    # token budget, while a plain continuous step prefills whole prompts of 8 tokens.
    assert chunked["prefill_tokens"].max() <= CHUNKED["max_num_batched_tokens"]
    assert static["prefill_tokens"].max() >= 8
    assert list(chunked["step"]) == list(range(len(chunked)))


def test_another_key_keeps_the_scheduler_policy_beside_the_name(tiny_model, tiny_workload,
                                                                one_thread):  # fmt: skip
    runs = [EngineRun("sarathi", 2, "continuous", CHUNKED, key="scheme")]
    rows = steps_of(tiny_model, tiny_workload, runs)
    assert list(rows[0])[:3] == ["scheme", "policy", "step"]
    assert {(r["scheme"], r["policy"]) for r in rows} == {("sarathi", "continuous")}


def test_occupancy_engine_steps_keep_their_columns(tmp_path, runner):
    out = tmp_path / "run"
    args = ["occupancy", "--engine", "real", "--preset", "tiny", "--device", "cpu", "--requests",
            "4", "--slots", "2", "--median", "2", "--max-output", "4", "--prompt-len", "4",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    steps = pd.read_csv(out / "engine_steps.csv")
    assert list(steps.columns[:3]) == ["policy", "step", "active"]
    assert "scheduler_policy" not in steps.columns
    assert list(dict.fromkeys(steps["policy"])) == ["static", "continuous"]
