"""serve-sweep: the real engine with arrivals on the wall clock, the workload (length
distributions, traces with arrival_s), the choice of rates and the SLO table, and the
command end to end (simulated with --step-costs, and on a tiny model), with one-line
answers to bad rates, lengths and SLOs."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.core.options import WorkloadOptions
from benchbatch.core.serving import ServingSLO
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.workload import Request, output_array
from benchbatch.errors import UserError
from benchbatch.experiments.serve import probe, rate_choice, workloads
from benchbatch.experiments.serve.options import (
    SERVE_SLO,
    SERVE_WORKLOAD,
    ServeOptions,
)
from benchbatch.experiments.serve.rates import parse_rates, rate_label
from benchbatch.runtime.engine import Engine, run_alone

pytestmark = pytest.mark.usefixtures("one_thread")

# Close to what cpu-small (fp32, 2 cores) measured: a decode step of 8 about 33 ms, a
# 1,024-token prefill about 300 ms (as tests/test_ablation.py's CPU_LIKE).
CPU_LIKE = StepCostModel(0.016, 0.002, 0.00027, 5e-7)


# --- the real engine, arrivals on the wall clock ----------------------------------------------


class VirtualTime:
    """The engine's clock in virtual time: each reading advances it 0.1 ms (a step takes a
    few readings: well under a millisecond) and a sleep jumps it ahead, so where the steps
    fall against the arrivals does not depend on how busy the machine is (a wall clock at
    load 8 ran the first four requests past the last two's arrival)."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 1e-4
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    thread_time = perf_counter


def test_the_engine_admits_a_request_only_after_it_arrives(tiny_model, monkeypatch):
    from benchbatch.runtime import engine as engine_module
    from benchbatch.runtime import run_state

    clock = VirtualTime()  # one clock for the loop's arrivals and the steps' stamps
    monkeypatch.setattr(engine_module, "time", clock)
    monkeypatch.setattr(run_state, "time", clock)
    requests = [Request(i, 5 + i, 3 + i % 4) for i in range(6)]
    arrivals = [0.0, 0.0, 0.05, 0.05, 0.3, 0.31]  # the engine idles before the last two
    engine = Engine(tiny_model, "continuous", slots=4, seed=3)
    records = list(engine.steps(requests, arrivals))
    result = engine.result
    assert result.complete
    # Batching and waiting change no token.
    for r in requests:
        assert result.tokens[r.id] == run_alone(tiny_model, r, seed=3)
    starts = [s.start_s for s in records]
    ends = [s.end_s for s in records]
    assert all(a <= b for a, b in zip(starts, ends, strict=True))
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))
    by_id = {m.request_id: m for m in result.metrics.requests}
    for r, t in zip(requests, arrivals, strict=True):
        m = by_id[r.id]
        assert m.arrival == t and m.ttft > 0
        # Its first token came from the first step that started after it arrived (free
        # slots: 4 slots never hold more than 4 requests here at once).
        first = next(i for i, s in enumerate(starts) if s >= t)
        assert m.first_token == ends[first]
    # Nothing to run between the first four and the last two: the engine waited.
    assert any(s >= 0.3 and e < 0.3 for e, s in zip(ends, starts[1:], strict=False))
    assert result.step_end_times() == ends
    # The host gap before each step: none for the first and after an idle wait (the loop
    # slept until an arrival between the two steps), else the time from the previous step's
    # end to this one's start, as stamped.
    assert records[0].gap_s is None
    for i in range(1, len(records)):
        if records[i].gap_s is None:
            assert any(ends[i - 1] < t <= starts[i] for t in arrivals), i
        else:
            assert records[i].gap_s == pytest.approx(starts[i] - ends[i - 1], abs=1e-6)
    waited = [i for i in range(1, len(records)) if ends[i - 1] < 0.3 <= starts[i]]
    assert waited and all(records[i].gap_s is None for i in waited)


def test_steps_without_arrivals_are_stamped_as_before(tiny_model):
    engine = Engine(tiny_model, "static", slots=2, seed=1)
    records = list(engine.steps([Request(0, 4, 3), Request(1, 4, 2)]))
    assert all(r.start_s is None and "end_s" not in r.row() for r in records)
    assert engine.result.metrics.requests[0].arrival == 0.0


# --- the workload ---------------------------------------------------------------------------------


def serve_workload(**changes) -> tuple[ServeOptions, WorkloadOptions]:
    opts_fields = {k: v for k, v in changes.items() if k in ServeOptions.__dataclass_fields__}
    work = {k: v for k, v in changes.items() if k not in opts_fields}
    return ServeOptions(**opts_fields), WorkloadOptions(**(SERVE_WORKLOAD | work))


def test_length_distributions_keep_their_bounds():
    opts, work = serve_workload(output_dist="uniform", min_output=5, max_output=9,
                                prompt_dist="fixed", prompt_len=33)  # fmt: skip
    w = workloads.draw(opts, work, seed=2)
    outputs = np.array([r.output_tokens for r in w.requests])
    assert outputs.min() == 5 and outputs.max() == 9 and len(set(outputs)) == 5
    assert {r.prompt_tokens for r in w.requests} == {33}
    opts, work = serve_workload(prompt_sigma=1.5, max_prompt=300, min_prompt=20)
    prompts = np.array([r.prompt_tokens for r in workloads.draw(opts, work, seed=2).requests])
    assert prompts.min() == 20 and prompts.max() == 300  # clipped at both ends
    assert np.median(prompts) == pytest.approx(128, rel=0.25)


def test_lognormal_outputs_are_the_occupancy_workloads():
    opts, work = serve_workload()
    w = workloads.draw(opts, work, seed=7)
    expected = output_array(work.requests, work.median, work.sigma, work.max_output, 7)
    assert [r.output_tokens for r in w.requests] == expected.tolist()


def test_every_rate_scales_the_same_arrivals():
    opts, work = serve_workload(requests=50)
    w = workloads.draw(opts, work, seed=1)
    _, at_2 = w.at(2.0)
    _, at_4 = w.at(4.0, n=10)
    assert at_2[0] == 0.0 and np.allclose(at_4, at_2[:10] / 2)
    assert not w.at(math.inf)[1].any()


def test_a_trace_with_arrival_s_is_replayed_at_each_rate(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_tokens,output_tokens,arrival_s\n10,3,5.0\n20,4,5.5\n30,5,7.0\n")
    opts, work = serve_workload(trace=trace)
    w = workloads.draw(opts, work, seed=0)
    assert [(r.prompt_tokens, r.output_tokens) for r in w.requests] == [(10, 3), (20, 4), (30, 5)]
    assert w.at(1.0)[1].tolist() == [0.0, 0.5, 2.0]  # 2 gaps over 2 s: already 1 per second
    assert w.at(2.0)[1].tolist() == [0.0, 0.25, 1.0]


def test_burstiness_applies_to_drawn_arrivals_and_not_to_a_traces_own(tmp_path):
    opts, work = serve_workload()
    bursty = workloads.draw(replace(opts, burstiness=0.25), work, seed=0)
    assert bursty.arrivals == "gamma gaps, burstiness 0.25: coefficient of variation 2"
    assert workloads.draw(opts, work, seed=0).arrivals == "poisson"
    assert [r.output_tokens for r in bursty.requests] == [
        r.output_tokens for r in workloads.draw(opts, work, seed=0).requests
    ]  # the lengths do not move with the arrivals
    trace = tmp_path / "t.csv"
    trace.write_text("output_tokens\n3\n4\n5\n")
    opts, work = serve_workload(trace=trace)
    assert workloads.draw(replace(opts, burstiness=4.0), work, seed=0).arrivals.startswith("gamma")
    trace.write_text("output_tokens,arrival_s\n3,0\n4,1\n")
    with pytest.raises(UserError, match="its own arrival times") as e:
        workloads.draw(replace(opts, burstiness=4.0), work, seed=0)
    assert e.value.option == "burstiness"


@pytest.mark.parametrize(
    "body, message",
    [
        ("output_tokens,arrival_step\n3,0\n4,2\n", "arrival_step"),
        ("output_tokens,arrival_s\n3,0\n4,soon\n", "line 3: arrival_s 'soon' is not a number"),
        ("output_tokens,arrival_s\n3,-1\n", "finite number of seconds"),
        ("output_tokens,arrival_s\n3,\n", "arrival_s is empty"),
    ],
)
def test_bad_trace_arrivals_are_named(tmp_path, body, message):
    trace = tmp_path / "t.csv"
    trace.write_text(body)
    opts, work = serve_workload(trace=trace)
    with pytest.raises(UserError, match=message):
        workloads.draw(opts, work, seed=0)


# --- rates, knees and the SLO table --------------------------------------------------------------


def test_rates_parse_sorted_with_max_last():
    assert parse_rates(("4", "0.5", "max", "4.0"), "rates") == (0.5, 4.0, math.inf)


def rows(policy: str, source: str, verdicts: dict[float, bool]) -> list[dict]:
    return [
        {"policy": policy, "source": source, "rate": rate_label(r), "rate_rps": r,
         "within_slo": ok, "goodput_rps": r, "output_throughput_tps": 10 * r}
        for r, ok in verdicts.items()
    ]  # fmt: skip


def test_sustained_is_the_rate_before_the_first_miss():
    table = (
        rows("static", "sim", {1.0: True, 2.0: False, 3.0: True, math.inf: False})
        + rows("continuous", "sim", {1.0: True, 2.0: True, 3.0: True, math.inf: False})
        + rows("chunked", "sim", {1.0: False, 2.0: False})
        + rows("continuous", "real", {2.0: True})
    )
    by = {(r["policy"], r["source"]): r for r in probe.sustained(table)}
    assert by[("static", "sim")]["sustained_rps"] == 1.0  # 3.0 passing again does not count
    assert by[("static", "sim")]["leaves_slo_at"] == "2"
    assert by[("continuous", "sim")]["sustained_rate"] == "3"
    assert by[("continuous", "sim")]["leaves_slo_at"] == "max"
    assert by[("chunked", "sim")]["sustained_rate"] is None
    assert by[("continuous", "real")]["leaves_slo_at"] is None


def test_real_rates_take_the_knees_first_then_the_cheapest():
    matched = rows("static", probe.MATCHED, {1.0: True, 2.0: True, 4.0: False, 8.0: False}) + rows(
        "continuous", probe.MATCHED, {1.0: True, 2.0: True, 4.0: True, 8.0: False}
    )
    cost = {1.0: 100.0, 2.0: 50.0, 4.0: 25.0, 8.0: 15.0}
    chosen, spent = rate_choice.choose_real_rates(matched, cost, budget_s=95.0)
    assert chosen == [2.0, 4.0, 8.0] and spent == 90.0  # knees 2, 4 (static), 4, 8 (cont.)
    chosen, spent = rate_choice.choose_real_rates(matched, cost, budget_s=60.0)
    assert chosen == [2.0] and spent == 50.0  # the first knee that fits; 4 would pass 60


def test_real_rates_take_each_policys_last_point_below_saturation_after_the_slo_knees():
    """Static keeps up with its arrivals only at 1 req/s (40 requests: a 40-s span, E2E p50
    2 s; at 2 req/s 20 s against 5 s), continuous up to 4: both rates join the SLO knees
    (2 and 4, 4 and 8) before the cheapest others, so every policy has a point below
    saturation in the prediction's verdict when the budget allows."""
    e2e = {"static": {1.0: 2.0, 2.0: 5.0, 4.0: 9.0, 8.0: 12.0},
           "continuous": {1.0: 0.5, 2.0: 0.5, 4.0: 0.6, 8.0: 3.0}}  # fmt: skip
    matched = rows("static", probe.MATCHED, {1.0: True, 2.0: True, 4.0: False, 8.0: False}) + rows(
        "continuous", probe.MATCHED, {1.0: True, 2.0: True, 4.0: True, 8.0: False}
    )
    for r in matched:
        r |= {"requests": 40, "e2e_p50_s": e2e[r["policy"]][r["rate_rps"]]}
    assert rate_choice.saturation_rates(matched, probe.MATCHED) == [1.0, 4.0]
    cost = {1.0: 100.0, 2.0: 50.0, 4.0: 25.0, 8.0: 15.0}
    chosen, spent = rate_choice.choose_real_rates(matched, cost, budget_s=200.0)
    assert chosen == [1.0, 2.0, 4.0, 8.0] and spent == 190.0
    chosen, spent = rate_choice.choose_real_rates(matched, cost, budget_s=95.0)
    assert chosen == [2.0, 4.0, 8.0]  # the knees still first: 1 req/s does not fit beside


def test_real_rates_take_the_last_point_below_saturation_with_dearer_steps():
    """Static keeps up at 2 req/s as priced but not with every step 10% dearer (E2E p50 2 s
    against a 20-s span: at 90%; dearer 3 s), where only 1 req/s keeps up: its point in the
    verdict is 1 req/s, off the edge where a few percent of step cost decide. Continuous
    keeps up at no rate when dearer: its last rate as priced (4) stands."""
    e2e = {"static": {1.0: 1.0, 2.0: 2.0, 4.0: 9.0}, "continuous": {1.0: 9.0, 2.0: 9.0, 4.0: 0.6}}
    slower = {"static": {1.0: 2.0, 2.0: 3.0, 4.0: 12.0},
              "continuous": {1.0: 50.0, 2.0: 50.0, 4.0: 50.0}}  # fmt: skip

    def table(latency):
        out = rows("static", probe.MATCHED, {1.0: True, 2.0: True, 4.0: True}) + rows(
            "continuous", probe.MATCHED, {1.0: True, 2.0: True, 4.0: True}
        )
        for r in out:
            r |= {"requests": 40, "e2e_p50_s": latency[r["policy"]][r["rate_rps"]]}
        return out

    priced, dear = table(e2e), table(slower)
    by_policy = rate_choice.saturation_by_policy(priced, probe.MATCHED)
    assert by_policy == {"static": 2.0, "continuous": 4.0}
    assert rate_choice.saturation_by_policy(dear, probe.MATCHED) == {"static": 1.0}
    cost = {1.0: 100.0, 2.0: 50.0, 4.0: 25.0}
    assert rate_choice.choose_real_rates(priced, cost, budget_s=125.0) == ([2.0, 4.0], 75.0)
    chosen, spent = rate_choice.choose_real_rates(priced, cost, budget_s=125.0, dear=dear)
    assert chosen == [1.0, 4.0] and spent == 125.0  # 1 (static, dearer) and 4 (continuous)


def test_the_dearer_simulation_prices_every_step_ten_percent_higher():
    """real._dearer: every request queued at once, each time is the steps' own, so every
    metric of every policy is exactly 1.1 times its simulation as priced (a cheaper, or
    unscaled, simulation would choose rates nearer the edge)."""
    from benchbatch.experiments.serve import real

    opts, work = serve_workload(requests=40, policies=("static", "continuous"))
    setup = probe.Setup(work.slots, 256, 128, ServingSLO(opts.slo_ttft, opts.slo_tpot))
    w = workloads.draw(opts, work, seed=0)
    dear = real._dearer(opts, w, setup, CPU_LIKE, [math.inf], 20)
    assert [r["policy"] for r in dear] == ["static", "continuous"]
    for r in dear:
        priced = probe.point_row(
            probe.simulate_point(w, r["policy"], math.inf, setup, CPU_LIKE, 20, probe.MATCHED),
            setup,
        )
        for metric in ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "duration_s"):
            assert r[metric] == pytest.approx(1.1 * priced[metric], rel=1e-9), metric


def test_continuous_sustains_a_higher_rate_than_static_with_the_cpu_defaults():
    """The default workload and SLO with CPU-like step costs: static batching leaves the SLO
    at a lower rate than continuous batching (what the command's defaults are chosen for)."""
    opts, work = serve_workload(requests=300)
    setup = probe.Setup(work.slots, 256, 128, ServingSLO(opts.slo_ttft, opts.slo_tpot))
    w = workloads.draw(opts, work, seed=0)
    top = [probe.point_row(probe.simulate_point(w, p, math.inf, setup, CPU_LIKE), setup)
           for p in ("static", "continuous")]  # fmt: skip
    rates = rate_choice.auto_rates(rate_choice.capacity(top))
    table = [
        probe.point_row(probe.simulate_point(w, p, r, setup, CPU_LIKE), setup)
        for r in rates
        for p in ("static", "continuous")
    ]
    by = {r["policy"]: r for r in probe.sustained(table)}
    assert by["continuous"]["sustained_rps"] > 2 * by["static"]["sustained_rps"] > 0
    # The knee is the scheduler's: at the max point static fills half its slots at most.
    occupancy = {r["policy"]: r["slot_occupancy"] for r in table if math.isinf(r["rate_rps"])}
    assert occupancy["continuous"] > 0.95 and occupancy["static"] < 0.6


# --- the command ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def step_costs(tmp_path_factory):
    return write_step_costs(tmp_path_factory.mktemp("costs"))


def write_step_costs(folder):
    """A step_cost.csv priced by CPU_LIKE (the cost model the fit recovers)."""
    path = folder / "step_cost.csv"
    lines = ["decode_tokens,prefill_tokens,context_tokens,step_ms"]
    for d, p, c in [(1, 0, 150), (4, 0, 600), (8, 0, 1200), (8, 0, 4000), (0, 128, 0),
                    (0, 1024, 0), (8, 128, 1200), (7, 512, 1000), (0, 128, 896)]:  # fmt: skip
        seconds = CPU_LIKE.base_s + CPU_LIKE.per_decode_token_s * d
        seconds += CPU_LIKE.per_prefill_token_s * p + CPU_LIKE.per_context_token_s * c
        lines.append(f"{d},{p},{c},{seconds * 1e3}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_simulated_sweep_end_to_end(runner, tmp_path, step_costs):
    out = tmp_path / "run"
    args = ["serve-sweep", "--engine", "sim", "--step-costs", str(step_costs), "--requests",
            "150", "--rates", "1,3,max", "--out", str(out), "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    assert len(serve) == 9 and set(serve["rate"]) == {"1", "3", "max"}
    assert set(serve["source"]) == {"sim"} and (serve["requests"] == 150).all()
    for column in ("ttft_p90_s", "tpot_p99_s", "itl_p50_s", "e2e_mean_s", "goodput_rps",
                   "request_throughput_rps", "output_throughput_tps", "duration_s",
                   "slot_occupancy", "mean_batch", "p99_uncertain", "within_slo"):  # fmt: skip
        assert column in serve.columns
    requests = pd.read_csv(out / "requests.csv", dtype={"rate": str})
    assert len(requests) == 9 * 150
    # goodput: the requests meeting both limits, over the duration
    for (policy, rate), mine in requests.groupby(["policy", "rate"]):
        row = serve[(serve["policy"] == policy) & (serve["rate"] == rate)].iloc[0]
        ttft, tpot = SERVE_SLO
        good = ((mine["ttft_s"] <= ttft) & (mine["tpot_s"].fillna(0) <= tpot)).sum()
        assert row["slo_met"] == good == mine["slo_met"].sum()
        assert row["goodput_rps"] == pytest.approx(good / row["duration_s"], rel=1e-5)
    assert {p: s["policy"] for p, s in enumerate(doc["slo"])}
    for name in ("serve.png", "pareto.png", "slo.csv", "step_cost.json", "metadata.json"):
        assert (out / name).exists()
    again = tmp_path / "again"
    assert runner.invoke(app, [*args[:-3], "--out", str(again)]).exit_code == 0
    assert (out / "serve.csv").read_bytes() == (again / "serve.csv").read_bytes()


def test_bursty_arrivals_wait_longer_at_the_same_rate(runner, tmp_path, step_costs):
    """The same requests at the same mean rate, their gaps gamma-distributed: in bursts
    (burstiness 0.25) the tail of TTFT grows and evenly spaced (4) it shrinks, below the
    capacity; the offered rate stays the rate."""
    p99, said = {}, {}
    for b in ("0.25", "1", "4"):
        out = tmp_path / b
        args = ["serve-sweep", "--engine", "sim", "--step-costs", str(step_costs), "--requests",
                "400", "--rates", "3", "--policies", "continuous", "--burstiness", b,
                "--out", str(out)]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        row = pd.read_csv(out / "serve.csv").iloc[0]
        p99[b] = row["ttft_p99_s"]
        meta = json.loads((out / "metadata.json").read_text())["workload"]
        assert meta["arrivals"] == "poisson" if b == "1" else meta["arrivals"].startswith("gamma")
        # the rate the requests arrived at, from requests.csv's own arrival times
        times = pd.read_csv(out / "requests.csv")["arrival_s"]
        drawn = (len(times) - 1) / (times.max() - times.min())
        assert row["arrival_rate_rps"] == pytest.approx(drawn, rel=1e-9)
        assert drawn == pytest.approx(3 * meta["arrival_rate_over_nominal"], rel=1e-9)
        said[b] = result.output
        assert ("drawn arrivals come at" in said[b]) == (abs(drawn / 3 - 1) > 0.1), (b, drawn)
    assert p99["0.25"] > 1.5 * p99["1"] > 1.5 * p99["4"], p99
    assert "come at 1.23x each nominal rate" in said["0.25"]  # this seed's 400 draws


def test_real_engine_points_beside_their_simulation(runner, tmp_path):
    out = tmp_path / "real"
    args = ["serve-sweep", "--preset", "tiny", "--requests", "30", "--real-requests", "8",
            "--median", "4", "--max-output", "8", "--prompt-len", "16", "--max-prompt", "64",
            "--rates", "50,max", "--real-rates", "max", "--repeats", "1", "--min-time", "0",
            "--warmup", "0", "--price-per-hour", "3.6", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    # --price-per-hour: every point's cost per million output tokens, $0.001 a second over
    # its duration's output tokens; energy where the device has a counter, else said so.
    expected = 3.6 / 3600 * serve["duration_s"] / serve["output_tokens"] * 1e6
    assert ((serve["usd_per_million_output_tokens"] / expected - 1).abs() < 1e-5).all()
    sim = serve[serve["source"] != "real"]
    assert (sim["energy_source"] == "not available: simulated (no device ran)").all()
    measured = serve[serve["source"] == "real"]
    assert (measured["joules_per_output_token"].notna()
            == ~measured["energy_source"].str.startswith("not available")).all()  # fmt: skip
    said = " ".join(result.stdout.split())
    assert "cost per million tokens at $3.6/h: static at max $" in said
    assert "energy per token" in said
    real = serve[serve["source"] == "real"]
    assert len(real) == 3 and set(real["rate"]) == {"max"} and (real["requests"] == 8).all()
    matched = serve[serve["source"] == "sim-matched"]
    assert len(matched) == 3 and (matched["requests"] == 8).all()
    versus = pd.read_csv(out / "sim_vs_real.csv")
    assert len(versus) == 3 * len(probe.COMPARED)
    ttft = versus[versus["metric"] == "ttft_p50_s"]
    assert np.allclose(ttft["measured"] / ttft["simulated"], ttft["measured_over_simulated"])
    steps = pd.read_csv(out / "real_steps.csv")
    assert {"start_s", "end_s", "rate"} <= set(steps.columns)
    # Each run's steps under its own name (the chunked policy's were labelled "continuous").
    assert list(dict.fromkeys(steps["policy"])) == ["static", "continuous", "chunked"]
    assert "real engine" in result.output and "fewer than 100" in result.output


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--rates", "0"], "--rates"),
        (["--rates", "-2"], "--rates"),
        (["--rates", "fast"], "--rates"),
        (["--rates", "nan"], "--rates"),
        (["--rates", "inf"], "--rates"),
        (["--rates", ""], "--rates"),
        (["--real-rates", "0.5,x"], "--real-rates"),
        (["--engine", "sim", "--real-rates", "1"], "--real-rates"),  # served nowhere: said
        (["--slo-ttft", "0"], "--slo-ttft"),
        (["--slo-tpot", "-0.1"], "--slo-tpot"),
        (["--slo-ttft", "nan"], "--slo-ttft"),
        (["--min-output", "10", "--max-output", "5"], "--min-output"),
        (["--median", "100"], "--median"),  # outside [1, --max-output 64]
        (["--prompt-dist", "fixed", "--prompt-len", "2000"], "--prompt-len"),
        (["--min-prompt", "0"], "--min-prompt"),
        (["--prompt-sigma", "-1"], "--prompt-sigma"),
        (["--output-dist", "pareto"], "--output-dist"),
        (["--policies", "static,fifo"], "--policies"),
        (["--real-requests", "0"], "--real-requests"),
        (["--real-requests", "600"], "--real-requests"),
        (["--real-time", "0"], "--real-time"),
        (["--max-num-batched-tokens", "4"], "--max-num-batched-tokens"),
        (["--chunk-size", "16", "--policies", "static,continuous"], "--chunk-size"),
        (["--burstiness", "0"], "--burstiness"),
        (["--burstiness", "-1"], "--burstiness"),
        (["--burstiness", "1000"], "--burstiness"),
        (["--burstiness", "nan"], "--burstiness"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(runner, tmp_path, extra, flag):
    out = tmp_path / "never"
    result = runner.invoke(app, ["serve-sweep", "--out", str(out), *extra])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and flag in lines[0], result.output
    assert not out.exists()


def test_compare_overlays_two_serving_curves(runner, tmp_path, step_costs):
    """Two folders (here two slot counts) side by side: their rows in one CSV, each labelled
    with its run, and one figure of both curves."""
    folders = []
    for slots in ("4", "8"):
        out = tmp_path / f"slots{slots}"
        args = ["serve-sweep", "--engine", "sim", "--step-costs", str(step_costs), "--requests",
                "60", "--rates", "2,max", "--slots", slots, "--out", str(out)]  # fmt: skip
        assert runner.invoke(app, args).exit_code == 0
        folders.append(out)
    out = tmp_path / "both"
    result = runner.invoke(app, ["compare", *map(str, folders), "--out", str(out)])
    assert result.exit_code == 0, result.output
    merged = pd.read_csv(out / "compare-serve.csv", dtype={"rate": str})
    for folder in folders:
        mine = merged[merged["run"] == folder.name].reset_index(drop=True)
        own = pd.read_csv(folder / "serve.csv", dtype={"rate": str})
        assert len(mine) == len(own) == 6
        assert mine["ttft_p99_s"].tolist() == pytest.approx(own["ttft_p99_s"].tolist())
    assert (out / "compare-serve.png").is_file()


def test_the_few_requests_advice_names_the_option_that_sized_those_points(monkeypatch):
    """Simulated points are sized by --requests, served ones (and their simulation) by
    --real-requests: the advice named both, one of them doing nothing."""
    from benchbatch.experiments.serve import run as serve_run

    class Rec:  # what the warning reads and keeps (a Recorder's rows, warning, later)
        def __init__(self, rows):
            self.serve, self.later = rows, []

        def rows(self, table):
            return self.serve

        def warning(self, text, later=False):
            assert later  # said under the finished tables
            self.later.append(text)

    said: list[str] = []
    row = {"p99_uncertain": True, "requests": 40}
    for rows in ([row | {"source": "sim"}], [row | {"source": "sim"}, row | {"source": "real"}],
                 [row | {"source": "sim", "p99_uncertain": False}]):  # fmt: skip
        rec = Rec(rows)
        serve_run._warn_uncertain(rec)
        said += rec.later
    assert len(said) == 2
    assert said[0].endswith("raise --requests to firm it up")
    assert said[1].endswith("raise --real-requests to firm it up")
