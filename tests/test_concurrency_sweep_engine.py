"""serve-sweep --max-concurrency on benchbatch's own engine: the client's cap simulated, and
held by the real engine's client, as --endpoint's client holds it against a server.

The engine behind a cap in virtual time (tests/test_serve.py's clock: no wall clock) is
checked against what a FIFO client of N slots must do, request by request: the k-th request
sent at the later of its arrival and the (k-N)-th finish, never more than N out, its
latencies from its sending, and every token as the request alone makes it. The simulated
sweep is checked against the step costs it was given (CPU_LIKE): at one in flight each
request is served alone, so its TTFT is the price of its own prefill and the point lasts
the sum of the requests' lone service times. Then the real engine on a tiny model (only
what holds at any load: the caps, the counts, the pairs), compare, and bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_serve import CPU_LIKE, VirtualTime, write_step_costs

from benchbatch.app.cli import app
from benchbatch.core.workload import Request
from benchbatch.runtime.engine import Engine, run_alone

pytestmark = pytest.mark.usefixtures("one_thread")

CAPS = [1, 2, 4, 8]


@pytest.fixture(scope="module")
def step_costs(tmp_path_factory):
    return write_step_costs(tmp_path_factory.mktemp("costs"))


def in_flight(requests: pd.DataFrame) -> int:
    """The most requests out at once, from their send and finish times alone (a finish
    before a send at the same instant, to a nanosecond: the client sends as one ends)."""
    ends = requests["sent_s"] + requests["e2e_s"]
    events = sorted([(round(t, 9), 1) for t in requests["sent_s"]]
                    + [(round(t, 9), -1) for t in ends])  # fmt: skip
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


# --- the engine behind a client's cap, in virtual time ------------------------------------


@pytest.mark.parametrize("policy, cap", [("continuous", 2), ("static", 3), ("continuous", 1)])
def test_the_engine_behind_a_cap_sends_as_a_fifo_client_must(tiny_model, monkeypatch, policy,
                                                              cap):  # fmt: skip
    from benchbatch.runtime import engine as engine_module
    from benchbatch.runtime import run_state

    clock = VirtualTime()
    monkeypatch.setattr(engine_module, "time", clock)
    monkeypatch.setattr(run_state, "time", clock)
    requests = [Request(i, 4 + 3 * i % 11, 2 + i % 5) for i in range(9)]
    arrivals = [0.0] * 5 + [0.002, 0.002, 0.5, 0.5]  # a queue, then an idle wait
    engine = Engine(tiny_model, policy, slots=4, seed=5)
    records = list(engine.steps(requests, arrivals, client_limit=cap))
    result = engine.result
    assert result.complete
    for r in requests:  # the cap changes when a request runs, never what it makes
        assert result.tokens[r.id] == run_alone(tiny_model, r, seed=5)
    assert max(s.active for s in records) <= cap
    m = {x.request_id: x for x in result.metrics.requests}
    finishes = sorted(x.finish for x in m.values())
    ends = [s.end_s for s in records]
    for k, r in enumerate(requests):  # arrival order is id order here
        expected = arrivals[k] if k < cap else max(arrivals[k], finishes[k - cap])
        assert m[r.id].arrival == pytest.approx(expected, abs=1e-12), (k, m[r.id].arrival)
        assert m[r.id].finish in ends and m[r.id].first_token > m[r.id].arrival
    sent = {i: x.arrival for i, x in m.items()}
    for i in m:  # at no sending are more than `cap` requests out
        assert sum(1 for j in m if sent[j] <= sent[i] < m[j].finish or j == i) <= cap


# --- the simulated sweep -----------------------------------------------------------------


def sim_sweep(runner, out, step_costs, *extra):
    args = ["serve-sweep", "--engine", "sim", "--step-costs", str(step_costs), "--requests",
            "60", "--slots", "4", "--out", str(out), *extra]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def test_a_simulated_concurrency_sweep_holds_each_cap(runner, tmp_path, step_costs):
    out = tmp_path / "run"
    result = sim_sweep(runner, out, step_costs, "--max-concurrency", "8,1,4,2")
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    assert set(serve["rate"]) == {"max"} and set(serve["source"]) == {"sim"}
    for policy in ("static", "continuous", "chunked"):
        mine = serve[serve["policy"] == policy]
        assert list(mine["max_concurrency"]) == CAPS  # ascending, one point a cap
    requests = pd.read_csv(out / "requests.csv")
    assert {"sent_s", "queued_s", "arrival_s"} <= set(requests.columns)
    assert (requests["arrival_s"] == 0).all()  # every request queued at max ...
    for (policy, cap), mine in requests.groupby(["policy", "max_concurrency"]):
        assert len(mine) == 60
        assert in_flight(mine) == cap, (policy, cap)  # ... and the client held that many
        assert (mine["queued_s"] - (mine["sent_s"] - mine["arrival_s"])).abs().max() < 1e-12
    # Continuous batching pays while the 4 slots hold every request in flight, and stops
    # paying past them (the queue is the server's then: TTFT grows).
    cont = serve[serve["policy"] == "continuous"].set_index("max_concurrency")
    tput, ttft = cont["request_throughput_rps"], cont["ttft_p50_s"]
    assert tput[2] > 1.3 * tput[1] and tput[4] > 1.3 * tput[2]
    assert tput[8] < 1.05 * tput[4] and ttft[8] > 1.5 * ttft[4]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["max_concurrency"] == CAPS and "knees" not in meta
    said = " ".join(result.stdout.split())
    assert "in flight" in said and "requests a point, at max req/s" in said
    assert "sustains (in flight)" in said


def test_one_in_flight_serves_each_request_alone_at_its_own_price(runner, tmp_path,
                                                                  step_costs):  # fmt: skip
    out = tmp_path / "alone"
    sim_sweep(runner, out, step_costs, "--max-concurrency", "1,2", "--policies", "continuous")
    requests = pd.read_csv(out / "requests.csv")
    alone = requests[requests["max_concurrency"] == 1].sort_values("sent_s")
    # A lone request's first step prefills its prompt (and makes its first token); each
    # later step decodes one token over the context cached before it (the prompt, and
    # the generated tokens before the one it reads).
    for _, r in alone.iterrows():
        prefill = CPU_LIKE.base_s + CPU_LIKE.per_prefill_token_s * r["prompt_tokens"]
        assert r["ttft_s"] == pytest.approx(prefill, rel=1e-6)
        decodes = sum(CPU_LIKE.base_s + CPU_LIKE.per_decode_token_s
                      + CPU_LIKE.per_context_token_s * (r["prompt_tokens"] + k - 1)
                      for k in range(1, int(r["output_tokens"])))  # fmt: skip
        assert r["e2e_s"] == pytest.approx(prefill + decodes, rel=1e-6)
    # sent back to back: each as the one before finishes
    finished = (alone["sent_s"] + alone["e2e_s"]).to_numpy()
    assert abs(alone["sent_s"].to_numpy()[1:] - finished[:-1]).max() < 1e-9
    serve = pd.read_csv(out / "serve.csv").set_index("max_concurrency")
    assert serve.loc[1, "duration_s"] == pytest.approx(alone["e2e_s"].sum(), rel=1e-9)


def test_the_most_in_flight_within_the_slo_and_compare_by_cap(runner, tmp_path, step_costs):
    first = tmp_path / "first"
    sim_sweep(runner, first, step_costs, "--max-concurrency", "1,2,4,8,16", "--policies",
              "continuous")  # fmt: skip
    p99 = pd.read_csv(first / "serve.csv").set_index("max_concurrency")["ttft_p99_s"]
    assert p99[8] > p99[4]
    limit = (p99[4] + p99[8]) / 2  # between the caps' p99s: 4 within, 8 not
    out = tmp_path / "slo"
    sim_sweep(runner, out, step_costs, "--max-concurrency", "1,2,4,8,16", "--policies",
              "continuous", "--slo-ttft", f"{limit}s")  # fmt: skip
    row = pd.read_csv(out / "slo.csv").iloc[0]
    assert row["sustained_concurrency"] == 4 and row["leaves_slo_at_concurrency"] == 8
    cmp = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", str(first), str(out), "--out", str(cmp)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert "at each cap" in said and "max, 16 in flight" in said
    assert "most requests in flight within the SLO" in said
    merged = pd.read_csv(cmp / "compare-serve.csv")
    assert sorted(set(merged["matched_rate"])) == sorted(f"max, {c} in flight"
                                                         for c in (1, 2, 4, 8, 16))  # fmt: skip


def test_one_cap_holds_every_rate_of_a_sweep(runner, tmp_path, step_costs):
    out = tmp_path / "one"
    sim_sweep(runner, out, step_costs, "--max-concurrency", "2", "--rates", "2,50",
              "--policies", "continuous")  # fmt: skip
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    assert list(serve["rate"]) == ["2", "50"] and (serve["max_concurrency"] == 2).all()
    requests = pd.read_csv(out / "requests.csv", dtype={"rate": str})
    for _, mine in requests.groupby("rate"):
        assert in_flight(mine) <= 2
    fast = requests[requests["rate"] == "50"]
    assert fast["queued_s"].max() > 0  # 50 req/s outruns two in flight: the client queued


# --- the real engine ----------------------------------------------------------------------


def test_the_real_caps_are_the_knee_first_then_the_cheapest():
    """Within --real-time: where a policy leaves the SLO (its last cap within, its first
    outside) before cheaper caps, then the cheapest others; a small cap is the dearest."""
    from benchbatch.experiments.serve.rate_choice import choose_real_caps

    inf = float("inf")
    rows = [{"policy": "continuous", "source": "sim-matched", "max_concurrency": c,
             "within_slo": c <= 2} for c in (1, 2, 4, 8)]  # fmt: skip
    cost = {(inf, 1): 100.0, (inf, 2): 60.0, (inf, 4): 40.0, (inf, 8): 30.0}
    assert choose_real_caps(rows, cost, 110.0) == ([(inf, 2), (inf, 4)], 100.0)
    assert choose_real_caps(rows, cost, 135.0) == ([(inf, 2), (inf, 4), (inf, 8)], 130.0)
    within = [r | {"within_slo": True} for r in rows]  # no knee: the cheapest first
    assert choose_real_caps(within, cost, 75.0) == ([(inf, 4), (inf, 8)], 70.0)


def test_the_real_engine_serves_each_cap_beside_its_simulation(runner, tmp_path):
    out = tmp_path / "real"
    args = ["serve-sweep", "--preset", "tiny", "--requests", "12", "--real-requests", "8",
            "--median", "4", "--max-output", "8", "--prompt-len", "16", "--max-prompt", "64",
            "--max-concurrency", "1,3", "--policies", "static,continuous", "--repeats", "1",
            "--min-time", "0", "--warmup", "0", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv")
    for source in ("sim", "real", "sim-matched"):
        mine = serve[serve["source"] == source]
        assert sorted(zip(mine["policy"], mine["max_concurrency"], strict=True)) == [
            ("continuous", 1), ("continuous", 3), ("static", 1), ("static", 3)], source
    requests = pd.read_csv(out / "requests.csv")
    for (source, policy, cap), mine in requests.groupby(["source", "policy", "max_concurrency"]):
        if source != "sim":
            assert len(mine) == 8
        assert in_flight(mine) == cap, (source, policy, cap)  # held, and reached at max
    steps = pd.read_csv(out / "real_steps.csv")
    most = steps.groupby(["policy", "max_concurrency"])["active"].max()
    assert all(most[p, c] <= c for p, c in most.index)
    pred = pd.read_csv(out / "prediction.csv")
    assert set(pred["max_concurrency"]) == {1, 3}
    assert pred["below_saturation"].all()  # at most the 8 slots in flight: never queued
    assert pred["ratio_low"].notna().all()  # each pair has its interval (labels matched)
    versus = pd.read_csv(out / "sim_vs_real.csv")
    assert set(versus["max_concurrency"]) == {1, 3}
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["real"]["max_concurrency"] == [1, 3]
    said = " ".join(result.stdout.split())
    assert "real engine over its simulation" in said and "in flight" in said


def test_one_cap_holds_the_real_engine_at_the_rates_it_chose(runner, tmp_path):
    """One cap and the default choice of real rates (within --real-time): every real point,
    and its simulation beside it, behind the cap."""
    out = tmp_path / "one"
    args = ["serve-sweep", "--preset", "tiny", "--requests", "12", "--real-requests", "6",
            "--median", "4", "--max-output", "8", "--prompt-len", "16", "--max-prompt", "64",
            "--max-concurrency", "2", "--rates", "20,max", "--policies", "continuous",
            "--repeats", "1", "--min-time", "0", "--warmup", "0", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    real = serve[serve["source"] == "real"]
    assert len(real) >= 1 and (serve["max_concurrency"] == 2).all()
    requests = pd.read_csv(out / "requests.csv", dtype={"rate": str})
    for (source, _), mine in requests.groupby(["source", "rate"]):
        assert in_flight(mine) <= 2, source
    at_max = requests[(requests["source"] == "real") & (requests["rate"] == "max")]
    if len(at_max):  # every request queued at once: the cap reached, and waited on
        assert in_flight(at_max) == 2 and at_max["queued_s"].max() > 0


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--max-concurrency", "1,2", "--real-rates", "1"], "--real-rates"),
        (["--max-concurrency", "1,2", "--rates", "1,2"], "--max-concurrency"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--max-concurrency", "2,x"], "--max-concurrency"),
    ],
)
def test_bad_caps_are_one_line_and_exit_2(runner, tmp_path, step_costs, extra, flag):
    out = tmp_path / "never"
    args = ["serve-sweep", "--engine", "sim", "--step-costs", str(step_costs), "--out",
            str(out), *extra]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and flag in lines[0], result.output
    assert not out.exists()
