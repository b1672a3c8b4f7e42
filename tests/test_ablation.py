"""The ablation: the fitted step-cost model, the stall without chunks and the paper's
ordering in simulation, SLO goodput and search, and the command end to end (a tiny model
on the real engine, and one-line answers to bad budgets)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.core import stepcost
from benchbatch.core.options import WorkloadOptions
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.workload import Request
from benchbatch.errors import UserError
from benchbatch.experiments.ablation import probe
from benchbatch.experiments.ablation.options import ABLATION_WORKLOAD
from benchbatch.experiments.ablation.ordering import ordering
from benchbatch.experiments.piggyback.probe import MixedStep
from benchbatch.runtime import mixed

# Close to what cpu-small (fp32, 2 cores) measured: a decode step of 8 about 33 ms, a
# 1,024-token prefill about 300 ms.
CPU_LIKE = StepCostModel(0.016, 0.002, 0.00027, 5e-7)
DEFAULTS = dict(ABLATION_WORKLOAD)  # the command's defaults (its documented CPU recommendation)


def workload(requests: int, seed: int):
    return WorkloadOptions(**(DEFAULTS | {"requests": requests})).draw(seed)

BUDGETS = probe.Budgets(8, 256, 128)


pytestmark = pytest.mark.usefixtures("one_thread")


def cost_rows(truth: StepCostModel, points, noise=None) -> list[dict]:
    rows = []
    for p in points:
        d, n, c = p.features
        seconds = truth(_Plan(d, n, c))
        if noise is not None:
            seconds *= noise(p)
        rows.append(
            {"decode_tokens": d, "prefill_tokens": n, "context_tokens": c, "step_ms": seconds * 1e3}
        )
    return rows


class _Plan:
    """What StepCostModel reads of a StepPlan."""

    def __init__(self, d: int, p: int, c: int):
        self.num_decode_tokens, self.num_prefill_tokens, self.num_context_tokens = d, p, c
        self.padded_slots = ()


# --- the step-cost model ---------------------------------------------------------------------


def points() -> list[MixedStep]:
    reqs = workload(40, seed=0)
    return mixed.fit_points(BUDGETS, reqs, 4096)


def test_fit_points_cover_the_schemes_steps():
    kinds = {p.kind for p in points()}
    assert kinds == {"decode", "prefill", "mixed"}
    assert MixedStep(7, 104, 1024) in points() or any(
        p.decode_batch and p.prefill_tokens == 1024 for p in points()
    )
    assert any(p.prefill_start for p in points())  # a late chunk: the KV re-read
    assert len(set(points())) == len(points())


def test_fit_recovers_known_coefficients():
    model, fitted = stepcost.fit(cost_rows(CPU_LIKE, points()))
    for name in ("base_s", "per_decode_token_s", "per_prefill_token_s", "per_context_token_s"):
        assert getattr(model, name) == pytest.approx(getattr(CPU_LIKE, name), rel=1e-6)
    assert all(abs(r["error"]) < 1e-9 and r["used"] for r in fitted)
    s = stepcost.cost_summary(model, fitted)
    assert s["per_prefill_token_ms"] == pytest.approx(0.27) and s["left_out_as_noise"] == 0


def test_fit_leaves_out_noise_and_never_goes_negative():
    pts = points()
    rng = random.Random(0)
    slowed = {pts[2], pts[6]}  # another process took the cores: 3x slower

    def noise(p):
        return 3.0 if p in slowed else 1 + rng.uniform(-0.02, 0.02)

    model, fitted = stepcost.fit(cost_rows(CPU_LIKE, pts, noise))
    assert sum(not r["used"] for r in fitted) == 2
    assert model.per_prefill_token_s == pytest.approx(CPU_LIKE.per_prefill_token_s, rel=0.1)
    assert model.base_s == pytest.approx(CPU_LIKE.base_s, rel=0.2)
    # Decode steps that do not grow with the batch: no negative cost per decode token.
    flat = [
        dict(decode_tokens=b, prefill_tokens=0, context_tokens=0, step_ms=10.0 - 0.1 * b)
        for b in (1, 2, 4, 8)
    ]
    model, _ = stepcost.fit(flat)
    assert model.per_decode_token_s == 0 and model.base_s == pytest.approx(0.0095, rel=0.1)


def test_a_negative_base_is_fitted_through_the_origin():
    """Small steps measured slow and large ones fast (noise) would give a negative base, and
    a simulation would price a small step below zero: the fit goes through the origin."""
    rows = [
        dict(decode_tokens=b, prefill_tokens=0, context_tokens=0, step_ms=ms)
        for b, ms in ((1, 0.5), (2, 2.5), (4, 6.5), (8, 14.5))  # 2 ms a token - 1.5 ms
    ]
    model, fitted = stepcost.fit(rows)
    assert model.base_s == 0.0 and model.per_decode_token_s > 0
    assert all(r["fitted_ms"] > 0 for r in fitted)


def test_fit_without_enough_steps_names_the_option():
    with pytest.raises(UserError) as e:
        stepcost.fit([dict(decode_tokens=4, prefill_tokens=0, context_tokens=0, step_ms=5.0)])
    assert e.value.option == "--step-costs"


def test_step_costs_read_from_phases_piggyback_and_step_cost_csvs(tmp_path):
    phases = tmp_path / "phases.csv"
    pd.DataFrame(
        [
            dict(phase="prefill", batch=1, tokens=512, context=0, step_ms=150.0, status="ok"),
            dict(phase="decode", batch=32, tokens=1, context=512, step_ms=40.0, status="ok"),
            dict(phase="decode", batch=64, tokens=1, context=512, step_ms=0.0, status="oom"),
        ]
    ).to_csv(phases, index=False)
    pig = tmp_path / "piggyback.csv"
    pd.DataFrame([dict(decode_batch=8, context=100, prefill_tokens=64, step_ms=50.0)]).to_csv(
        pig, index=False
    )
    rows = stepcost.cost_rows_from_csv([phases, pig])
    features = [(r["decode_tokens"], r["prefill_tokens"], r["context_tokens"]) for r in rows]
    assert features == [(0, 512, 0), (32, 0, 32 * 512), (8, 64, 800)]
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="step times"):
        stepcost.cost_rows_from_csv([bad])
    with pytest.raises(UserError, match="cannot read"):
        stepcost.cost_rows_from_csv([tmp_path / "missing.csv"])


# --- the stall and the paper's ordering, in simulation ------------------------------------------


def stall_trace() -> list[Request]:
    """Four chats decoding when a 2,048-token prompt arrives at step 10."""
    return [*(Request(i, 16, 60) for i in range(4)), Request(4, 2048, 5, arrival_step=10)]


def test_stall_appears_without_chunks_and_shrinks_with_them():
    model, _ = stepcost.fit(cost_rows(CPU_LIKE, points()))  # the fitted model, as the command
    runs = probe.simulate_all(stall_trace(), probe.SCHEMES, BUDGETS, model)
    stall = {s: r.metrics.summary()["tbt_max"] for s, r in runs.items()}
    # Without chunks the whole prompt rides in one step with the 4 decodes.
    assert stall["mixed-only"] == pytest.approx(CPU_LIKE(_Plan(4, 2048, 4 * (16 + 9))), rel=0.01)
    assert stall["both"] < stall["chunks-only"] < 0.25 * stall["mixed-only"]
    # The price: the long prompt's first token comes later when it is chunked.
    ttft = {s: {m.request_id: m.ttft for m in r.metrics.requests} for s, r in runs.items()}
    assert ttft["mixed-only"][4] < ttft["both"][4] < ttft["chunks-only"][4]
    assert max(p for _, p in runs["both"].step_tokens) <= BUDGETS.max_num_batched_tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paper_ordering_in_simulation_on_the_default_workload(seed):
    reqs = workload(40, seed=seed)
    runs = probe.simulate_all(reqs, probe.SCHEMES, BUDGETS, CPU_LIKE)
    rows = [probe.summary_row(r, BUDGETS) for r in runs.values()]
    verdict = ordering(rows, "sim")
    assert verdict["tbt_p99_order"] and verdict["ttft_p50_order"] and verdict["as_paper"]
    assert verdict["stall_shrink"] > 2
    assert ordering(rows, "real") is None


def test_an_order_within_a_percent_is_said_to_be_unsettled():
    """Ablation's simulation read "NOT the paper's ordering" on a P99 TBT of 0.27771 against
    0.27729 s (0.15%): the verdict stays the strict rule's, and the line names the tie."""
    from benchbatch.app.views.ablation import _ordering_line

    def row(scheme, tbt, ttft):
        return {"scheme": scheme, "source": "sim", "tbt_p99_s": tbt, "ttft_p50_s": ttft,
                "tbt_max_s": tbt * 2}  # fmt: skip

    rows = [row("mixed-only", 0.5, 0.1), row("chunks-only", 0.27729, 0.3),
            row("both", 0.27771, 0.2)]
    v = ordering(rows, "sim")
    assert not v["tbt_p99_order"] and v["ttft_p50_order"] and v["ties"] == ["P99 TBT"]
    line = _ordering_line("sim", v)
    assert "NOT the paper's ordering" in line
    assert "P99 TBT: two schemes within 1% of each other, an order the noise does not" in line
    apart = ordering([row("mixed-only", 0.5, 0.1), row("chunks-only", 0.3, 0.3),
                            row("both", 0.2, 0.2)], "sim")  # fmt: skip
    assert apart["as_paper"] and apart["ties"] == []
    assert "within 1%" not in _ordering_line("sim", apart)


def test_ties_and_missing_gaps_and_an_unchanged_stall_are_said_as_they_are():
    """Only neighbours were compared for a tie (both and mixed-only equal, chunks-only
    between, said nothing); a run with no gap between tokens had "TBT max 0" and an
    ordering judged on missing values; a chunk as large as every prompt "cut the stall
    1.0x"."""

    from benchbatch.app.views.ablation import _ordering_line, _stall

    def row(scheme, tbt, ttft, top=None):
        return {"scheme": scheme, "source": "sim", "tbt_p99_s": tbt, "ttft_p50_s": ttft,
                "tbt_max_s": tbt * 2 if top is None else top}  # fmt: skip

    ends = ordering([row("mixed-only", 0.0302, 0.1), row("chunks-only", 0.04, 0.3),
                           row("both", 0.0302, 0.2)], "sim")  # fmt: skip
    assert "P99 TBT" in ends["ties"]
    none = ordering([row(s, math.nan, t, math.nan) for s, t in
                           (("mixed-only", 0.1), ("chunks-only", 0.3), ("both", 0.2))], "sim")
    assert none["tbt_p99_order"] is None and none["as_paper"] is None
    line = _ordering_line("sim", none)
    assert "no ordering to judge" in line and "n/a" in line and "NOT" not in line
    assert _stall(1.0) == "chunking did not change the longest stall"
    assert _stall(2.9) == "chunking cut the stall 2.9x" and "longer" in _stall(0.5)


def test_a_run_with_no_gap_between_tokens_has_no_largest_gap():
    from benchbatch.core.metrics import RunMetrics

    run = RunMetrics([], Counter())
    assert math.isnan(run.summary()["tbt_max"]) and math.isnan(run.summary()["tbt_p99"])


# --- SLO -----------------------------------------------------------------------------------------


def test_goodput_and_slo_search():
    reqs = workload(30, seed=1)
    slo = probe.SLO(ttft_s=2.0, tbt_s=0.12)
    run = probe.simulate_scheme(reqs, "both", BUDGETS, CPU_LIKE)
    row = probe.summary_row(run, BUDGETS, slo)
    met = [m for m in run.metrics.requests if m.ttft <= 2.0 and m.tbt_p99 <= 0.12]
    assert row["slo_met"] == len(met) and row["goodput_rps"] == len(met) / run.total_s
    rows = probe.slo_search(reqs, BUDGETS, CPU_LIKE, slo)
    assert {(r["max_num_seqs"], r["max_num_batched_tokens"]) for r in rows} >= {(8, 256)}
    assert all(r["max_num_batched_tokens"] >= r["max_num_seqs"] for r in rows)
    assert all(r["chunk_size"] == r["max_num_batched_tokens"] for r in rows)
    for r in rows:
        assert r["meets_slo"] == (r["ttft_p99_s"] <= 2.0 and r["tbt_p99_s"] <= 0.12)
    best = probe.slo_best(rows)
    assert best["met"]
    ok = [r for r in rows if r["meets_slo"]]
    assert best["largest_seqs"]["max_num_seqs"] == max(r["max_num_seqs"] for r in ok)
    assert best["best_goodput"]["goodput_rps"] == max(r["goodput_rps"] for r in ok)
    assert probe.slo_best([{**r, "meets_slo": False} for r in rows]) == {"met": False}


# --- the command ---------------------------------------------------------------------------------

TINY = ["--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time", "0"]
SMALL = ["--requests", "10", "--prompt-len", "8", "--long-prompt-len", "60", "--median", "6"]
SMALL += ["--max-output", "20", "--max-num-seqs", "3", "--max-num-batched-tokens", "24"]
SMALL += ["--chunk-size", "12", "--arrival-rate", "0.5"]


def ablation(runner, out, *extra):
    return runner.invoke(app, ["ablation", "--out", str(out), *extra])


def test_real_engine_run_writes_every_file(runner, tmp_path, linear_step_costs):
    out = tmp_path / "run"
    slo = ["--slo-ttft", "500ms", "--slo-tbt", "0.2s"]
    result = ablation(runner, out, *TINY, *SMALL, *slo, "--engine", "real")
    assert result.exit_code == 0, result.output
    assert "engine calibration (" in result.stdout and "real engine:" in result.stdout
    # the fit said once, with the result (it was said on stderr as well)
    assert (result.stdout + result.stderr).count("engine calibration (") == 1
    saved = json.loads((out / "step_cost.json").read_text())  # what a reuse checks against
    assert saved["largest_batch"] >= 3 and saved["conditions"]["kv_layout"] == "contiguous"
    assert "reused_from" not in saved and saved["source"] == "calibration"
    df = pd.read_csv(out / "ablation.csv")
    assert sorted(zip(df["source"], df["scheme"], strict=True)) == sorted(
        (src, s) for src in ("sim", "real") for s in probe.SCHEMES
    )
    for col in ("ttft_p50_s", "tbt_p99_s", "tbt_max_s", "e2e_p50_s", "total_s", "goodput_rps"):
        assert (df[col] >= 0).all(), col
    real = df[df["source"] == "real"]
    assert (real["real_over_sim"] > 0).all() and (real["steps"] > 0).all()
    reqs = pd.read_csv(out / "requests.csv")
    assert len(reqs) == 6 * 10 and {"ttft_s", "tbt_p99_s", "e2e_s", "slo_met"} <= set(reqs)
    steps = pd.read_csv(out / "steps.csv")
    steps = steps[steps["scheme"] != "mixed-only"]  # no token budget without chunks
    assert (steps["decode_tokens"] + steps["prefill_tokens"] <= 24).all()
    # The step costs: the engine's calibration (its own steps; tests/test_calibration.py
    # tests the fit), every kind of step fitted, the fitted value beside each measured one.
    cost = json.loads((out / "step_cost.json").read_text())
    assert cost["source"] == "calibration" and set(cost["kinds"]) == {"decode", "prefill", "mixed"}
    assert all(v >= 0 for v in cost["coefficients_s"].values())
    fitted = pd.read_csv(out / "step_cost.csv")
    assert {"fitted_ms", "error", "kind"} <= set(fitted) and len(fitted) == cost["samples"]
    assert len(pd.read_csv(out / "prediction.csv")) == 7 * 3  # 7 metrics of 3 schemes
    # Each scheme's run priced as serve-sweep's points: its speed is its steps' time (with
    # the gap before each) over the cost model's price of them (step_cost.json's fit), and
    # its simulation again at that speed is the same run with every time scaled (arrivals
    # come at step numbers); the total time's is left out (about the speed itself).
    from benchbatch.core import saved_calibration
    from benchbatch.core.calibration import step_kind
    from benchbatch.core.pricing import loop_ms, price_ms

    model = saved_calibration.given([out / "step_cost.json"])["model"]
    pred = pd.read_csv(out / "prediction.csv")
    meta = json.loads((out / "metadata.json").read_text())
    every = pd.read_csv(out / "steps.csv").to_dict("records")
    for scheme in probe.SCHEMES:
        mine = [r for r in every if r["scheme"] == scheme and step_kind(r) != "idle"]
        speed = sum(loop_ms(r) for r in mine) / sum(price_ms(model, r) for r in mine)
        assert meta["real"]["steps_over_price"][scheme] == pytest.approx(speed, rel=1e-9)
        rows = pred[pred["point"] == scheme]
        assert rows[rows["metric"] == "total_s"]["ratio_at_speed"].isna().all()
        for _, r in rows[rows["metric"] != "total_s"].iterrows():
            assert r["steps_over_price"] == pytest.approx(speed, rel=1e-5)
            assert r["simulated_at_speed"] == pytest.approx(r["simulated"] * speed, rel=1e-5)
            assert r["ratio_at_speed"] == pytest.approx(r["measured"] / r["simulated_at_speed"],
                                                        rel=1e-5)  # fmt: skip
    assert {e["scheme"] for e in meta["real"]["step_prices"]} == set(probe.SCHEMES)
    assert "the runs ran their steps at x" in meta["prediction"]["at_speed"]
    assert "the simulation predicts" in result.stdout
    assert len(pd.read_csv(out / "slo.csv")) > 1
    for png in ("ablation_tbt.png", "ablation_latency.png", "slo.png"):
        assert (out / png).stat().st_size > 0, png
    assert meta["status"] == "complete" and set(meta["ordering"]) == {"sim", "real"}
    assert meta["slo"]["percentile"] == 99


def test_simulation_from_a_step_costs_csv_needs_no_model(runner, tmp_path):
    csv = tmp_path / "costs.csv"
    pd.DataFrame(cost_rows(CPU_LIKE, points())).to_csv(csv, index=False)
    out = tmp_path / "run"
    result = ablation(runner, out, "--step-costs", str(csv), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ordering"]["sim"]["as_paper"] and doc["ordering"]["real"] is None
    assert doc["step_cost"]["per_prefill_token_ms"] == pytest.approx(0.27)
    assert json.loads((out / "metadata.json").read_text())["config"] is None


def test_one_scheme_runs_alone_and_a_small_budget_bounds_the_chunk(runner, tmp_path):
    csv = tmp_path / "costs.csv"
    pd.DataFrame(cost_rows(CPU_LIKE, points())).to_csv(csv, index=False)
    args = ["--step-costs", str(csv), "--schemes", "both", "--max-num-batched-tokens", "64"]
    result = ablation(runner, tmp_path / "run", *args)
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "ablation.csv")
    assert list(df["scheme"]) == ["both"] and list(df["chunk_size"]) == [64]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--chunk-size", "512"], "--chunk-size"),  # larger than the 256-token budget
        (["--chunk-size", "0"], "--chunk-size"),
        (["--chunk-size", "-8"], "--chunk-size"),
        (["--schemes", "mixed-only", "--chunk-size", "64"], "--chunk-size"),  # no chunking
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
        (["--max-num-batched-tokens", "-1"], "--max-num-batched-tokens"),
        (["--max-num-batched-tokens", "4"], "--max-num-batched-tokens"),  # below 8 sequences
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--max-num-seqs", "-2"], "--max-num-seqs"),
        (["--schemes", "mixed-only", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
        (["--schemes", "orca"], "--schemes"),
        (["--slo-ttft", "1"], "--slo-tbt"),
        (["--slo-ttft", "1", "--slo-tbt", "0"], "--slo-tbt"),
        (["--arrival-rate", "0"], "--arrival-rate"),
        (["--long-prompt-fraction", "1.5"], "--long-prompt-fraction"),
        (["--step-costs", "/nonexistent/phases.csv"], "--step-costs"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(runner, tmp_path, args, option):
    result = ablation(runner, tmp_path / "x", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {option}:"), result.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        # the long prompts alone outgrow the context: that option, not --max-output
        (["--long-prompt-len", "100000"], "Error: --long-prompt-len: a 100,000-token prompt "
         "and its first output token exceed the model's --max-context"),
        (["--prompt-len", "100000", "--long-prompt-fraction", "0"], "Error: --prompt-len: a "
         "100,000-token prompt"),
        # the budget below the sequences names --slots, as the help spells it
        (["--max-num-batched-tokens", "4", "--slots", "8"], "Error: --max-num-batched-tokens: "
         "4 is less than --slots 8 (vLLM's max_num_seqs): running decodes would starve"),
    ],
)
def test_an_error_names_the_option_the_help_lists(runner, tmp_path, args, line):
    result = ablation(runner, tmp_path / "x", *TINY, *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), lines


def test_wide_step_spread_against_the_cost_model_is_flagged():
    steady = [{"scheme": "both", "step_ms": 10.0 + i % 3, "sim_step_ms": 10.0} for i in range(50)]
    spiky = [{"scheme": "mixed-only", "step_ms": 10.0, "sim_step_ms": 10.0} for _ in range(50)]
    spiky += [{"scheme": "mixed-only", "step_ms": 80.0, "sim_step_ms": 10.0} for _ in range(10)]
    assert probe.noisy(steady + spiky) == ["mixed-only"]


def test_noise_that_hides_every_token_cost_gives_a_flat_model_and_says_so():
    """Steps whose times fall as tokens grow (noise larger than the cost): a flat model,
    with decode and prefill reported unmeasured, never an error after the timing."""
    rows = [
        dict(decode_tokens=d, prefill_tokens=p, context_tokens=0, step_ms=9.0 - 0.01 * (d + p))
        for d, p in ((1, 0), (8, 0), (0, 64), (0, 256), (8, 64))
    ]
    model, fitted = stepcost.fit(rows, "repeats")
    assert (model.per_decode_token_s, model.per_prefill_token_s) == (0, 0)
    times = [r["step_ms"] / 1e3 for r in rows]
    assert min(times) <= model.base_s <= max(times)  # one price for every step
    summary = stepcost.cost_summary(model, fitted)
    assert summary["per_token_costs_unmeasured"] == ["decode_tokens", "prefill_tokens"]
