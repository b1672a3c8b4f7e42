"""The memory policies on the slot count's worth reproduce static and continuous batching step
for step, also with prompts of mixed lengths (issue 28: sized by tokens, the reservations of
short prompts fitted 9 and more sequences into 8 slots' worth, and static-reserve took 5,466
steps against static's 6,196). An explicit --kv-memory still runs as many as it reserves."""

from __future__ import annotations

import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.core import memory
from benchbatch.core.simulate import run_policies
from benchbatch.core.workload import lognormal_columns
from benchbatch.experiments.occupancy import memory as mprobe

SLOTS, BLOCK, OUTPUT = 8, 16, 200


def mixed(seed: int, requests: int = 200):
    """A fifth of the prompts 16 times longer than the rest, as --long-prompt-fraction 0.2."""
    return lognormal_columns(requests, median=20, sigma=0.9, max_output=OUTPUT, prompt_len=16,
                             long_prompt_fraction=0.2, long_prompt_len=256, seed=seed)  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_the_slot_count_worth_reproduces_the_slot_policies_with_mixed_prompts(seed):
    requests = mixed(seed)
    assert len(set(requests.prompt_tokens.tolist())) == 2  # short and long prompts both
    setup = mprobe.setup(requests, SLOTS, BLOCK, OUTPUT, 1024, None, "")
    assert setup.blocks == SLOTS * memory.slot_blocks(BLOCK, 256, OUTPUT)
    mem = memory.run(requests, setup)
    plain = run_policies(requests, SLOTS)
    for policy in ("static", "continuous"):
        reserved = mem[f"{policy}-reserve"]
        assert max(reserved.timeline.active_slots) <= SLOTS
        assert reserved.total_steps == plain[policy].total_steps, policy
        assert reserved.timeline.active_slots == plain[policy].timeline.active_slots, policy
    assert max(mem["continuous-paged"].timeline.active_slots) > SLOTS  # paging: more at once


def test_without_the_cap_short_reservations_would_run_more_than_the_slots():
    """The failure the cap removes, shown on the same budget: memory alone lets a ninth
    sequence in (so this test's workload is one the claim could fail on)."""
    requests = mixed(0)
    capped = mprobe.setup(requests, SLOTS, BLOCK, OUTPUT, 1024, None, "")
    uncapped = memory.MemorySetup(capped.blocks, BLOCK, OUTPUT, 1024, "", capped.slots)
    mem = memory.run(requests, uncapped, policies=("static-reserve",))["static-reserve"]
    assert max(mem.timeline.active_slots) > SLOTS
    assert mem.total_steps != run_policies(requests, SLOTS)["static"].total_steps


def test_an_explicit_budget_runs_as_many_as_it_reserves():
    """--kv-memory: no slot cap, so short prompts' reservations pack more sequences than the
    budget holds of the longest (what reservation by tokens means)."""
    requests = mixed(1)
    held = SLOTS * memory.slot_blocks(BLOCK, 256, OUTPUT) * BLOCK * 1024  # bytes
    setup = mprobe.setup(requests, SLOTS, BLOCK, OUTPUT, 1024, held, "--kv-memory")
    assert setup.reserve_slots is None and setup.slots == SLOTS
    mem = memory.run(requests, setup, policies=("continuous-reserve",))["continuous-reserve"]
    assert max(mem.timeline.active_slots) > SLOTS


def test_occupancy_memory_policies_match_static_and_continuous(tmp_path, runner):
    """The command as the issue ran it (fewer requests): memory.csv's reserving policies take
    occupancy.csv's steps and never run more than --slots."""
    out = tmp_path / "run"
    args = ["occupancy", "--slots", "8", "--long-prompt-fraction", "0.2", "--requests", "120",
            "--max-output", "300", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    steps = pd.read_csv(out / "occupancy.csv").set_index("policy")["total_steps"]
    mem = pd.read_csv(out / "memory.csv").set_index("policy")
    for policy in ("static", "continuous"):
        assert mem.loc[f"{policy}-reserve", "total_steps"] == steps[policy]
        assert mem.loc[f"{policy}-reserve", "peak_running"] <= 8
