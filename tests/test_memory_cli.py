"""Memory limits the batch, on the command line: occupancy's memory policies on one KV budget
(simulated and on a tiny model), sweep's memory ceiling, --kv-layout, and one-line answers to
bad budgets."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.core import accounting
from benchbatch.core.config import preset

pytestmark = pytest.mark.usefixtures("one_thread")

WORKLOAD = ["--requests", "200", "--median", "40", "--max-output", "400", "--prompt-len", "32"]
ARTICLE_TOKEN = accounting.kv_bytes_per_token(preset("article"), "fp16")  # 96 KiB
REAL = ["--engine", "real", "--preset", "tiny", "--device", "cpu"]
SMALL = ["--requests", "16", "--slots", "4", "--median", "8", "--max-output", "24",
         "--prompt-len", "8"]  # fmt: skip


def occupancy(runner, out, *extra):
    return runner.invoke(app, ["occupancy", "--out", str(out), *extra])


def test_paging_runs_more_sequences_than_reservation_on_the_same_memory(runner, tmp_path):
    # 0.5 GiB of the article's fp16 KV (96 KiB a token): 341 blocks of 16 tokens; each
    # reservation of 32 + 400 tokens takes 27 blocks, so 12 reserved slots.
    result = occupancy(runner, tmp_path / "run", *WORKLOAD, "--slots", "64", "--kv-memory", "0.5")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "run" / "memory.csv").set_index("policy")
    assert list(rows.index) == ["static-reserve", "continuous-reserve", "continuous-paged"]
    assert (rows["kv_budget_blocks"] == 341).all()
    assert rows.loc["continuous-reserve", "peak_running"] == 12
    paged, reserved = rows.loc["continuous-paged"], rows.loc["continuous-reserve"]
    assert paged["peak_running"] > 2 * reserved["peak_running"]
    assert paged["mean_running"] > 2 * reserved["mean_running"]
    assert paged["slot_occupancy"] > 1 > reserved["slot_occupancy"]
    assert reserved["fragmentation"] > 0.5 > paged["fragmentation"]
    assert (rows["kv_reserved_peak_tokens"] <= 341 * 16).all()
    assert paged["preemptions"] > 0 and reserved["preemptions"] == 0
    budget = 341 * 16 * ARTICLE_TOKEN / 2**30
    assert (rows["kv_budget_gib"] / budget - 1).abs().max() < 1e-5  # 6 significant digits
    timeline = pd.read_csv(tmp_path / "run" / "memory_timeline.csv")
    assert timeline.groupby("policy")["running"].max().to_dict() == rows["peak_running"].to_dict()
    assert (timeline["kv_used_tokens"] <= timeline["kv_reserved_tokens"]).all()
    assert (tmp_path / "run" / "memory.png").stat().st_size > 10_000
    assert "paged blocks ran" in result.stdout and "preemptions" in result.stdout
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["memory"]["paged_peak_running"] == paged["peak_running"]
    assert "--kv-memory 0.5 GiB" in meta["memory"]["budget"]


def test_by_default_the_budget_is_the_slot_count_worth(runner, tmp_path):
    result = occupancy(runner, tmp_path / "run", *WORKLOAD, "--slots", "8", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    memory = {r["policy"]: r for r in doc["memory"]}
    plain = {r["policy"]: r for r in doc["rows"]}
    assert memory["static-reserve"]["kv_budget_blocks"] == 8 * 27  # 8 x (32 + 400) tokens
    for policy in ("static", "continuous"):
        assert memory[f"{policy}-reserve"]["total_steps"] == plain[policy]["total_steps"]
        assert memory[f"{policy}-reserve"]["slot_occupancy"] == pytest.approx(
            plain[policy]["occupancy"]
        )
    assert "the slot count's worth" in doc["memory_summary"]["budget"]


def test_a_fitted_step_cost_prices_the_memory_policies_in_seconds(runner, tmp_path):
    # Decode steps of 1 to 64 sequences costing 2 ms + 0.5 ms a sequence.
    costs = tmp_path / "sweep.csv"
    lines = ["phase,batch,tokens,context,step_ms,status"]
    lines += [f"decode,{b},1,64,{2 + 0.5 * b},ok" for b in (1, 8, 32, 64)]
    costs.write_text("\n".join(lines) + "\n")
    args = [*WORKLOAD, "--kv-memory", "0.5", "--step-costs", str(costs)]
    result = occupancy(runner, tmp_path / "run", *args)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "run" / "memory.csv").set_index("policy")
    assert (rows["time_unit"] == "s").all()
    # Every step costs the 2 ms base, and a step of n sequences 0.5 ms more each.
    useful = rows["mean_running"] * rows["total_steps"]
    expected = 2e-3 * rows["total_steps"] + 0.5e-3 * useful
    others = rows.index != "static-reserve"
    err = (rows["total_time"] - expected)[others].abs()
    assert err.max() < 0.02 * expected.max()
    # Static batching's finished slots still decode padding until their group ends (the
    # real engine computes them): priced as sequences, so more than its useful rows, and
    # at most every reserved slot in every step.
    static = rows.loc["static-reserve"]
    assert static["total_time"] > 1.05 * expected["static-reserve"]
    most = (2e-3 + 0.5e-3 * (static["kv_budget_blocks"] // 27)) * static["total_steps"]
    assert static["total_time"] <= most
    assert "time (fitted step cost): static-reserve" in result.stdout


def test_the_memory_policies_on_the_real_engine_take_the_simulated_steps(runner, tmp_path):
    # Tiny fp32: 512 B a token, so 0.0001 GiB holds 13 blocks of 16 (2 blocks a reservation).
    args = [*REAL, *SMALL, "--kv-memory", "0.0001", "--kv-layout", "paged"]
    result = occupancy(runner, tmp_path / "run", *args)
    assert result.exit_code == 0, result.output
    sim = pd.read_csv(tmp_path / "run" / "memory.csv").set_index("policy")
    real = pd.read_csv(tmp_path / "run" / "memory_engine.csv").set_index("policy")
    assert list(real.index) == list(sim.index)
    for column in ("total_steps", "peak_running", "preemptions", "kv_reserved_mean_tokens"):
        assert (real[column] == sim[column]).all(), column
    assert (real["wall_s"] > 0).all() and (real["kv_cache_gib"] > 0).all()
    peak = sim["peak_running"]
    assert peak["continuous-paged"] > peak["continuous-reserve"]
    steps = pd.read_csv(tmp_path / "run" / "memory_engine_steps.csv")
    assert set(steps["memory_policy"]) == set(sim.index)
    engine = pd.read_csv(tmp_path / "run" / "engine.csv")
    assert list(engine["policy"]) == ["static", "continuous"]  # in the paged layout
    assert "memory policies (real engine" in result.stdout


def test_without_kv_memory_the_real_engine_runs_only_the_slot_policies(runner, tmp_path):
    result = occupancy(runner, tmp_path / "run", *REAL, *SMALL)
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "run" / "memory_engine.csv").exists()
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert "free beside the weights" in meta["memory"]["budget"]


# --- bad budgets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-memory", "0"], "--kv-memory: must be more than 0, got 0"),
        (["--kv-memory", "-2"], "--kv-memory: must be more than 0, got -2"),
        (["--kv-memory", "nan"], "--kv-memory: must be a finite number"),
        (["--block-size", "0"], "--block-size: must be at least 1, got 0"),
        (["--block-size", "-16"], "--block-size: must be at least 1, got -16"),
        # 0.001 GiB: 10 tokens of the article's KV, not one block of 16.
        (["--kv-memory", "0.001"], "less than one 32-token prompt (2 blocks)"),
        # 0.01 GiB: 6 blocks, a 32-token prompt but not its 400 output tokens (27 blocks).
        (["--kv-memory", "0.01"], "less than one request reserves: a 32-token prompt and 400"),
        (["--kv-layout", "paged"], "--kv-layout: is the real engine's cache: needs --engine real"),
    ],
)
def test_bad_budgets_are_one_line_and_exit_2(runner, tmp_path, args, message):
    result = occupancy(runner, tmp_path / "run", *WORKLOAD, *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_sweep_refuses_an_unknown_gpu_and_a_bad_block_size(runner, tmp_path):
    for args, message in (
        (["--gpu", "voodoo5"], "--gpu: no datasheet memory for 'voodoo5'; known: h200"),
        (["--gpu", "v100"], "--gpu: no datasheet memory for 'v100'"),
        (["--block-size", "0"], "--block-size: must be at least 1"),
        (["--kv-layout", "blocky"], "blocky"),
    ):
        result = runner.invoke(app, ["sweep", "--preset", "tiny", "--out", str(tmp_path), *args])
        assert result.exit_code == 2, result.output
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


@pytest.mark.parametrize("command", ["sweep", "phases"])
def test_a_paged_block_longer_than_the_context_is_refused(runner, tmp_path, command):
    # A 100,000-token block on the tiny preset's context: a pool no sequence reaches, read
    # whole by every gather (decode b=1 took 16x its time at 16 before it was refused).
    args = [command, "--preset", "tiny", "--device", "cpu", "--out", str(tmp_path / "run")]
    result = runner.invoke(app, [*args, "--kv-layout", "paged", "--block-size", "100000"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --block-size: 100,000 tokens a "
                                                  "block is more than --max-context "), lines
    assert not (tmp_path / "run").exists()
    # The same block with the contiguous cache is not read: no refusal for it.
    from benchbatch.core.config import PRESETS
    from benchbatch.experiments.fields import check_block_fits

    check_block_fits(PRESETS["tiny"], "contiguous", 100_000)
    check_block_fits(PRESETS["tiny"], "paged", PRESETS["tiny"].max_context)


# --- sweep and phases ------------------------------------------------------------------------


def test_sweep_gives_the_memory_ceiling_of_the_workload_and_runs_paged(runner, tmp_path):
    args = ["sweep", "--preset", "tiny", "--device", "cpu", "--batch", "1,2", "--context", "8",
            "--repeats", "1", "--min-time", "0", "--no-roofline", "--kv-layout", "paged",
            "--block-size", "4", "--gpu", "h100", "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    ceiling = pd.read_csv(tmp_path / "run" / "memory_ceiling.csv")
    assert list(ceiling["where"]) == ["this device (available RAM)", "H100 SXM (80 GiB datasheet)"]
    assert (ceiling["reserved_tokens"] == 64 + 2000).all()  # the default workload's
    assert (ceiling["paged_sequences"] > 5 * ceiling["reserved_sequences"]).all()
    assert ceiling["memory_bytes"].iloc[1] == 80 * 2**30
    assert "memory ceiling for the workload's lengths on H100 SXM" in result.stdout
    sweep = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert (sweep["kv_layout"] == "paged").all() and (sweep["status"] == "ok").all()


def test_phases_times_paged_steps(runner, tmp_path):
    args = ["phases", "--preset", "tiny", "--device", "cpu", "--prefill", "8", "--decode-batch",
            "1,2", "--context", "8", "--repeats", "1", "--min-time", "0", "--no-roofline",
            "--kv-layout", "paged", "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "run" / "phases.csv")
    assert (rows["kv_layout"] == "paged").all() and (rows["step_ms"] > 0).all()
