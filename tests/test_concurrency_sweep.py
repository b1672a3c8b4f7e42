"""serve-sweep --endpoint --max-concurrency 1,2,4: a concurrency sweep (GuideLLM's concurrent
profile, vLLM's bench serve --max-concurrency N at each N), each cap a point at one rate.

Against test_endpoint_predict.py's scripted server in virtual time (a brute-force engine of
known step costs, four slots, behind the client seam: exact, no wall clock): the requests
in flight, counted from requests.csv's own send and finish times, reach each cap and never
pass it; the batching pays (request throughput rises with the cap while the server has
slots for them all, and stops rising past them, where TTFT takes the server's queue); the
most requests in flight within the SLO is read off slo.csv; and --predict predicts every
cap's point within 5%. Then the real HTTP path against test_serve_endpoint.py's scripted
server, and bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import test_endpoint_predict as tep
import test_serve_endpoint as tse

from benchbatch.app.cli import app
from benchbatch.core.serving import concurrency_sweep

virtual, scripted = tep.virtual, tse.scripted  # their fixtures

ARGS = [*tep.ARGS, "--requests", "24", "--real-requests", "24"]
SLOTS = 4  # tep.ARGS' --slots, the virtual server's max_num_seqs


def sweep(runner, out, *extra):
    result = runner.invoke(app, ["serve-sweep", *ARGS, "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return result


def in_flight(requests: pd.DataFrame) -> int:
    """The most requests out at once, from their send and finish times alone."""
    ends = requests["sent_s"] + requests["e2e_s"]
    events = sorted([(t, 1) for t in requests["sent_s"]] + [(t, -1) for t in ends],
                    key=lambda e: (e[0], e[1]))  # a finish before a send at the same time
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_each_cap_is_a_point_with_that_many_requests_in_flight(runner, tmp_path, virtual):
    out = tmp_path / "run"
    result = sweep(runner, out, "--max-concurrency", "4,1,2,8,16")
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    assert list(serve["max_concurrency"]) == [1, 2, 4, 8, 16]  # ascending, one point a cap
    assert set(serve["rate"]) == {"max"} and (serve["sent"] == 24).all()
    requests = pd.read_csv(out / "requests.csv", dtype={"rate": str})
    for cap, mine in requests.groupby("max_concurrency"):
        assert len(mine) == 24 and mine["error"].isna().all()
        assert in_flight(mine) == cap  # reached, never passed
    assert requests.loc[requests["max_concurrency"] == 1, "queued_s"].max() > 0
    # Batching pays while the server has a slot for every request out, and not past it:
    # from 1 to 4 in flight each doubling serves at least a third more; past 4 the server
    # queues what the client sends, and its TTFT takes that wait.
    tput = serve.set_index("max_concurrency")["request_throughput_rps"]
    assert tput[2] > 1.33 * tput[1] and tput[4] > 1.33 * tput[2]
    assert tput[16] < 1.1 * tput[4]
    ttft = serve.set_index("max_concurrency")["ttft_p50_s"]
    assert ttft[16] > 2 * ttft[4]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["max_concurrency"] == [1, 2, 4, 8, 16]
    assert "in flight" in result.output
    assert "the most requests in flight each sustains within the SLO" in result.output
    for figure in ("serve.png", "pareto.png"):
        assert (out / figure).stat().st_size > 10_000


def test_the_most_requests_in_flight_within_the_slo(runner, tmp_path, virtual):
    first = tmp_path / "first"
    sweep(runner, first, "--max-concurrency", "1,2,4,8,16")
    p99 = pd.read_csv(first / "serve.csv").set_index("max_concurrency")["ttft_p99_s"]
    assert p99[8] > 1.5 * p99[4]  # past the server's slots, requests wait for one
    limit = (p99[4] * p99[8]) ** 0.5  # between them
    out = tmp_path / "run"
    result = sweep(runner, out, "--max-concurrency", "1,2,4,8,16", "--slo-ttft", f"{limit}s",
                   "--slo-tpot", "10s")  # fmt: skip
    serve = pd.read_csv(out / "serve.csv").set_index("max_concurrency")
    assert list(serve["within_slo"]) == [True, True, True, False, False]
    slo = pd.read_csv(out / "slo.csv")
    row = slo[slo["source"] == "endpoint"].iloc[0]
    assert row["sustained_concurrency"] == 4 and row["leaves_slo_at_concurrency"] == 8
    assert "within the SLO up to endpoint 4 in flight" in " ".join(result.output.split())


def test_a_prediction_stands_beside_every_cap(runner, tmp_path, virtual):
    out = tmp_path / "run"
    result = tep.run_predict(runner, out, "--max-concurrency", "1,2,4,8")
    pred = pd.read_csv(out / "prediction.csv")
    assert set(pred["max_concurrency"]) == {1, 2, 4, 8}
    assert pred["point"].str.contains("in flight").all()
    # Up to the server's four slots the client's cap keeps the server from queueing:
    # below saturation however the requests arrived (all at once here); past them not.
    held = pred.groupby("max_concurrency")["below_saturation"].all()
    assert held[1] and held[2] and held[4] and not held[8]
    for metric in ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s"):
        rows = pred[pred["metric"] == metric]
        assert len(rows) == 4
        assert ((rows["ratio"] - 1).abs() < 0.05).all(), rows[["max_concurrency", "ratio"]]
    # How sure each ratio is, resampled from the point's own requests (paired by id with its
    # simulation's): each p50's interval holds its ratio, and is narrow in virtual time.
    p50 = pred[pred["metric"].str.endswith("p50_s")]
    assert p50[["ratio_low", "ratio_high"]].notna().all().all()
    assert ((p50["ratio_low"] <= p50["ratio"]) & (p50["ratio"] <= p50["ratio_high"])).all(), p50
    versus = pd.read_csv(out / "sim_vs_real.csv")
    assert sorted(versus.groupby("max_concurrency").size().index) == [1, 2, 4, 8]
    table = result.output.split("over its simulation")[1].split("the most requests")[0]
    assert len([line for line in table.splitlines() if line.strip().startswith("endpoint")]) == 4
    serve = pd.read_csv(out / "serve.csv")
    twins = serve[serve["source"] == "sim-matched"].set_index("max_concurrency")
    assert (twins.loc[[1, 2, 4], "mean_batch"] <= [1 + 1e-9, 2 + 1e-9, 4 + 1e-9]).all()


def test_one_cap_keeps_the_rate_sweep(runner, tmp_path, virtual):
    out = tmp_path / "run"
    sweep(runner, out, "--max-concurrency", "2", "--rates", "5,10")
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    assert list(serve["rate"]) == ["5", "10"] and (serve["max_concurrency"] == 2).all()
    assert not concurrency_sweep(serve.to_dict("records"))
    assert "sustained_concurrency" not in pd.read_csv(out / "slo.csv")


def test_a_sweep_at_a_given_rate_over_http(runner, tmp_path, scripted):
    url, server = scripted
    server.fail_every = 0
    out = tmp_path / "run"
    args = ["serve-sweep", "--endpoint", url, *tse.ARGS, "--rates", "100",
            "--max-concurrency", "1,3", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    requests = pd.read_csv(out / "requests.csv", dtype={"rate": str})
    assert set(requests["rate"]) == {"100"}
    assert sorted(requests.groupby("max_concurrency").size().items()) == [(1, 6), (3, 6)]
    assert all(in_flight(g) <= cap for cap, g in requests.groupby("max_concurrency"))
    assert len(server.seen) == 1 + 12  # the warm-up, then six a point


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--max-concurrency", "1,4", "--rates", "1,2"], "--max-concurrency"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--max-concurrency", "1,x"], "--max-concurrency"),
        (["--max-concurrency", "1,,2"], "--max-concurrency"),
        (["--max-concurrency", "-2"], "--max-concurrency"),
        (["--max-concurrency", "2.5"], "--max-concurrency"),
    ],
)
def test_bad_caps_are_one_line_and_exit_2(runner, tmp_path, extra, flag):
    args = ["serve-sweep", "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "o"),
            *extra]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output


def test_compare_draws_concurrency_sweeps_by_cap_and_refuses_a_mix(runner, tmp_path, virtual):
    a, b, rates = tmp_path / "a", tmp_path / "b", tmp_path / "rates"
    sweep(runner, a, "--max-concurrency", "1,2,4")
    virtual.max_num_seqs = 2  # a server of fewer slots: its batching stops paying at 2
    sweep(runner, b, "--max-concurrency", "1,2,4")
    sweep(runner, rates, "--rates", "5,10")
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    merged = pd.read_csv(out / "compare-serve.csv")
    assert sorted(zip(merged["run"], merged["max_concurrency"], strict=True)) == [
        ("a", 1), ("a", 2), ("a", 4), ("b", 1), ("b", 2), ("b", 4)]  # fmt: skip
    tput = merged.set_index(["run", "max_concurrency"])["request_throughput_rps"]
    assert tput["b", 4] < 1.1 * tput["b", 2] < tput["a", 4]
    assert (out / "compare-serve.png").stat().st_size > 10_000
    mixed = runner.invoke(app, ["compare", str(a), str(rates), "--out", str(tmp_path / "m")])
    assert mixed.exit_code == 2, mixed.output
    assert "RUN_DIR" in mixed.output and "concurrency" in mixed.output
    assert "Traceback" not in mixed.output and not (tmp_path / "m").exists()
