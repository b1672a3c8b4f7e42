"""Issue 29, items 4-8: work and memory bounded before anything runs. A KV budget's free list
does not grow with the budget; the real engine's paged pool is checked against free memory;
explicit --real-rates fit --real-time; serve-sweep's simulation and occupancy's memory
policies have a work bound. Each refusal is one line naming the option (exit code 2)."""

from __future__ import annotations

import json
import math
import random
import tracemalloc
from collections import deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_hostile_properties import QUICK, one_line_error, refused_in_one_line
from test_serve import CPU_LIKE, write_step_costs

from benchbatch.app.cli import app
from benchbatch.core.kvblocks import BlockManager
from benchbatch.core.options import RunOptions, WorkloadOptions
from benchbatch.core.workload import Request
from benchbatch.errors import UserError

# --- item 4: the free-block list does not grow with the budget ---------------------------------


class DequeBlocks:
    """The reference: the whole pool in a first-in, first-out queue (vLLM's free queue)."""

    def __init__(self, n: int) -> None:
        self.free, self.tables = deque(range(n)), {}

    def grow(self, slot: int, blocks: int):
        table = self.tables.setdefault(slot, [])
        need = max(0, blocks - len(table))
        if need > len(self.free):
            return None
        new = [(len(table) + i, self.free.popleft()) for i in range(need)]
        table.extend(b for _, b in new)
        return new

    def release(self, slot: int) -> int:
        table = self.tables.pop(slot, [])
        self.free.extend(table)
        return len(table)


def test_a_huge_budget_costs_nothing_until_its_blocks_are_used():
    tracemalloc.start()
    try:
        bm = BlockManager(10**6, 16)
        assert bm.grow(0, 40) == [(0, 0), (1, 1), (2, 2)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, peak  # a queue of a million ints is tens of MB
    huge = BlockManager(10**15, 16)
    assert huge.num_free == 10**15 and huge.grow(3, 16) == [(0, 0)]
    assert huge.num_used == 1 and huge.free(3) == 1 and huge.num_free == 10**15
    huge.check()


@QUICK
@given(
    blocks=st.integers(1, 40),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 60)), max_size=60),
)
def test_blocks_are_handed_out_in_the_same_order_as_a_whole_queue(blocks, ops):
    bm, ref = BlockManager(blocks, 4), DequeBlocks(blocks)
    for grow, slot, tokens in ops:
        if grow:
            assert bm.grow(slot, tokens) == ref.grow(slot, -(-tokens // 4))
        else:
            assert bm.free(slot) == ref.release(slot)
        assert bm.num_free == len(ref.free) and bm.num_used == blocks - len(ref.free)
        assert bm.table(slot) == ref.tables.get(slot, [])
        bm.check()


def test_occupancy_with_a_kv_memory_of_a_trillion_gib_runs(runner, tmp_path):
    out = tmp_path / "run"
    args = ["occupancy", "--kv-memory", "1e12", "--requests", "20", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "memory.csv").is_file()


# --- item 5: the real engine's paged pool against free memory -----------------------------------


def test_a_real_paged_pool_larger_than_memory_is_refused_before_the_folder(runner, tmp_path):
    out = tmp_path / "never"
    args = ["occupancy", "--engine", "real", "--preset", "tiny", "--device", "cpu",
            "--kv-memory", "1e6", "--requests", "4", "--out", str(out)]  # fmt: skip
    line = one_line_error(runner.invoke(app, args), "--kv-memory")
    assert "GiB" in line and not out.exists()


def test_the_pool_is_checked_against_free_memory_beside_the_weights(runner, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    from benchbatch.core import accounting
    from benchbatch.core.config import preset
    from benchbatch.runtime import device, session

    cfg, target = preset("tiny"), session.target_of(RunOptions(device="cpu"))
    weights = accounting.weight_bytes(cfg, target.dtype_name) + 16 * cfg.max_context * cfg.head_dim
    pool = 101 * 16 * accounting.kv_bytes_per_token(cfg, target.dtype_name)  # and a scratch
    monkeypatch.setattr(device, "free_memory_bytes", lambda dev: weights + pool)
    session.check_pool_fits(cfg, target, 100, 16, "kv_memory")  # exactly fits
    monkeypatch.setattr(device, "free_memory_bytes", lambda dev: weights + pool - 1)
    with pytest.raises(UserError) as e:
        session.check_pool_fits(cfg, target, 100, 16, "kv_memory")
    refused_in_one_line(e.value, "kv_memory")
    monkeypatch.setattr(device, "free_memory_bytes", lambda dev: weights - 1)
    session.check_pool_fits(cfg, target, 100, 16, "kv_memory")  # the weights: check_fits'
    # through the command line: a little memory free beside the weights, a MiB asked for
    monkeypatch.setattr(device, "free_memory_bytes", lambda dev: weights + 2**19)
    out = tmp_path / "never"
    args = ["occupancy", "--engine", "real", "--preset", "tiny", "--device", "cpu",
            "--kv-memory", "0.001", "--requests", "4", "--out", str(out)]  # fmt: skip
    one_line_error(runner.invoke(app, args), "--kv-memory")
    assert not out.exists()


# --- item 6: explicit --real-rates within --real-time -------------------------------------------


def test_a_real_rate_that_waits_hours_is_refused_before_the_folder(runner, tmp_path):
    out = tmp_path / "never"
    args = ["serve-sweep", "--preset", "tiny", "--requests", "30", "--real-rates", "0.001",
            "--real-requests", "10", "--out", str(out)]  # fmt: skip
    line = one_line_error(runner.invoke(app, args), "--real-rates")
    assert "--real-time" in line and " h " in line and not out.exists()


@QUICK
@given(
    rates=st.lists(st.sampled_from(["0.01", "0.3", "1", "7", "50", "max"]), min_size=1,
                   max_size=4),  # fmt: skip
    real_time=st.floats(0.5, 500),
    n=st.integers(1, 30),
    seed=st.integers(0, 50),
)
def test_accepted_real_rates_arrive_within_the_real_time(rates, real_time, n, seed):
    from benchbatch.experiments.serve import work_checks as checks
    from benchbatch.experiments.serve import workloads
    from benchbatch.experiments.serve.options import ServeOptions

    opts = ServeOptions(real_rates=tuple(rates), real_requests=n, real_time=real_time)
    w = workloads.draw(opts, WorkloadOptions(requests=30, max_output=64, median=16.0), seed)
    try:
        checks.check_real_rates(opts, w)
    except UserError as e:
        refused_in_one_line(e, "real_rates")
        return
    waits = sum(float(w.at(r, n)[1].max()) for r in opts.real_rate_values)
    assert waits * len(opts.policies) <= real_time * (1 + 1e-9)


# --- item 7: serve-sweep's simulated work -------------------------------------------------------


@pytest.fixture(scope="module")
def step_costs(tmp_path_factory):
    return write_step_costs(tmp_path_factory.mktemp("costs"))


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--requests", "10000000"], "--requests"),
        (["--requests", "2000", "--rates", ",".join(str(r) for r in range(1, 65))], "--rates"),
        (["--output-dist", "fixed", "--median", "10000000", "--max-output", "10000000",
          "--requests", "50"], "--max-output"),  # fmt: skip
    ],
)
def test_a_sweep_past_the_work_bound_is_refused(runner, tmp_path, step_costs, extra, flag):
    out = tmp_path / "never"
    for engine in (["--engine", "sim", "--step-costs", str(step_costs)], []):
        result = runner.invoke(app, ["serve-sweep", *engine, *extra, "--out", str(out)])
        assert "steps' work" in one_line_error(result, flag)
        assert not out.exists()


def test_a_long_trace_is_refused(runner, tmp_path, step_costs):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_tokens,output_tokens\n" + "16,20\n" * 50_000)
    out = tmp_path / "never"
    args = ["serve-sweep", "--engine", "sim", "--step-costs", str(step_costs), "--trace",
            str(trace), "--out", str(out)]  # fmt: skip
    one_line_error(runner.invoke(app, args), "--trace")
    assert not out.exists()


@QUICK
@given(
    lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)), min_size=1,
                     max_size=12),  # fmt: skip
    policy=st.sampled_from(["static", "continuous", "chunked"]),
    rate=st.sampled_from([0.5, 5.0, 100.0, math.inf]),
    slots=st.integers(1, 6),
    budget=st.integers(64, 600),
    seed=st.integers(0, 10**6),
)
def test_the_work_bound_is_an_upper_bound_on_the_steps(lengths, policy, rate, slots, budget,
                                                       seed):  # fmt: skip
    """Whatever the workload, a point takes at most steps_bound steps: the bound refuses
    what it must and never lets a longer simulation through."""
    from benchbatch.core.serving import ServingSLO
    from benchbatch.experiments.serve import probe, workloads
    from benchbatch.experiments.serve import work_checks as checks
    from benchbatch.experiments.serve.options import ServeOptions

    requests = [Request(i, p, o, 0) for i, (p, o) in enumerate(lengths)]
    rng = random.Random(seed)
    unit = [0.0]
    for _ in requests[1:]:
        unit.append(unit[-1] + rng.expovariate(1.0))
    w = workloads.ServeWorkload(requests, np.array(unit), "poisson", "")
    opts = ServeOptions(policies=(policy,), max_num_batched_tokens=budget)
    setup = probe.Setup(slots, budget, opts.chunk, ServingSLO(2.0, 0.2))
    point = probe.simulate_point(w, policy, rate, setup, CPU_LIKE)
    assert len(point.step_ends) <= checks.steps_bound(opts, requests)


# --- item 8: occupancy's memory policies --------------------------------------------------------


def test_one_enormous_output_skips_the_memory_policies_with_a_note(runner, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_tokens,output_tokens\n16,10000000\n16,20\n32,30\n")
    out = tmp_path / "run"
    result = runner.invoke(app, ["occupancy", "--trace", str(trace), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "memory policies skipped" in result.output and "--trace" in result.output
    assert (out / "occupancy.csv").is_file() and not (out / "memory.csv").exists()


@QUICK
@given(
    lengths=st.lists(st.tuples(st.integers(1, 50), st.integers(1, 80), st.integers(0, 30)),
                     min_size=1, max_size=16),  # fmt: skip
    slots=st.integers(1, 6),
)
def test_the_memory_work_estimate_covers_the_steps_and_tokens(lengths, slots):
    """The estimate the skip is decided on is no less than the work the policies do (each
    policy's steps, and every output token) with the default budget (the slots' worth)."""
    from benchbatch.core.config import preset
    from benchbatch.experiments.occupancy import memory as mprobe
    from benchbatch.experiments.occupancy.run import memory_work

    requests = [Request(i, p, o, a) for i, (p, o, a) in enumerate(lengths)]
    reserve = max(o for _, o, _ in lengths)
    bpt = mprobe.bytes_per_token(preset("tiny"), "fp32")
    setup = mprobe.setup(requests, slots, 16, reserve, bpt, None, "")
    sims = mprobe.simulate(requests, setup)
    steps = sum(s.total_steps for s in sims.values())
    assert steps + sum(o for _, o, _ in lengths) <= memory_work(requests, setup)


def test_real_rates_the_fitted_model_expects_past_the_real_time_are_refused(runner, tmp_path):
    """Arrivals alone fit (everything queued at once), but the cost model's estimate of the
    points does not: refused before any point is served on the model."""
    out = tmp_path / "run"
    args = ["serve-sweep", "--preset", "tiny", "--device", "cpu", "--requests", "30",
            "--median", "4", "--max-output", "8", "--prompt-len", "16", "--max-prompt", "64",
            "--rates", "max", "--real-rates", "max", "--real-requests", "8", "--real-time",
            "1e-4", "--repeats", "1", "--min-time", "0", "--warmup", "0",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --real-rates:") and "cost model expects" in last, last
    assert not (out / "real_steps.csv").exists()
    assert json.loads((out / "metadata.json").read_text())["status"] == "failed"
