"""The core's wake: a step after the engine waited idle costs more (core/wake.py). Its fit
recovers a synthetic engine's wake, the steady fit is the same with or without the woken
steps, the timed simulation and a real step's price charge it where a brute-force
reference says, a saved calibration keeps it, and the engine records its waits."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from benchbatch.core import calibration as cal
from benchbatch.core import pricing, wake
from benchbatch.core import saved_calibration as sc
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import simulate_timed
from benchbatch.core.step_model import WAKE_CAP_S, WAKE_MIN_S, StepCostModel
from benchbatch.core.workload import Request
from benchbatch.errors import UserError
from tests.test_calibration import TRUE, synthetic_steps, true_cost

WAITS = (0.03, 0.1, 0.3, 1.0, 0.03, 0.1, 0.3, 1.0)


def woken_rows(wake_s: float, power: float, prompt: int = 128) -> list[dict]:
    """Lone prefills of `prompt` tokens after each of WAITS, each costing TRUE's price plus
    wake_s x wait^power (no noise)."""
    t = true_cost(1, 0, prompt, 0)
    return [{"sequences": 1, "decode_tokens": 0, "prefill_tokens": prompt, "context_tokens": 0,
             "idle_ms": 1e3 * w, "step_ms": 1e3 * (t + wake_s * w**power)}
            for w in WAITS]  # fmt: skip


@pytest.mark.parametrize("power", wake.WAKE_POWERS)
def test_the_fit_recovers_a_synthetic_engines_wake_exactly(power):
    rows = synthetic_steps(90, noise=0.0) + woken_rows(0.02, power)
    out = cal.fit(rows)
    model = out["model"]
    assert model.wake_s == pytest.approx(0.02, rel=1e-9)
    assert model.wake_power == power
    for term, value in TRUE.items():  # the woken steps do not move the steady terms
        assert getattr(model, term) == pytest.approx(value, rel=1e-9), term
    assert out["summary"]["wake_ms"] == pytest.approx(20.0, rel=1e-9)
    assert out["summary"]["wake"]["woken_steps"] == len(WAITS)
    assert max(abs(r["error"]) for r in out["rows"]) < 1e-9  # woken rows priced with it


def test_the_steady_fit_is_the_same_with_or_without_the_woken_steps():
    """Noisy steady steps: the woken ones (far dearer than their price) are left out of
    the linear terms' fit, not averaged into them."""
    steady = synthetic_steps(120, noise=0.05, seed=3)
    alone = cal.fit(steady)["summary"]["coefficients_s"]
    both = cal.fit(steady + woken_rows(0.05, 0.5))["summary"]["coefficients_s"]
    assert both == pytest.approx(alone, rel=1e-12)


def test_the_wakes_standard_error_covers_a_noisy_wake():
    rng = np.random.default_rng(7)
    t = true_cost(1, 0, 128, 0)
    rows = [{"idle_ms": 1e3 * w, "step_ms": 1e3 * (t + 0.02 * w**0.5)
             + rng.normal(0, 0.5)} for w in WAITS * 4]  # fmt: skip
    got = wake.fit_wake(rows, [1e3 * t] * len(rows))
    assert got["wake_power"] == 0.5
    assert abs(got["wake_s"] - 0.02) < 3 * got["wake_std_error_s"]
    assert got["wake_std_error_s"] < 0.002


def test_too_few_woken_steps_fit_no_wake_and_no_waits_none():
    t = true_cost(1, 0, 128, 0)
    few = woken_rows(0.02, 0.5)[: wake.MIN_WOKEN - 1]
    assert wake.fit_wake(few, [1e3 * t] * len(few))["wake_s"] == 0.0
    out = cal.fit(synthetic_steps(60, 0.0))
    assert out["model"].wake_s == 0.0 and "wake" not in out["summary"]
    assert wake.idle_s({"idle_ms": math.nan}) == 0.0 and wake.idle_s({}) == 0.0
    assert wake.idle_s({"idle_ms": 250.0}) == 0.25


def test_a_wait_shorter_than_the_calibrations_shortest_is_priced_in_proportion():
    """Below WAKE_MIN_S (the shortest wait the calibration measures) the price falls in
    proportion to the wait, to 0 at none: a loop that found its next request already due
    (a wait of microseconds) pays next to nothing, not the power law's 5-20%."""
    at_min = MODEL.woken_s(WAKE_MIN_S)
    assert at_min == pytest.approx(0.03 * WAKE_MIN_S**0.5)
    assert MODEL.woken_s(WAKE_MIN_S / 3) == pytest.approx(at_min / 3)
    assert MODEL.woken_s(1e-6) < 1e-4 * at_min and MODEL.woken_s(0.0) == 0.0
    rows = [{"idle_ms": 1e3 * w, "step_ms": 1e3 * (1e-3 + MODEL.woken_s(w))}
            for w in (0.001, 0.01, 0.02, *WAITS)]  # fmt: skip
    got = wake.fit_wake(rows, [1.0] * len(rows))  # the short waits fitted on the same shape
    assert got["wake_s"] == pytest.approx(0.03, rel=1e-9) and got["wake_power"] == 0.5


def test_a_wake_never_goes_negative():
    """Steps after a wait that ran faster than their price fit no negative wake."""
    t = true_cost(1, 0, 128, 0)
    rows = [{"idle_ms": 1e3 * w, "step_ms": 1e3 * t * 0.9} for w in WAITS]
    assert wake.fit_wake(rows, [1e3 * t] * len(rows))["wake_s"] == 0.0


MODEL = StepCostModel(base_s=1e-3, per_decode_token_s=2e-3, per_prefill_token_s=1e-4,
                      wake_s=0.03, wake_power=0.5)  # fmt: skip


def brute_force(requests, arrivals, model):
    """One request at a time on an engine that is idle between them (each arrives after the
    one before has finished): its prefill step, then its decodes, the prefill after a wait
    of (arrival - the engine's last end) costing model.woken_s(wait) more."""
    ends, out = 0.0, []
    for r, a in zip(requests, arrivals, strict=True):
        start = max(a, ends)
        prefill = model.base_s + model.per_prefill_token_s * r.prompt_tokens
        first = start + prefill + model.woken_s(start - ends)
        decode = model.base_s + model.per_decode_token_s
        ends = first + decode * (r.output_tokens - 1)
        out.append((first - a, ends - a))
    return out


def test_the_timed_simulation_charges_the_wake_to_the_first_step_after_each_wait():
    requests = [Request(i, 20, 3) for i in range(4)]
    arrivals = [0.0, 0.5, 0.52, 3.0]  # the third arrives while the second runs: no wait
    sched = make_scheduler("continuous", 1)
    sim = simulate_timed(requests, arrivals, sched, MODEL)
    expected = brute_force(requests, arrivals, MODEL)
    ttft = [m.ttft for m in sorted(sim.metrics.requests, key=lambda m: m.request_id)]
    assert ttft == pytest.approx([e[0] for e in expected], rel=1e-9)
    assert ttft[0] == pytest.approx(MODEL.base_s + 20 * MODEL.per_prefill_token_s)  # no wait
    # a wait longer than WAKE_CAP_S is priced as that one
    assert ttft[3] == pytest.approx(MODEL.base_s + 20 * MODEL.per_prefill_token_s
                                    + 0.03 * WAKE_CAP_S**0.5)  # fmt: skip
    plain = simulate_timed(requests, arrivals, make_scheduler("continuous", 1),
                           StepCostModel(1e-3, 2e-3, 1e-4))  # fmt: skip
    plain_ttft = [m.ttft for m in sorted(plain.metrics.requests, key=lambda m: m.request_id)]
    assert plain_ttft[1] == pytest.approx(ttft[1] - MODEL.woken_s(0.5 - expected[0][1]))


def test_a_real_steps_price_adds_the_wake_after_a_wait():
    row = {"active": 1, "decode_tokens": 0, "prefill_tokens": 20, "context_tokens": 0}
    steady = pricing.price_ms(MODEL, row)
    assert steady == pytest.approx(1e3 * (1e-3 + 20e-4))
    assert pricing.price_ms(MODEL, row | {"idle_ms": math.nan}) == pytest.approx(steady)
    assert pricing.price_ms(MODEL, row | {"idle_ms": 250.0}) == pytest.approx(
        steady + 1e3 * 0.03 * 0.25**0.5)
    assert MODEL.scaled(2.0).woken_s(0.25) == pytest.approx(2 * MODEL.woken_s(0.25))
    assert MODEL.scaled(2.0).wake_power == 0.5


def test_a_saved_calibration_keeps_its_wake(tmp_path):
    out = cal.fit(synthetic_steps(60, 0.0) + woken_rows(0.02, 0.75))
    path = tmp_path / "step_cost.json"
    path.write_text(json.dumps(out["summary"]))
    back = sc.given([path])["model"]
    assert back.wake_s == pytest.approx(0.02) and back.wake_power == 0.75
    import pandas as pd

    pd.DataFrame(out["rows"]).to_csv(tmp_path / "step_cost.csv", index=False)
    refit = sc.given([tmp_path / "step_cost.csv"])["model"]  # the rows keep their waits
    assert refit.wake_s == pytest.approx(0.02, rel=1e-9) and refit.wake_power == 0.75
    path.write_text(json.dumps(out["summary"] | {"wake_power": -1}))
    with pytest.raises(UserError, match="wake_power"):
        sc.given([path])


def test_the_serving_calibration_has_wake_runs_and_the_others_none():
    from benchbatch.runtime import calibrate as cb

    plan = cb.plan_for(4, [16, 16, 40], 16, 24, 512, decode_steps=2)
    names = [c.run.name for c in cb.runs(plan)]
    assert "wake" not in names
    woken = [c for c in cb.runs(plan, wake=True) if c.run.name == "wake"]
    assert len(woken) == cb.WAKE_ROUNDS * len(cb.WAKE_IDLES_S)
    assert sorted(c.run.arrivals_s[0] for c in woken) == sorted(cb.WAKE_IDLES_S * cb.WAKE_ROUNDS)
    assert all(len(c.requests) == 1 and c.requests[0].prompt_tokens == 16 for c in woken)


def test_the_engine_records_the_wait_before_a_step(tiny_model, one_thread):
    """A request arriving 0.3 s after the run starts: the engine has nothing to run until
    then, so its first step follows a wait, recorded; the steps after it follow none (0.3 s:
    far past what a loaded machine keeps the thread from looking)."""
    from benchbatch.runtime.runs import EngineRun, Finished, engine_events

    run = EngineRun("wake", 2, arrivals_s=[0.3])
    rows = [e for e in engine_events(tiny_model, [Request(0, 8, 3)], [run], 0)
            if not isinstance(e, Finished)]  # fmt: skip
    assert len(rows) == 3
    assert rows[0]["idle_ms"] > 0
    assert all(math.isnan(r["idle_ms"]) for r in rows[1:])
    queued = EngineRun("queued", 2)  # every request queued at once: no wait at all
    rows = [e for e in engine_events(tiny_model, [Request(0, 8, 3)], [queued], 0)
            if not isinstance(e, Finished)]  # fmt: skip
    assert all(math.isnan(r["idle_ms"]) for r in rows)


def test_the_calibrations_line_says_its_wake_with_its_error():
    from benchbatch.core.calibration_text import line

    rows = synthetic_steps(60, 0.0) + woken_rows(0.02, 0.5)
    rows = [r | {"cpu_ms": r["step_ms"]} for r in rows]
    from benchbatch.core.cpu_clock import with_cpu_clock

    out = with_cpu_clock(cal.fit(rows), rows)
    for clock in ("wall", "cpu"):
        said = line(out["summary"], clock)
        assert re.search(r" \+ 20±[0-9.e-]+ ms x \(idle s\)\^0\.5 after an idle wait", said)
    assert "idle wait" not in line(cal.fit(synthetic_steps(60, 0.0))["summary"])
