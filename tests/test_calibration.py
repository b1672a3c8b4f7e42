"""The engine's step-cost calibration (core/calibration.py, runtime/calibrate.py): the fit
recovers the terms of a synthetic engine whose step costs are known, weighs each step by
its relative error, keeps its coefficients non-negative; the simulator prices the
per-sequence term; a calibration made elsewhere is refused or flagged; the calibration run
of the real engine (tiny preset) produces every step kind."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchbatch.core import calibration as cal
from benchbatch.core import cpu_clock, pricing
from benchbatch.core import saved_calibration as sc
from benchbatch.core.calibration_text import line
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import simulate_timed
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.units import significant
from benchbatch.core.workload import Request
from benchbatch.errors import UserError

# A synthetic engine: seconds per step, per sequence, decode token, prefill token, KV entry.
TRUE = {"base_s": 2e-3, "per_sequence_s": 3e-4, "per_decode_token_s": 5e-4,
        "per_prefill_token_s": 2e-4, "per_context_token_s": 2e-7}  # fmt: skip


def synthetic_steps(n: int, noise: float, seed: int = 0) -> list[dict]:
    """Step rows as the calibration records them (decode-only at batches 1-16 and contexts
    16-600, prefills of one to four prompts, mixed), each costing TRUE's linear model times
    (1 + noise x a standard normal)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        b, ctx = int(rng.integers(1, 17)), int(rng.integers(16, 600))
        prompts = int(rng.integers(1, 5))
        p = prompts * int(rng.choice([16, 64, 128, 256]))
        kind = i % 3
        if kind == 0:
            s, d, pt, c = b, b, 0, b * ctx
        elif kind == 1:
            s, d, pt, c = prompts, 0, p, 0
        else:
            s, d, pt, c = b + 1, b, p, b * ctx
        t = true_cost(s, d, pt, c) * (1 + noise * rng.standard_normal())
        rows.append({"sequences": s, "decode_tokens": d, "prefill_tokens": pt,
                     "context_tokens": c, "step_ms": 1e3 * t})  # fmt: skip
    return rows


def true_cost(s: int, d: int, p: int, c: int) -> float:
    t = TRUE
    return (t["base_s"] + t["per_sequence_s"] * s + t["per_decode_token_s"] * d
            + t["per_prefill_token_s"] * p + t["per_context_token_s"] * c)  # fmt: skip


def test_the_fit_recovers_a_noiseless_engine_exactly():
    out = cal.fit(synthetic_steps(90, noise=0.0))
    got = out["summary"]["coefficients_s"]
    for term, value in TRUE.items():
        assert got[term] == pytest.approx(value, rel=1e-9), term
    assert max(abs(r["error"]) for r in out["rows"]) < 1e-9
    assert out["model"].per_sequence_s == pytest.approx(TRUE["per_sequence_s"], rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_term_within_three_of_its_stated_standard_errors(seed):
    noise = 0.04
    out = cal.fit(synthetic_steps(300, noise, seed))
    s = out["summary"]
    for term, value in TRUE.items():
        se = s["std_errors_s"][term]
        assert 0 < se < value, term  # each term determined, and the error says how well
        assert abs(s["coefficients_s"][term] - value) <= 3 * se, term
    # Per step kind: the relative errors are the noise's (|N(0, 0.04)|: median 0.027).
    for kind in cal.KINDS:
        k = s["kinds"][kind]
        assert k["steps"] == 100
        assert 0.5 * 0.674 * noise < k["median_abs_error"] < 1.5 * 0.674 * noise, kind
        assert k["p90_abs_error"] > k["median_abs_error"]


def test_the_stated_standard_errors_shrink_as_the_noise_does():
    wide = cal.fit(synthetic_steps(300, 0.08))["summary"]["std_errors_s"]
    narrow = cal.fit(synthetic_steps(300, 0.02))["summary"]["std_errors_s"]
    for term in TRUE:
        assert narrow[term] == pytest.approx(wide[term] / 4, rel=0.35), term


# Decode steps from 1 ms to 1 s, each 5% off a line in a fixed pattern: a fit on relative
# error is 6% off at both ends; unweighted it is 52% off the 1 ms steps (the 1 s ones decide
# the base), with squared weights 10% off the 1 s steps (the 1 ms ones decide the slope).
SPAN = [(d, s) for d, s in zip((1, 2, 3, 4, 5, 6, 1200, 1600, 2000),
                               (1, -1, -1, 1, 1, -1, 1, -1, 1), strict=True)]  # fmt: skip


def span_rows() -> list[dict]:
    return [
        {"sequences": 0, "decode_tokens": d, "prefill_tokens": 0, "context_tokens": 0,
         "step_ms": 1e3 * (0.5e-3 + 0.5e-3 * d) * (1 + 0.05 * s)}
        for d, s in SPAN
    ]  # fmt: skip


def test_relative_weighting_fits_the_1ms_steps_and_the_1s_steps_alike():
    rows = span_rows()
    assert rows[0]["step_ms"] == pytest.approx(1.05) and rows[-1]["step_ms"] > 1000
    errors = [abs(r["error"]) for r in cal.fit(rows)["rows"]]
    assert max(errors[:6]) < 0.08, "the 1 ms steps"
    assert max(errors[6:]) < 0.08, "the 1 s steps"


def test_the_fit_keeps_every_coefficient_non_negative():
    # Steps that would give a negative per-decode cost unconstrained (more decodes, faster).
    rows = [{"sequences": 0, "decode_tokens": d, "prefill_tokens": 0, "context_tokens": 0,
             "step_ms": 10.0 - 0.1 * d} for d in range(1, 9)]  # fmt: skip
    coef = cal.fit(rows)["summary"]["coefficients_s"]
    assert all(v >= 0 for v in coef.values())
    assert coef["per_decode_token_s"] == 0


def test_nnls_matches_the_brute_force_over_active_sets():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((20, 4)), rng.standard_normal(20)
    best = None
    for mask in range(16):
        cols = [j for j in range(4) if mask >> j & 1]
        x = np.zeros(4)
        if cols:
            x[cols] = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (x >= 0).all():
            r = float(np.sum((a @ x - b) ** 2))
            best = r if best is None else min(best, r)
    x = cal.nnls(a, b)
    assert (x >= 0).all() and float(np.sum((a @ x - b) ** 2)) == pytest.approx(best, rel=1e-9)


def test_the_simulator_prices_the_per_sequence_term():
    """Two requests on two slots: A (prompt 5, 3 tokens), B (prompt 2, 2 tokens). Step 0
    prefills both (2 sequences, 7 prefill tokens); step 1 decodes both (2 sequences, 2
    decode tokens, KV entries 5 + 2); step 2 decodes A (1 sequence, 1 token, 6 entries)."""
    b, s, d, p, c = 1e-3, 2e-4, 3e-4, 5e-5, 1e-6
    model = StepCostModel(b, d, p, c, per_sequence_s=s)
    hand = (b + 2 * s + 7 * p) + (b + 2 * s + 2 * d + 7 * c) + (b + s + d + 6 * c)
    requests = [Request(0, 5, 3), Request(1, 2, 2)]
    run = simulate_timed(requests, [0.0, 0.0], make_scheduler("continuous", 2), model)
    assert run.total_steps == 3
    assert run.total_time == pytest.approx(hand, rel=1e-12)
    without = StepCostModel(b, d, p, c)
    again = simulate_timed(requests, [0.0, 0.0], make_scheduler("continuous", 2), without)
    assert run.total_time - again.total_time == pytest.approx(5 * s, rel=1e-9)


def test_a_decode_batch_over_scattered_slots_is_priced_by_the_kv_it_gathers():
    """Three slots: A and C (prompt 2, 3 tokens) and B (prompt 2, 1 token) prefilled at
    step 0; B leaves, so steps 1 and 2 decode slots 0 and 2, not a contiguous run: the
    engine gathers 2 x (longest context + 1) entries, 2 x 3 then 2 x 4."""
    g = 1e-6
    requests = [Request(0, 2, 3), Request(1, 2, 1), Request(2, 2, 3)]
    model = StepCostModel(0.0, 0.0, 0.0, 0.0, per_gathered_token_s=g)
    run = simulate_timed(requests, [0.0] * 3, make_scheduler("continuous", 3), model)
    assert run.total_steps == 3 and run.total_time == pytest.approx(14 * g, rel=1e-12)
    # In contiguous slots (B the last one to leave) nothing is gathered.
    contiguous = [Request(0, 2, 3), Request(1, 2, 3), Request(2, 2, 1)]
    again = simulate_timed(contiguous, [0.0] * 3, make_scheduler("continuous", 3), model)
    assert again.total_time == 0


def test_a_gathered_term_is_recovered_beside_the_others():
    rows = synthetic_steps(120, 0.0)
    g = 3e-6
    for i, r in enumerate(rows):
        if r["decode_tokens"] > 1 and i % 2:
            r["gathered_tokens"] = r["decode_tokens"] * (
                r["context_tokens"] // r["decode_tokens"] + 9
            )
            r["step_ms"] += 1e3 * g * r["gathered_tokens"]
    got = cal.fit(rows)["summary"]["coefficients_s"]
    assert got["per_gathered_token_s"] == pytest.approx(g, rel=1e-9)
    assert got["base_s"] == pytest.approx(TRUE["base_s"], rel=1e-9)


def test_masked_and_batched_terms_are_recovered_beside_the_others():
    """Decode batches of mixed contexts (keys past a row's own context, masked, each costing
    what a read key does: the engine's SDPA computes them alike) and a step cost for two
    matmul rows or more: both recovered exactly beside TRUE's terms."""
    rows = synthetic_steps(150, 0.0)
    m, k = TRUE["per_context_token_s"], 2.5e-3
    for i, r in enumerate(rows):
        if r["decode_tokens"] > 1 and i % 2:
            r["masked_tokens"] = r["decode_tokens"] * (7 + i % 40)
            r["step_ms"] += 1e3 * m * r["masked_tokens"]
        r["batched"] = int(r["decode_tokens"] + r["prefill_tokens"] >= 2)
        r["step_ms"] += 1e3 * k * r["batched"]
    out = cal.fit(rows)["summary"]
    got = out["coefficients_s"]
    assert out["masked_keys_tied"]
    assert got["per_masked_token_s"] == pytest.approx(m, rel=1e-9)
    assert out["std_errors_s"]["per_masked_token_s"] == out["std_errors_s"]["per_context_token_s"]
    assert got["batched_step_s"] == pytest.approx(k, rel=1e-9)
    for term, value in TRUE.items():
        assert got[term] == pytest.approx(value, rel=1e-9), term


@pytest.mark.parametrize("seed", range(6))
def test_a_static_groups_mostly_masked_step_is_priced_from_few_masked_keys(seed):
    """The calibration's continuous batches mask few keys (0-15% of a row's context here),
    a static group's late steps mostly masked ones (28 padded rows of 32). With 3% noise a
    fit of the masked price apart from the read one moved that step's price x0.94-1.11
    over these seeds (on reproduce --real's 32 slots the static run took x1.14 of its
    price); one price for both keys holds it within 2%."""
    rows = synthetic_steps(200, 0.03, seed)
    rng = np.random.default_rng(seed + 100)
    c = TRUE["per_context_token_s"]
    for r in rows:
        if r["decode_tokens"] > 1 and r["prefill_tokens"] == 0:
            r["masked_tokens"] = int(r["context_tokens"] * rng.uniform(0.0, 0.15))
            r["step_ms"] += 1e3 * c * r["masked_tokens"] * (1 + 0.03 * rng.standard_normal())
    model = cal.fit(rows)["model"]
    late = {"active": 4, "padded": 28, "decode_tokens": 4, "prefill_tokens": 0,
            "context_tokens": 4 * 300, "masked_tokens": 28 * 301 + 4}  # fmt: skip
    truth = true_cost(32, 32, 0, 4 * 300) + c * late["masked_tokens"]
    assert pricing.price_ms(model, late) == pytest.approx(1e3 * truth, rel=0.02)


def test_an_endpoints_steps_without_masked_keys_leave_the_masked_price_zero():
    """A server's steps (vLLM's paged attention reads each row's own keys) hold no masked
    keys: nothing is tied, and a simulation of its plans charges none."""
    out = cal.fit(synthetic_steps(90, 0.0))["summary"]
    assert not out["masked_keys_tied"]
    assert out["coefficients_s"]["per_masked_token_s"] == 0
    assert out["coefficients_s"]["per_context_token_s"] == pytest.approx(
        TRUE["per_context_token_s"], rel=1e-9
    )


def engine_steps(model, monkeypatch, requests, run):
    """A run on the real engine, step by step: the scheduler's plans, the model's calls
    ((batch, tokens, kv_len) of each part of its mixed_step) and the engine's step rows."""
    from benchbatch.runtime import calibrate as cb
    from benchbatch.runtime.runs import Finished, engine_events

    calls = []
    step = model.mixed_step

    def spy(cache, parts, *args, **kwargs):
        calls.append([(t.shape[0], t.shape[1], kv) for t, _, kv in parts])
        return step(cache, parts, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(model, "mixed_step", spy)
        plans = cb.plans(run, requests)
        rows = [e for e in engine_events(model, requests, [run], 0)
                if not isinstance(e, Finished)]  # fmt: skip
    assert len(calls) == len(plans) == len(rows)
    return plans, calls, rows


def test_a_prompt_pair_term_is_recovered_beside_the_others():
    """Prompts whose attention costs with the square of their length (n(n + 1) / 2 pairs
    each, one to four prompts of 16-256 tokens a step): the pair term recovered exactly
    beside TRUE's per-token terms, and a fit without the pairs' column misses it."""
    rows = synthetic_steps(150, 0.0)
    q = 2e-7  # about what cpu-small's calibrations fit (0.15-0.3 us a pair)
    for i, r in enumerate(rows):
        if r["prefill_tokens"]:
            prompts = 1 + i % 4  # the same total split another way each step
            n, extra = divmod(r["prefill_tokens"], prompts)
            lengths = [n + (j < extra) for j in range(prompts)]
            r["prompt_pairs"] = sum(k * (k + 1) // 2 for k in lengths)
            r["step_ms"] += 1e3 * q * r["prompt_pairs"]
    got = cal.fit(rows)["summary"]["coefficients_s"]
    assert got["per_prompt_pair_s"] == pytest.approx(q, rel=1e-9)
    for term, value in TRUE.items():
        assert got[term] == pytest.approx(value, rel=1e-9), term
    blind = cal.fit([{k: v for k, v in r.items() if k != "prompt_pairs"} for r in rows])
    assert blind["summary"]["kinds"]["prefill"]["median_abs_error"] > 0.01


def staircase(rows: list[dict], block: int, per_block: float, prefill: float,
              per_row: float = 9e-4) -> list[dict]:  # fmt: skip
    """TRUE's steps on a BLAS with two regimes: a decode-only step of r rows costs the base,
    its KV reads, per_row a row and per_block for each `block` rows begun (its kernel for
    few rows streams the weights again for each block); a step with prefill tokens TRUE's
    cost and `prefill` more. Each row with the columns the engine records."""
    out = []
    for r in rows:
        lone = r["decode_tokens"] if not r["prefill_tokens"] else 0
        if lone:
            t = (TRUE["base_s"] + TRUE["per_context_token_s"] * r["context_tokens"]
                 + per_row * lone + per_block * -(-lone // block))  # fmt: skip
        else:
            t = r["step_ms"] / 1e3 + prefill
        out.append(r | {"decode_only_rows": lone, "prefill_step": int(bool(r["prefill_tokens"])),
                        "step_ms": 1e3 * t})  # fmt: skip
    return out


def test_row_blocks_and_a_prefill_steps_cost_are_recovered_beside_the_others():
    """Decode-only steps of 1-16 rows costing 0.9 ms a row and 7 ms for each block of three
    rows begun, steps with prefill tokens TRUE's cost and 9 ms: the fit finds the block of
    three among ROW_BLOCKS and recovers every term exactly; the model it returns prices
    them, and a fit without the columns misses the stairs."""
    rows = staircase(synthetic_steps(150, 0.0), 3, 7e-3, 9e-3)
    out = cal.fit(rows)
    got, model = out["summary"]["coefficients_s"], out["model"]
    assert model.row_block == 3 and out["summary"]["row_block"] == 3
    assert got["per_row_block_s"] == pytest.approx(7e-3, rel=1e-9)
    assert got["per_decode_only_row_s"] == pytest.approx(9e-4, rel=1e-9)
    assert got["prefill_step_s"] == pytest.approx(9e-3, rel=1e-9)
    for term, value in TRUE.items():
        assert got[term] == pytest.approx(value, rel=1e-9), term
    assert max(abs(r["error"]) for r in out["rows"]) < 1e-9
    assert "ms/block of 3 decode rows" in line(out["summary"])
    blind = cal.fit([{k: v for k, v in r.items() if k not in ("decode_only_rows",
                                                              "prefill_step")} for r in rows])
    assert blind["model"].row_block == 0
    assert blind["summary"]["kinds"]["decode"]["median_abs_error"] > 0.05


@pytest.mark.parametrize("seed", range(4))
def test_a_calibration_without_stairs_keeps_no_row_blocks(seed):
    """Steps that rise evenly with their rows (TRUE's, 3% noise), recorded with the
    engine's columns: three terms and a block size chosen among nine fit a little of the
    noise (up to 6% less summed squared error in 40 such draws), far less than BLOCK_GAIN,
    so the model keeps one regime (and prices as before)."""
    rows = [r | {"decode_only_rows": 0 if r["prefill_tokens"] else r["decode_tokens"],
                 "prefill_step": int(bool(r["prefill_tokens"]))}
            for r in synthetic_steps(200, 0.03, seed)]  # fmt: skip
    model = cal.fit(rows)["model"]
    assert model.row_block == 0 and model.per_row_block_s == 0 and model.prefill_step_s == 0


def test_the_simulator_prices_row_blocks_and_prefill_steps():
    """One request alone (prompt 4, 3 tokens) and then five decoding together: a step with
    prefill tokens pays prefill_step_s beside its sequences' and tokens' prices, a
    decode-only step of r rows per_decode_only_row_s a row and per_row_block_s for each
    block of two rows begun (3 blocks at 5 rows), not the sequence and decode token prices;
    scaled() keeps the block size."""
    b, d, p, s, r = 1e-3, 3e-4, 5e-5, 2e-4, 7e-4
    model = StepCostModel(b, d, p, per_sequence_s=s, per_row_block_s=4e-3, row_block=2,
                          per_decode_only_row_s=r, prefill_step_s=6e-3)  # fmt: skip
    one = simulate_timed([Request(0, 4, 3)], [0.0], make_scheduler("continuous", 1), model)
    hand = (b + s + 4 * p + 6e-3) + 2 * (b + r + 4e-3)  # one prefill, two decodes of one row
    assert one.total_time == pytest.approx(hand, rel=1e-12)
    five = [Request(i, 1, 2) for i in range(5)]
    run = simulate_timed(five, [0.0] * 5, make_scheduler("continuous", 5), model)
    assert run.total_time == pytest.approx((b + 5 * s + 5 * p + 6e-3) + (b + 5 * r + 3 * 4e-3),
                                           rel=1e-12)  # fmt: skip
    assert model.scaled(2.0).row_block == 2
    assert model.scaled(2.0).per_row_block_s == pytest.approx(8e-3)


def test_prompt_pairs_are_the_pairs_the_engines_causal_kernel_attends(
    tiny_model, one_thread, monkeypatch
):
    """prompt_pairs of every step (the plan's, and the engine's record of it) equals the
    pairs of the model's own calls that attend from scratch (kv_len equal to the tokens:
    SDPA's causal kernel, b x t(t + 1) / 2), for whole prompts and for a long prompt's
    chunks, whose later chunks read the earlier ones from the cache and count none; the
    step-cost model prices them at per_prompt_pair_s each."""
    from benchbatch.core.step_model import prompt_pairs
    from benchbatch.runtime.runs import EngineRun

    requests = [Request(i, 3 + 7 * i, 2 + (5 * i) % 9) for i in range(6)]
    chunked = {"chunked_prefill": True, "chunk_size": 8, "mixed": True,
               "max_num_batched_tokens": 12}  # fmt: skip
    later_chunks = 0
    for name, settings in (("continuous", {}), ("chunked", chunked)):
        run = EngineRun(name, 3, settings=settings)
        plans, calls, rows = engine_steps(tiny_model, monkeypatch, requests, run)
        for plan, parts, row in zip(plans, calls, rows, strict=True):
            prefills = parts[:-1] if plan.decodes or plan.padded_slots else parts  # decode last
            fresh = sum(b * t * (t + 1) // 2 for b, t, kv in prefills if kv == t)
            assert prompt_pairs(plan) == fresh == row["prompt_pairs"]
            model = StepCostModel(0.0, 0.0, 0.0, 0.0, per_prompt_pair_s=1e-9)
            assert model(plan) == pytest.approx(1e-9 * fresh, rel=1e-12, abs=0)
            later_chunks += any(c.start > 0 for c in plan.prefills)
        assert sum(r["prompt_pairs"] for r in rows) > 0
    assert later_chunks > 0  # the chunked run had chunks after earlier ones


def test_the_masked_keys_are_what_the_engines_attention_reads_past_each_context(
    tiny_model, one_thread, monkeypatch
):
    """masked_tokens of every decode step equals the engine's own attention rectangle (the
    rows times the kv_len it passes the model) less the rows' own keys, for continuous
    batches of mixed contexts and static groups with padded slots; batched is 0 exactly
    for a lone decode row; since_change is the plan's."""
    from benchbatch.core.step_model import batched, masked_tokens
    from benchbatch.runtime.runs import EngineRun

    requests = [Request(i, 3 + 7 * i, 2 + (5 * i) % 9) for i in range(6)]
    lone_steps = 0
    for policy in ("continuous", "static"):
        run = EngineRun(policy, 3, policy=policy)
        plans, calls, rows = engine_steps(tiny_model, monkeypatch, requests, run)
        for plan, parts, row in zip(plans, calls, rows, strict=True):
            decode = [(b, kv) for b, t, kv in parts if t == 1 and plan.decodes]
            own = sum(d.context_len + 1 for d in plan.decodes)
            rectangle = sum(b * kv for b, kv in decode)
            assert masked_tokens(plan) == rectangle - own == row["masked_tokens"]
            lone = plan.num_decode_tokens == 1 and not plan.prefills and not plan.padded_slots
            assert batched(plan) == row["batched"] == (0 if lone else 1)
            assert row["since_change"] == plan.since_change  # the step row keeps the plan's
            lone_steps += lone
        assert sum(r["masked_tokens"] for r in rows) > 0
        if policy == "static":  # a finished member's slot can be the longest one
            assert any(p.padded_context > max(d.context_len for d in p.decodes)
                       for p in plans if p.decodes and p.padded_slots)  # fmt: skip
    assert lone_steps > 0  # continuous ends decoding its last request alone


# --- conditions --------------------------------------------------------------------------------

HERE = {"device": "AMD EPYC", "torch": "2.5.0", "dtype": "float32", "threads": 1,
        "load_class": "quiet", "pinned_cores": "all"}  # fmt: skip


def test_a_calibration_from_another_device_is_refused():
    with pytest.raises(UserError) as e:
        sc.compare(HERE | {"device": "NVIDIA H100"}, HERE)
    assert e.value.option == "--step-costs" and "NVIDIA H100" in e.value.message


def test_another_thread_count_is_flagged_by_name():
    lines = sc.compare(HERE | {"threads": 4}, HERE)
    assert len(lines) == 1 and "threads 4 at calibration, 1 now" in lines[0]
    assert sc.compare(HERE, HERE) == []
    both = sc.compare(HERE | {"threads": 2, "load_class": "busy"}, HERE)[0]
    assert "threads 2" in both and "load_class busy" in both


@pytest.mark.parametrize(("key", "then", "now"), [
    ("pinned_cores", [0], "all"),
    ("benchbatch", "0.9.0", "1.0.0"),
    ("host_id", "a1b2c3d4e5f6", "0f9e8d7c6b5a"),
    ("torch", "2.4.0", "2.5.0"),
    ("dtype", "bfloat16", "float32"),
])  # fmt: skip
def test_each_other_condition_is_flagged_by_name(key, then, now):
    """Another host of the same CPU model, another benchbatch, pinning, torch or dtype: a
    warning naming what moved (never a silent reuse), and no refusal."""
    lines = sc.compare(HERE | {key: then}, HERE | {key: now})
    assert len(lines) == 1 and f"{key} {then} at calibration, {now} now" in lines[0]
    assert "calibrate again" in lines[0]


def test_the_engines_conditions_name_the_host_without_its_name(tiny_model):
    import platform

    from benchbatch.runtime import calibrate as cb

    seen = cb.conditions(tiny_model)
    assert seen["host_id"] == sc.host_id(platform.node()) and len(seen["host_id"]) == 12
    assert len(platform.node()) < 3 or platform.node() not in json.dumps(seen)
    assert sc.host_id("machine-a") != sc.host_id("machine-b")
    other = seen | {"host_id": sc.host_id(platform.node() + "-other")}
    assert "host_id" in sc.compare(other, seen)[0]


def test_the_load_class_follows_the_load_per_core():
    """One rule with the run's own load class (machine.load_class): quiet and busy agree at
    every load; busy is split where no core is left free; no load average is unknown."""
    from benchbatch.core import machine

    assert [sc.load_class(x, 2) for x in (0.5, 1.5, 2.5)] == ["quiet", "busy", "saturated"]
    assert sc.load_class(float("nan"), 2) == sc.load_class(None, 2) == "unknown"
    for load in np.linspace(0.0, 6.0, 61):
        for cores in (1, 2, 4):
            mine, runs = sc.load_class(load, cores), machine.load_class(load, cores)
            assert (mine == "quiet") == (runs == "quiet")
            assert (mine == "saturated") == (load / cores >= 1.0)


def test_a_saved_calibration_is_read_back_with_its_conditions(tmp_path):
    out = cal.fit(staircase(synthetic_steps(60, 0.0), 4, 5e-3, 2e-3))
    assert out["model"].row_block == 4
    doc = out["summary"] | {"conditions": HERE | {"threads": 8}}
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps(doc))
    back = sc.given([path])
    assert back["source"] == "calibration" and back["conditions"]["threads"] == 8
    for term in cal.TERMS:
        assert getattr(back["model"], term) == pytest.approx(getattr(out["model"], term))
    assert back["model"].row_block == 4
    # The step_cost.csv beside it is refitted to the same model, the conditions read beside.
    import pandas as pd

    pd.DataFrame(out["rows"]).to_csv(tmp_path / "step_cost.csv", index=False)
    refit = sc.given([tmp_path / "step_cost.csv"])
    assert refit["conditions"]["threads"] == 8
    assert refit["model"].per_sequence_s == pytest.approx(TRUE["per_sequence_s"], rel=1e-9)
    assert refit["model"].row_block == 4
    assert refit["model"].per_row_block_s == pytest.approx(5e-3, rel=1e-9)
    with pytest.raises(UserError):
        sc.given([path, tmp_path / "step_cost.csv"])


def test_an_older_step_cost_csv_still_reads_as_isolated_steps(tmp_path):
    import pandas as pd

    rows = [{"decode_tokens": d, "prefill_tokens": p, "context_tokens": d * 100,
             "step_ms": 1.0 + 0.05 * d + 0.01 * p + 0.0005 * d * 100}
            for d, p in ((1, 0), (4, 0), (8, 0), (0, 64), (0, 128), (4, 64))]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "old.csv", index=False)
    got = sc.given([tmp_path / "old.csv"])
    assert got["source"] == "isolated steps" and got["conditions"] is None
    assert got["model"].base_s == pytest.approx(1e-3, rel=1e-6)
    assert got["model"].per_sequence_s == 0


def test_a_broken_calibration_json_names_the_option(tmp_path):
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps({"coefficients_s": {"base_s": -1}}))
    with pytest.raises(UserError) as e:
        sc.given([path])
    assert e.value.option == "--step-costs"


# --- the calibration run of the real engine ------------------------------------------------------


def test_the_calibration_run_produces_every_step_kind(tiny_model, one_thread):
    from benchbatch.runtime import calibrate as cb
    from benchbatch.runtime.runs import Finished

    plan = cb.plan_for(4, [16, 16, 40], 16, 24, tiny_model.cfg.max_context, decode_steps=2)
    runs = cb.runs(plan)
    rows, finished = [], []
    for event in cb.events(tiny_model, runs):
        (finished if isinstance(event, Finished) else rows).append(event)
    assert [f.run.name for f in finished] == ["decode", "scattered", "prefill", "chunked"]
    assert all(f.result.complete for f in finished)
    assert len(rows) == cb.total_steps(runs)
    # The replayed plan's sequences are the engine's own active rows, step by step.
    assert all(r["sequences"] == r["active"] for r in rows)
    kinds = [cal.step_kind(r) for r in rows]
    assert {"decode", "prefill", "mixed"} <= set(kinds)
    decode = [r for r, k in zip(rows, kinds, strict=True) if k == "decode"]
    assert len({r["decode_tokens"] for r in decode}) >= 3  # several batch sizes
    assert len({r["context_tokens"] // r["decode_tokens"] for r in decode}) >= 3  # contexts
    prefill = [r for r, k in zip(rows, kinds, strict=True) if k == "prefill"]
    assert {1, 2, 4} <= {r["sequences"] for r in prefill}  # one to four prompts at once
    assert len({r["prefill_tokens"] for r in prefill}) >= 3  # a few lengths
    gathered = {r["gathered_tokens"] > 0 for r in decode}
    assert gathered == {True, False}  # decodes in contiguous slots, and scattered ones
    mixed = [r for r, k in zip(rows, kinds, strict=True) if k == "mixed"]
    chunked = [r for r in mixed if r["calibration"] == "chunked"]
    assert chunked and all(r["prefill_tokens"] <= 24 for r in chunked)
    out = cal.fit(cb.fit_rows(rows))
    assert set(out["summary"]["kinds"]) == set(cal.KINDS)
    assert all(r["fitted_ms"] > 0 for r in out["rows"])
    cond = cb.conditions(tiny_model)
    assert cond["threads"] == 1 and cond["dtype"] == "float32" and cond["device_type"] == "cpu"


def _calibration_json(tmp_path, **conditions) -> str:
    from benchbatch.runtime.device import cpu_model

    out = cal.fit(synthetic_steps(60, 0.0))
    here = {"device": cpu_model(), "threads": 1, "torch": "x", "load_class": "quiet"}
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps(out["summary"] | {"conditions": here | conditions}))
    return str(path)


def test_the_real_engine_refuses_another_devices_calibration(runner, tmp_path):
    from test_ablation import SMALL, TINY

    from benchbatch.app.cli import app

    costs = _calibration_json(tmp_path, device="NVIDIA H100 80GB HBM3")
    args = ["ablation", *TINY, *SMALL, "--engine", "real", "--step-costs", costs,
            "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--step-costs" in result.output and "NVIDIA H100" in result.output
    assert not (tmp_path / "run").exists()  # refused before the folder (it was left failed)


def test_the_real_engine_flags_a_calibration_made_with_other_threads(runner, tmp_path):
    from test_ablation import SMALL, TINY

    from benchbatch.app.cli import app

    costs = _calibration_json(tmp_path, threads=64)
    args = ["ablation", *TINY, *SMALL, "--engine", "real", "--schemes", "both",
            "--step-costs", costs, "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "threads 64 at calibration" in text and "calibrate again" in text
    saved = json.loads((tmp_path / "run" / "step_cost.json").read_text())
    assert saved["conditions"]["threads"] == 64  # the calibration used, as it was made


def test_serve_sweep_prices_a_static_groups_padded_slots_as_sequences():
    """Static batching on two slots: A (1 token) and B (3 tokens) prefilled together; A's slot
    keeps decoding padding for B's two decode steps, rows the engine computes and pays."""
    s, d = 1e-3, 1e-4
    model = StepCostModel(0.0, d, 0.0, 0.0, per_sequence_s=s)
    requests = [Request(0, 4, 1), Request(1, 4, 3)]
    run = simulate_timed(requests, [0.0, 0.0], make_scheduler("static", 2), model)
    assert run.total_steps == 3
    assert run.total_time == pytest.approx(2 * s + 2 * (2 * s + 2 * d), rel=1e-12)


# serve-sweep on the tiny preset with two real points (continuous, 6 requests each).
TWO_REAL_POINTS = ["serve-sweep", "--preset", "tiny", "--requests", "6", "--real-requests", "6",
                   "--median", "4", "--max-output", "6", "--prompt-len", "16", "--max-prompt",
                   "32", "--rates", "50,100", "--real-rates", "50,100", "--policies",
                   "continuous", "--threads", "1"]  # fmt: skip


def test_serve_sweep_prices_its_steps_after_each_point_not_between_steps(
    runner, tmp_path, monkeypatch
):
    """Pricing a step costs the host tens of microseconds: serve-sweep prices a point's
    steps once its run is over, never while the engine is between two of its steps (its
    calibration's steps were not priced as they ran, so its host gap holds no pricing);
    every row of real_steps.csv still has both clocks' prices, the fit's own."""
    import pandas as pd

    from benchbatch.app.cli import app
    from benchbatch.runtime import engine

    running, during, calls = [False], [], []
    steps = engine.Engine.steps

    def tracked(self, *args, **kwargs):
        running[0] = True
        yield from steps(self, *args, **kwargs)
        running[0] = False

    real_price = pricing.price_ms

    def price(model, row):
        during.append(running[0])
        calls.append((model, row))
        return real_price(model, row)

    monkeypatch.setattr(engine.Engine, "steps", tracked)
    monkeypatch.setattr(pricing, "price_ms", price)
    out = tmp_path / "run"
    args = [*TWO_REAL_POINTS, "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    steps_csv = pd.read_csv(out / "real_steps.csv")
    assert len(steps_csv) > 0 and steps_csv["priced_ms"].gt(0).all()
    assert steps_csv["priced_cpu_ms"].gt(0).all()
    assert during and not any(during)  # all priced with no engine mid-run
    wake = json.loads((out / "step_cost.json").read_text())["wake"]  # its wake runs fitted
    assert 1 <= wake["woken_steps"] <= 8 and wake["idle_s"][0] > 0  # (a wait may pass unseen)
    models = list({id(m): m for m, _ in calls}.values())
    assert len(models) == 2  # the wall clock's fit and the CPU clock's
    for row in steps_csv.to_dict("records"):
        prices = sorted(real_price(m, row) for m in models)
        assert sorted([row["priced_ms"], row["priced_cpu_ms"]]) == pytest.approx(prices)


def test_an_interrupted_serve_sweep_prices_what_it_kept(runner, tmp_path, monkeypatch):
    """Ctrl-C in the second real point's run: the steps kept of it are priced on the way
    out (the first point's after its run), so real_steps.csv has a price on every row."""
    import pandas as pd

    from benchbatch.app.cli import app
    from benchbatch.runtime import engine

    steps, runs = engine.Engine.steps, []

    def cut(self, requests, arrivals_s=None, client_limit=None):
        served = arrivals_s is not None and len(requests) > 1  # (a wake run's: one request)
        if served:  # a served point (the calibration's other runs have no arrivals)
            runs.append(self)
        for i, record in enumerate(steps(self, requests, arrivals_s, client_limit)):
            if len(runs) == 2 and i == 3 and served:
                raise KeyboardInterrupt
            yield record

    monkeypatch.setattr(engine.Engine, "steps", cut)
    out = tmp_path / "run"
    args = [*TWO_REAL_POINTS, "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 130, result.output
    kept = pd.read_csv(out / "real_steps.csv")
    second = kept[kept["rate"] == kept["rate"].iloc[-1]]
    assert kept["rate"].nunique() == 2 and len(second) == 3  # the cut point's three steps
    assert kept["priced_ms"].gt(0).all() and kept["priced_cpu_ms"].gt(0).all()


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_an_executed_steps_price_is_what_the_simulation_charges_its_plan(
    tiny_model, one_thread, policy
):
    """serve-sweep's priced_ms: the price read from the engine's own record (its counts,
    padding, context and gathered tokens) equals the model's price of the plan the
    scheduler replays for the same requests, step by step: static groups with finished
    slots decoding padding, continuous batches over scattered slots."""
    from benchbatch.runtime import calibrate as cb
    from benchbatch.runtime.runs import EngineRun, Finished, engine_events

    model = StepCostModel(2e-3, 3e-4, 5e-5, 7e-7, per_sequence_s=1.1e-3,
                          per_gathered_token_s=1.3e-6, per_row_block_s=4e-3, row_block=2,
                          per_decode_only_row_s=8e-4, prefill_step_s=6e-3)  # fmt: skip
    requests = [Request(i, 6 + 3 * i, 2 + (5 * i) % 7) for i in range(7)]
    run = EngineRun(policy, 3, policy=policy)
    plans = cb.plans(run, requests)
    rows = [e for e in engine_events(tiny_model, requests, [run], 0) if not isinstance(e, Finished)]
    assert len(rows) == len(plans)
    if policy == "static":
        assert sum(r["padded"] for r in rows) > 0
    else:
        assert sum(r["gathered_tokens"] for r in rows) > 0
    for row, plan in zip(rows, plans, strict=True):
        assert pricing.price_ms(model, row) == pytest.approx(1e3 * model(plan), rel=1e-12)


def test_price_errors_are_measured_over_priced_per_run_and_kind():
    rows = [
        {"policy": "a", "active": 1, "decode_tokens": 1, "prefill_tokens": 0, "step_ms": 2.0,
         "priced_ms": 1.0},
        {"policy": "a", "active": 1, "decode_tokens": 1, "prefill_tokens": 0, "step_ms": 4.0,
         "priced_ms": 1.0},
        {"policy": "a", "active": 1, "decode_tokens": 0, "prefill_tokens": 9, "step_ms": 3.0,
         "priced_ms": 4.0},
    ]  # fmt: skip
    out = {(e["policy"], e["kind"]): e for e in pricing.price_errors(rows)}
    assert out[("a", "decode")]["ratio_p50"] == pytest.approx(3.0)
    assert out[("a", "decode")]["steps"] == 2
    assert out[("a", "prefill")]["ratio_p50"] == pytest.approx(0.75)


def test_the_host_gap_between_steps_is_charged_once_a_step():
    """A synthetic engine's steps with a known gap before each (0.3 ms, a first step with
    none, one one-off of 250 ms): the gap is their mean without the one-off, the fit's base
    is the engine's plus it, and the other terms are untouched."""
    rows = []
    for b in (1, 2, 4, 8):
        for ctx in (100, 400, 900):
            step = 2.0 + 0.5 * b + 0.002 * b * ctx  # ms
            rows.append(dict.fromkeys(cal.FEATURES, 0) | {
                "decode_tokens": b, "context_tokens": b * ctx, "step_ms": step,
                "gap_ms": 0.3})  # fmt: skip
    rows[0]["gap_ms"] = float("nan")  # a run's first step
    rows[5]["gap_ms"] = 250.0  # a file opened: a one-off
    assert cal.host_gap_ms(rows) == pytest.approx(0.3)
    got = cal.fit(rows)["summary"]
    assert got["host_gap_ms"] == pytest.approx(0.3)
    coef = got["coefficients_s"]
    assert coef["base_s"] * 1e3 == pytest.approx(2.0 + 0.3, rel=1e-6)
    assert coef["per_decode_token_s"] * 1e3 == pytest.approx(0.5, rel=1e-6)
    assert coef["per_context_token_s"] * 1e3 == pytest.approx(0.002, rel=1e-6)
    assert cal.host_gap_ms([{"step_ms": 1.0}]) == 0.0  # an endpoint's rows: none


# --- the CPU clock: the steps' work, whatever the load ----------------------------------------


def shared_core_steps(share_of: callable, n: int = 90) -> list[dict]:
    """synthetic_steps as the engine records them on a core it shares: each step's CPU time
    is TRUE's cost (the work), its wall time that over the share of the core it held
    (share_of(i)), and so is the gap before it (0.2 ms of work)."""
    rows = []
    for i, r in enumerate(synthetic_steps(n, noise=0.0)):
        share = share_of(i)
        rows.append(r | {"cpu_ms": r["step_ms"], "step_ms": r["step_ms"] / share,
                         "gap_cpu_ms": 0.2, "gap_ms": 0.2 / share})  # fmt: skip
    return rows


def test_the_cpu_clock_fit_recovers_the_work_whatever_share_of_the_core_it_had():
    rows = shared_core_steps(lambda i: 0.4 + 0.5 * (i % 2))  # every other step at 0.4, 0.9
    out = cpu_clock.with_cpu_clock(cal.fit(rows), rows)
    clock = out["summary"]["cpu_clock"]
    got = clock["coefficients_s"]
    # The work's terms exactly, the 0.2 ms gap in the base (the wall fit cannot: its steps
    # cost 1/0.4 or 1/0.9 of the work, a factor no term holds).
    assert got["base_s"] == pytest.approx(TRUE["base_s"] + 0.2e-3, rel=1e-9)
    for term in ("per_sequence_s", "per_decode_token_s", "per_prefill_token_s",
                 "per_context_token_s"):  # fmt: skip
        assert got[term] == pytest.approx(TRUE[term], rel=1e-9), term
        assert getattr(out["cpu_model"], term) == pytest.approx(TRUE[term], rel=1e-9)
    assert clock["median_abs_error"] < 1e-9 and out["summary"]["median_abs_error"] > 0.2
    cpu = sum(r["cpu_ms"] + r["gap_cpu_ms"] for r in rows)
    wall = sum(r["step_ms"] + r["gap_ms"] for r in rows)
    assert clock["core_share"] == pytest.approx(cpu / wall, rel=1e-12)


def test_on_a_steady_share_the_wall_fit_is_the_cpu_fit_over_it():
    rows = shared_core_steps(lambda i: 0.5)
    out = cpu_clock.with_cpu_clock(cal.fit(rows), rows)
    wall, cpu = out["summary"]["coefficients_s"], out["summary"]["cpu_clock"]["coefficients_s"]
    for term in TRUE:
        assert wall[term] == pytest.approx(2 * cpu[term], rel=1e-9), term
    assert out["summary"]["cpu_clock"]["core_share"] == pytest.approx(0.5)
    assert "the core held 50% of the time" in line(out["summary"])
    # The fit serve-sweep simulates its sweep on, said as such: the CPU clock's terms (half
    # the wall fit's here), the wall clock's error beside.
    said = line(out["summary"], "cpu")
    base = cpu["base_s"] * 1e3
    assert said.startswith(f"engine calibration on the CPU clock ({len(rows)} steps): "
                           f"{significant(base, 3)}±")  # fmt: skip
    assert said.endswith(f"; the core held 50% of the time; the wall clock's fit |error| "
                         f"median {out['summary']['median_abs_error']:.0%})")  # fmt: skip
    assert line(cal.fit(rows)["summary"], "cpu") == line(cal.fit(rows)["summary"])  # no CPU fit


def test_steps_without_cpu_times_have_no_cpu_clock_fit():
    rows = synthetic_steps(60, 0.0)
    out = cal.fit(rows)
    assert cpu_clock.with_cpu_clock(out, rows) is out and cpu_clock.on_cpu_clock(rows) is None
    half = shared_core_steps(lambda i: 0.5)
    half[3]["cpu_ms"] = float("nan")  # one step without: no fit from part of the steps
    share = cpu_clock.core_share(half)
    assert cpu_clock.on_cpu_clock(half) is None and share != share  # NaN


def test_the_cpu_clock_fit_is_read_back_from_json_and_csv(tmp_path):
    import pandas as pd

    rows = shared_core_steps(lambda i: 0.5)
    out = cpu_clock.with_cpu_clock(cal.fit(rows), rows)
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps(out["summary"] | {"conditions": HERE}))
    back = sc.given([path])
    for term in cal.TERMS:
        assert getattr(back["cpu_model"], term) == pytest.approx(getattr(out["cpu_model"], term))
    pd.DataFrame(out["rows"]).to_csv(tmp_path / "step_cost.csv", index=False)
    refit = sc.given([tmp_path / "step_cost.csv"])
    assert refit["cpu_model"].per_decode_token_s == pytest.approx(TRUE["per_decode_token_s"])
    broken = out["summary"] | {"cpu_clock": {"coefficients_s": {"base_s": -1.0}}}
    path.write_text(json.dumps(broken))
    with pytest.raises(UserError, match="cpu_clock"):
        sc.given([path])


def test_the_cpu_clocks_row_block_is_read_back_from_json(tmp_path):
    """A CPU clock fit with row blocks (stairs of four rows in the steps' CPU time) keeps
    its block size in step_cost.json's cpu_clock, and --step-costs reads it back."""
    rows = [r | {"cpu_ms": r["step_ms"], "step_ms": 2 * r["step_ms"]}
            for r in staircase(synthetic_steps(90, 0.0), 4, 6e-3, 3e-3)]  # fmt: skip
    out = cpu_clock.with_cpu_clock(cal.fit(rows), rows)
    assert out["cpu_model"].row_block == 4 and out["summary"]["cpu_clock"]["row_block"] == 4
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps(out["summary"] | {"conditions": HERE}))
    back = sc.given([path])
    assert back["cpu_model"].row_block == 4
    assert back["cpu_model"].per_row_block_s == pytest.approx(6e-3, rel=1e-9)
    broken = out["summary"] | {"cpu_clock": out["summary"]["cpu_clock"] | {"row_block": 2.5}}
    path.write_text(json.dumps(broken))
    with pytest.raises(UserError, match="row_block"):
        sc.given([path])


def test_the_engine_records_each_steps_cpu_time_within_its_wall_time(tiny_model, one_thread):
    from benchbatch.runtime.calibrate import Plan, events, runs

    plan = Plan(slots=3, prompt=12, long_prompt=24, chunk=8, budget=16, decode_steps=2)
    rows = [e for e in events(tiny_model, runs(plan), warm_up=False) if isinstance(e, dict)]
    assert rows and all(0 < r["cpu_ms"] <= r["step_ms"] + 0.01 for r in rows)
    gaps = [r for r in rows if r["gap_ms"] == r["gap_ms"]]
    assert gaps and all(r["gap_cpu_ms"] >= 0 for r in gaps)
    # A gap's two clocks are read at the same boundaries, but over a fraction of a ms the
    # thread's CPU clock may credit work late (tens of us seen here, 2026-12-03): so the CPU
    # time of each run's steps and gaps together is held within the run's wall time.
    for name in {r["calibration"] for r in rows}:
        mine = [r for r in rows if r["calibration"] == name]
        cpu = sum(r["cpu_ms"] + (r["gap_cpu_ms"] if r["gap_ms"] == r["gap_ms"] else 0.0)
                  for r in mine)  # fmt: skip
        wall = sum(r["step_ms"] + (r["gap_ms"] if r["gap_ms"] == r["gap_ms"] else 0.0)
                   for r in mine)  # fmt: skip
        assert 0 < cpu <= wall + 0.1, name
    # A run's first step has no gap before it, on either clock.
    firsts = [r for r in rows if r["step"] == 0]
    assert firsts and all(r["gap_ms"] != r["gap_ms"] for r in firsts)
    assert all(r["gap_cpu_ms"] != r["gap_cpu_ms"] for r in firsts)


def test_serve_sweep_simulates_its_sweep_on_the_cpu_clock(runner, tmp_path):
    """A calibration whose steps held half the core: the sweep is the device's (the CPU
    clock's fit), twice the wall clock's rate at the same latencies; a calibration without
    a CPU clock fit sweeps on its wall clock as before."""
    import pandas as pd

    from benchbatch.app.cli import app
    from benchbatch.runtime.device import cpu_model

    rows = shared_core_steps(lambda i: 0.5)
    out = cpu_clock.with_cpu_clock(cal.fit(rows), rows)
    here = {"device": cpu_model(), "threads": 1, "torch": "x", "load_class": "quiet"}
    runs = {}
    for name, doc in (("shared", out["summary"]), ("wall", cal.fit(rows)["summary"])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc | {"conditions": here}))
        args = ["serve-sweep", "--engine", "sim", "--step-costs", str(path), "--requests",
                "60", "--rates", "max", "--out", str(tmp_path / name)]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        runs[name] = pd.read_csv(tmp_path / name / "serve.csv").set_index("policy")
        meta = json.loads((tmp_path / name / "metadata.json").read_text())
        assert meta.get("sweep_step_costs") == ("cpu clock" if name == "shared" else None)
        said = "the engine held its core 50% of the calibration's wall time"
        assert (said in " ".join(result.output.split())) == (name == "shared")
    ratio = runs["wall"]["duration_s"] / runs["shared"]["duration_s"]
    assert ratio.to_numpy() == pytest.approx(2.0, rel=1e-6)  # every step half the wall's


def test_each_real_point_is_simulated_at_its_own_core_share(runner, tmp_path, monkeypatch):
    """The simulation beside a real point is priced at the share of the core the engine held
    while it served that point: the calibration's CPU-clock fit over the share. The
    continuous point's steps made to read half of their real share: its sim-matched row at
    the max rate (every request at once, so every time scales) lasts exactly its CPU-clock
    simulation (serve.csv's sim row of the same requests) over that share (times the speed
    of the point served before it, priced_speed), and carries it;
    a note names the points under 90% with the calibration's share, and the verdict says
    it was served on a shared core, and what the same requests on a core of their own keep
    within the SLO."""
    import pandas as pd

    from benchbatch.app.cli import app

    real = cpu_clock.core_share

    def share(rows):
        if rows and rows[0].get("policy") == "continuous":
            return 0.5 * real(rows)  # as if another process took half the core meanwhile
        return real(rows)

    monkeypatch.setattr(cpu_clock, "core_share", share)
    out = tmp_path / "real"
    args = ["serve-sweep", "--preset", "tiny", "--requests", "8", "--real-requests", "8",
            "--median", "4", "--max-output", "8", "--prompt-len", "16", "--max-prompt", "64",
            "--rates", "50", "--real-rates", "max", "--threads", "1",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    # a real rate --rates did not name is simulated beside it, said (it was added unsaid)
    assert "--real-rates max not in the simulated rates" in " ".join(result.output.split())
    serve = pd.read_csv(out / "serve.csv")
    top = serve[serve["rate"] == "max"]
    by = {src: top[top["source"] == src].set_index("policy") for src in ("sim", "sim-matched",
                                                                          "real")}  # fmt: skip
    shares = by["real"]["core_share"]
    assert ((shares > 0) & (shares <= 1)).all()
    for policy in ("static", "continuous", "chunked"):
        matched, sim = by["sim-matched"].loc[policy], by["sim"].loc[policy]
        assert matched["step_costs"] == "cpu clock / core share"
        assert matched["core_share"] == shares[policy]
        # times the speed the point served before it ran at (the first: the price's, 1)
        assert matched["duration_s"] == pytest.approx(
            sim["duration_s"] / shares[policy] * matched["priced_speed"], rel=1e-9)
    meta = json.loads((out / "metadata.json").read_text())
    calibrated = meta["real"]["core_shares"]["calibration"]
    assert calibrated == meta["step_cost"]["cpu_clock"]["core_share"]
    assert meta["real"]["core_shares"]["continuous max"] == shares["continuous"]
    assert meta["real"]["step_prices_clock"] == "cpu"
    text = " ".join(result.output.split())
    noted = text.split("while it served (", 1)[1].split(";", 1)[0]
    for policy in ("static", "continuous", "chunked"):
        assert (f"{policy} max req/s" in noted) == (shares[policy] < 0.9)
    assert "continuous max req/s" in noted
    assert "real engine: served on a shared core" in text  # continuous held half of it
    # On a core of its own: the same requests on the CPU clock's prices as they are, which
    # is the sim row of the same requests (the sweep's 8 are the real engine's 8).
    for policy in ("static", "continuous", "chunked"):
        real_row, sim = by["real"].loc[policy], by["sim"].loc[policy]
        assert real_row["whole_core_e2e_p50_s"] == pytest.approx(sim["e2e_p50_s"], rel=1e-9)
        assert bool(real_row["whole_core_within_slo"]) == bool(sim["within_slo"])
    own = text.split("real engine, the same requests on a core of their own", 1)[1]
    assert "within the SLO up to static" in own.split("\n", 1)[0]


def test_the_cpu_price_errors_are_cpu_time_over_the_cpu_price():
    """On the CPU clock a step is its CPU time and its gap's over the CPU fit's price,
    whatever its wall time; rows without a CPU price are left out."""
    rows = [
        {"policy": "a", "active": 1, "decode_tokens": 1, "prefill_tokens": 0, "step_ms": 9.0,
         "gap_ms": 1.0, "cpu_ms": 4.0, "gap_cpu_ms": 0.5, "priced_ms": 5.0,
         "priced_cpu_ms": 3.0},
        {"policy": "a", "active": 1, "decode_tokens": 1, "prefill_tokens": 0, "step_ms": 9.0,
         "cpu_ms": 4.0, "priced_ms": 5.0},
    ]  # fmt: skip
    (cpu,) = pricing.price_errors(rows, clock="cpu")
    assert cpu["steps"] == 1 and cpu["ratio_p50"] == pytest.approx(4.5 / 3.0)
    (wall,) = pricing.price_errors(rows)
    assert wall["steps"] == 2 and wall["ratio_p50"] == pytest.approx(1.9)  # 10/5 and 9/5


def test_the_real_verdict_names_a_shared_core_only_below_ninety_percent():
    """The real engine's verdict says it was served loaded where a point's engine held its
    core under 90% of the time, with the range of the shares; quiet points, simulated
    rows and rows without a core share (a GPU, several threads) say nothing."""
    from benchbatch.app.views.serve import shared_core

    quiet = [{"source": "real", "core_share": v} for v in (0.999, 0.95, 0.9)]
    assert shared_core(quiet) == []
    assert shared_core([{"source": "sim", "core_share": 0.3}, {"source": "real"}]) == []
    loaded = [*quiet, {"source": "real", "core_share": 0.52},
              {"source": "real", "core_share": float("nan")}]  # fmt: skip
    (line,) = shared_core(loaded)
    assert "held it 52%-100% of the time" in line
    (line,) = shared_core([{"source": "real", "core_share": 0.5}])
    assert "held it 50% of the time" in line


def test_the_drift_is_each_calibrations_own_price_over_the_pooled_fits():
    """Two noiseless calibrations, the second of an engine 10% slower (an endpoint's before
    and after a point): each fits its own engine exactly, so their prices of a one-sequence
    decode step stand 1.10 apart, each that step's own cost over the pooled fit's price."""
    first = synthetic_steps(60, 0.0, seed=0)
    second = [r | {"step_ms": 1.1 * r["step_ms"]} for r in synthetic_steps(60, 0.0, seed=1)]
    lone = {"sequences": 1, "decode_tokens": 1, "prefill_tokens": 0, "context_tokens": 100}
    first.insert(0, lone | {"step_ms": 1e3 * true_cost(1, 1, 0, 100)})
    second.insert(0, lone | {"step_ms": 1.1e3 * true_cost(1, 1, 0, 100)})
    own = [cal.fit(part)["model"] for part in (first, second)]
    pooled = cal.fit(first + second)["model"]
    d = pricing.drift([(first, own[0]), (second, own[1])], pooled)
    price = float(cal.design([first[0]])[0] @ np.array(cal.coefficients(pooled)))
    assert d["each"] == pytest.approx([first[0]["step_ms"] / 1e3 / price,
                                       second[0]["step_ms"] / 1e3 / price], rel=1e-9)  # fmt: skip
    assert d["each"][1] / d["each"][0] == pytest.approx(1.1, rel=1e-9)
    assert (d["decode_step_low"], d["decode_step_high"]) == (min(d["each"]), max(d["each"]))
    # A calibration that determined no fit of its own is left out, not guessed.
    assert pricing.drift([(first, own[0]), (second, None)], pooled)["each"] == d["each"][:1]


def test_serve_sweep_json_holds_the_calibration_fit_s_numbers_as_json_numbers(runner, tmp_path):
    """A sweep priced by a fit of engine steps (numpy floats) prints --json: its goodput
    counts were numpy integers (an SLO check on numpy times), which json could not write."""
    import pandas as pd

    from benchbatch.app.cli import app
    from benchbatch.core.metrics import RequestMetrics
    from benchbatch.core.serving import ServingSLO, goodput_count

    slo = ServingSLO(0.5, 0.05)
    m = RequestMetrics(0, *np.array([0.0, 0.1, 0.4]), 4, *np.array([0.1, 0.1, 0.1]))
    assert type(slo.met(m)) is bool and type(goodput_count([m, m], slo)) is int
    steps = tmp_path / "calibration_steps.csv"
    pd.DataFrame(synthetic_steps(90, noise=0.02)).to_csv(steps, index=False)
    out = tmp_path / "run"
    args = ["serve-sweep", "--engine", "sim", "--step-costs", str(steps), "--requests", "40",
            "--rates", "2,max", "--out", str(out), "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    serve = pd.read_csv(out / "serve.csv", dtype={"rate": str})
    assert [r["slo_met"] for r in doc["rows"]] == serve["slo_met"].tolist()
    assert all(type(r["slo_met"]) is int for r in doc["rows"])


def test_the_line_writes_every_term_out_to_its_significant_digits():
    """A term's price and error in digits people read (330, not 3.3e+02), three significant
    digits for the price and two for its error, a term at its bound (0) with its error."""
    s = {
        "samples": 12,
        "coefficients_s": {"base_s": 9.0612e-3, "per_prefill_token_s": 2.0e-4,
                           "per_prompt_pair_s": 0.0, "batched_step_s": 1234.5e-3},
        "std_errors_s": {"base_s": 1.9e-4, "per_prefill_token_s": 8.81e-6,
                         "per_prompt_pair_s": 3.302e-7, "batched_step_s": None},
        "kinds": {"decode": {"median_abs_error": 0.04, "p90_abs_error": 0.11}},
    }  # fmt: skip
    assert line(s) == (
        "engine calibration (12 steps): 9.06±0.19 ms + 0.2±0.0088 ms/prefill tok + "
        "1230±nan ms/batched step + 0±330 ns/prompt pair (|error| median/p90: decode 4%/11%)"
    )


def test_either_fit_is_said_in_its_own_line():
    """calibration_text.step_cost_line: an isolated-step fit (stepcost.cost_summary) in its
    terms and errors, with the steps left out as noise; the engine's calibration (it has
    standard errors) as calibration_text.line says it."""
    from benchbatch.core.calibration_text import step_cost_line
    from benchbatch.core.step_model import StepCostModel
    from benchbatch.core.stepcost import cost_summary

    model = StepCostModel(0.002, 0.0005, 0.00025, 2e-7)
    fitted = [{"used": True, "error": e} for e in (0.01, -0.03, 0.05)]
    fitted.append({"used": False, "error": 0.9})
    said = step_cost_line(cost_summary(model, fitted))
    assert said == (
        "step cost fitted to 3 steps: 2 ms + 0.5 ms/decode token + 0.25 ms/prefill token + "
        "0.2 us/context token (median error 3%, largest 5%; 1 slowed by noise left out)"
    )
    engine = cal.fit(synthetic_steps(90, noise=0.0))["summary"]
    assert step_cost_line(engine) == line(engine) and "calibration (" in line(engine)


@pytest.mark.parametrize("slots, max_context", [(130, 1024), (40, 256), (300, 256), (8, 64)])
def test_the_calibrations_requests_fit_the_context_at_any_slot_count(slots, max_context):
    """Staggered outputs of slots x decode_steps tokens left a negative prompt where that
    passed the context (reproduce --engine real --real-slots 520: a traceback at the end of
    the run): fewer steps a batch, outputs clipped, every request one the engine takes."""
    from benchbatch.runtime.calibrate import plan_for, runs

    plan = plan_for(slots, [64, 200], 128, 256, max_context)
    for run in runs(plan):
        assert run.requests, run.run.name
        for r in run.requests:
            assert r.prompt_tokens >= 1 and r.output_tokens >= 1, (run.run.name, r)
            assert r.prompt_tokens + r.output_tokens <= max_context, (run.run.name, r)
    decode = runs(plan)[0].requests[:slots]
    outputs = [r.output_tokens for r in decode]
    assert outputs == sorted(outputs) and len(set(outputs)) > 1  # still staggered
    if slots < max_context - 1:  # room for every batch size: each one's own steps, none clipped
        assert len(set(outputs)) == slots and decode[0].prompt_tokens >= 1
