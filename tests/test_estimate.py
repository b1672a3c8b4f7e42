"""Before a long run, an estimate: two small steps price the plan; a long one comes with the
lists to shorten."""

from __future__ import annotations

import json

import pytest

from benchbatch.app.cli import app
from benchbatch.core import accounting
from benchbatch.core.config import preset
from benchbatch.runtime import estimate, steps
from benchbatch.runtime.timing import TimingOptions

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_step_is_priced_as_timing_calls_it():
    opts = TimingOptions(min_repeats=5, min_time_s=0.2, warmup=2, warmup_s=0.05)
    # 10 ms: the warm-up runs 0.05 s (5 calls), the repeats 0.2 s (20 calls).
    assert estimate.call_s(0.01, opts) == pytest.approx(25 * 0.01)
    # 1 s: two warm-up calls, five repeats (min_time is reached after one).
    assert estimate.call_s(1.0, opts) == pytest.approx(7.0)


def test_rates_give_both_timed_steps_their_time_and_price_the_rest():
    cfg = preset("tiny")
    d = accounting.step_cost(cfg, "fp32", 1, 1, 100)
    p = accounting.step_cost(cfg, "fp32", 1, 32, 0)
    per_flop, per_byte = 1e-9, 1e-8
    t_d, t_p = d.flops * per_flop + d.bytes * per_byte, p.flops * per_flop + p.bytes * per_byte
    assert estimate.solve((d.flops, d.bytes, t_d), (p.flops, p.bytes, t_p)) == pytest.approx(
        (per_flop, per_byte)
    )
    rates = estimate.Rates(per_flop, per_byte, t_d * 1e3, t_p * 1e3, 32, 100)
    assert rates.step_s(cfg, "fp32", steps.decode(1, 100)) == pytest.approx(t_d)
    assert rates.step_s(cfg, "fp32", steps.prefill(1, 32)) == pytest.approx(t_p)
    assert rates.step_s(cfg, "fp32", steps.prefill(1, 64)) > 1.5 * t_p
    # Noise that would make a cost negative: each step on what bounds it.
    assert estimate.solve((d.flops, d.bytes, 1.0), (p.flops, p.bytes, 1.0)) == (
        1.0 / p.flops,
        1.0 / d.bytes,
    )


def test_shorter_drops_the_costliest_values_first_and_keeps_what_claims_need():
    lists = {"prefill": (512, 2048), "decode_batch": (1, 8, 32)}
    cost = {512: 10, 2048: 100, 1: 1, 8: 2, 32: 50}

    def seconds(ls):
        return sum(cost[v] for values in ls.values() for v in values)

    cut = estimate.shorter(lists, {"decode_batch": 2}, seconds, 20)
    assert cut.lists == {"prefill": (512,), "decode_batch": (1, 8)} and cut.seconds == 13
    assert estimate.shorter(lists, {}, seconds, 1000) is None  # fits already
    stuck = estimate.shorter({"prefill": (2048,)}, {}, seconds, 20)
    assert stuck is None  # nothing may go


def test_a_long_run_is_announced_with_a_shorter_one(runner, tmp_path, monkeypatch):
    slow = estimate.Rates(1e-4, 1e-4, 50.0, 900.0, 64, 24)  # 10 kFLOP/s, 10 kB/s: hours
    monkeypatch.setattr(estimate, "measure_rates", lambda *args: slow)
    out = tmp_path / "run"
    args = ["phases", "--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device",
            "cpu", "--no-roofline", "--prefill", "16,32", "--decode-batch", "1,4",
            "--context", "24", "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())
    assert "estimated duration: about" in err and "for 4 steps" in err
    assert "that is long; for a shorter run, the same command with --prefill 16 (about" in err
    meta = json.loads((out / "metadata.json").read_text())
    e = meta["estimate"]
    assert e["steps"] == 4 and e["estimated_s"] > 180
    assert e["shorter"]["lists"]["prefill"] == [16]
    assert e["shorter"]["estimated_s"] < e["estimated_s"]


def test_measured_rates_come_from_two_small_steps(tiny_model):
    rates = estimate.measure_rates(tiny_model, "fp32", 24)
    assert rates.decode_ms > 0 and rates.prefill_ms > 0 and rates.context == 24
    assert rates.prefill_tokens == estimate.PREFILL_TOKENS
    for step, ms in ((steps.decode(1, 24), rates.decode_ms),
                     (steps.prefill(1, rates.prefill_tokens), rates.prefill_ms)):  # fmt: skip
        priced = rates.step_s(tiny_model.cfg, "fp32", step)
        assert priced == pytest.approx(ms / 1e3) or priced >= ms / 1e3  # exact, or errs long
