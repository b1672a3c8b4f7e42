"""serve-sweep ends with an answer or with what to change: on a device too slow for the
default real points it serves fewer requests a point rather than none, and a policy that
sustains no rate is told which limit broke and which option moves it."""

from __future__ import annotations

import json

import pandas as pd

from benchbatch.app.cli import app
from benchbatch.app.views.serve import what_moves_it


def test_a_slow_device_serves_fewer_requests_rather_than_none(runner, tmp_path):
    # A known cost model (20 ms a step and more): 40 requests a point fit 1.5 s at no rate,
    # 20 at one, 10 at two.
    costs = tmp_path / "costs.csv"
    rows = [
        {"prefill_tokens": p, "decode_tokens": d, "context_tokens": 0, "step_ms": 20 + d + p / 10}
        for p in (0, 8, 64)
        for d in (0, 1, 4, 8)
    ]
    pd.DataFrame([r for r in rows if r["prefill_tokens"] or r["decode_tokens"]]).to_csv(
        costs, index=False
    )
    out = tmp_path / "run"
    args = ["serve-sweep", "--preset", "tiny", "--device", "cpu", "--step-costs", str(costs),
            "--requests", "40", "--prompt-dist", "fixed", "--prompt-len", "8", "--output-dist",
            "fixed", "--output-median", "4", "--max-output", "4", "--real-time", "1.5",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    real = json.loads((out / "metadata.json").read_text())["real"]
    assert real["requests"] == 10 and len(real["rates_rps"]) == 2
    assert real["estimated_s"] <= 1.5
    assert "trying 20 requests a point" in result.output
    assert "trying 10 requests a point" in result.output
    served = pd.read_csv(out / "serve.csv")
    assert (served[served["source"] == "real"]["requests"] == 10).all()


def test_no_rate_says_which_limit_broke_and_what_moves_it():
    slo = [
        {"policy": "static", "source": "sim", "sustained_rate": None, "leaves_slo_at": "1"},
        {"policy": "continuous", "source": "sim", "sustained_rate": "2", "leaves_slo_at": None},
    ]
    rows = [
        {"policy": "static", "source": "sim", "rate": "1", "rate_rps": 1.0,
         "ttft_p99_s": 3.0, "tpot_p99_s": 0.1},
        {"policy": "static", "source": "sim", "rate": "2", "rate_rps": 2.0,
         "ttft_p99_s": 9.0, "tpot_p99_s": 0.3},
        {"policy": "continuous", "source": "sim", "rate": "2", "rate_rps": 2.0,
         "ttft_p99_s": 0.1, "tpot_p99_s": 0.1},
    ]  # fmt: skip
    lines = what_moves_it(slo, rows, {"slo_ttft": 2.0, "slo_tpot": 0.2})
    assert len(lines) == 1
    assert "static (sim) misses the SLO even at 1 req/s" in lines[0]
    assert "p99 TTFT 3 s over --slo-ttft" in lines[0] and "--slo-tpot" not in lines[0]
    assert "lower --rates" in lines[0]
