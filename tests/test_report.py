"""The reproduction report as pure functions: every article number has its measured
counterpart, and each verdict follows the measured numbers (and flips against them)."""

from __future__ import annotations

import math

import pytest

from benchbatch import report
from benchbatch.probes.phases import summary as phases_summary
from benchbatch.probes.sweep import claim as sweep_claim


def step(phase: str, size: int, step_ms: float, flops: float, status: str = "ok") -> dict:
    batch, tokens = (1, size) if phase == "prefill" else (size, 1)
    label = f"prefill {size}" if phase == "prefill" else f"decode b={size}"
    return {
        "phase": phase,
        "label": label,
        "batch": batch,
        "tokens": tokens,
        "context": 0 if phase == "prefill" else 512,
        "step_ms": step_ms,
        "us_per_token": step_ms * 1e3 / (batch * tokens),
        "tflops": flops / (step_ms / 1e3) / 1e12,
        "mfu": 0.5,
        "mbu": 0.25,
        "bound": "compute" if phase == "prefill" else "memory",
        "status": status,
    }


def article_phases(prompts=(512, 2048), batches=(1, 32)) -> list[dict]:
    """The article's table B: 100.7 MFLOP per token, its step times."""
    per_token = 2 * 12 * 2048**2
    ms = {512: 0.664, 2048: 1.955, 128: 0.2, 1: 0.319, 32: 0.257, 8: 0.25}
    rows = [step("prefill", p, ms[p], per_token * p) for p in prompts]
    return rows + [step("decode", b, ms[b], per_token * b) for b in batches]


def sweep_rows(step_ms: dict[int, float], context: int = 512) -> list[dict]:
    return [
        {
            "context": context,
            "batch": b,
            "label": f"decode b={b}",
            "step_ms": ms,
            "tokens_per_s": b / (ms / 1e3),
            "mbu": 0.3,
            "status": "ok",
        }
        for b, ms in step_ms.items()
    ]


ARTICLE_A_MS = {b: ms for b, (ms, _) in report.ARTICLE_A.items()}


def occupancy_rows(static_steps: int, continuous_steps: int, slots: int = 32) -> list[dict]:
    tokens = 0.203 * 9602 * 32
    return [
        {
            "policy": p,
            "slots": slots,
            "total_steps": s,
            "occupancy": tokens / (s * slots),
            "speedup_vs_static": static_steps / s,
        }
        for p, s in (("static", static_steps), ("continuous", continuous_steps))
    ]


def build(phases=None, sweep=None, occupancy=None, real=None) -> report.Report:
    phases = article_phases() if phases is None else phases
    sweep = sweep_rows(ARTICLE_A_MS) if sweep is None else sweep
    occupancy = occupancy_rows(9602, 2445) if occupancy is None else occupancy
    return report.build(
        title="t",
        notices=[],
        facts=[("device", "synthetic")],
        phases_rows=phases,
        phases_summary=phases_summary(phases),
        sweep_rows=sweep,
        sweep_claim=sweep_claim(sweep),
        occupancy_rows=occupancy,
        occupancy_workload="synthetic",
        real_rows=real,
        real_workload="synthetic" if real else None,
        files=["phases.png", "sweep.png", "occupancy.png"],
    )


def verdicts(rep: report.Report) -> dict[str, str]:
    return {f"{c.key}: {c.claim}": c.verdict for c in rep.claims}


# --- every article number has a measured counterpart ------------------------------------------


def test_table_b_has_the_four_article_rows_with_their_measured_steps():
    entries = report.table_b(article_phases())
    assert [e["article"].label for e in entries] == [
        "prefill 512", "prefill 2048", "decode b=1", "decode b=32"
    ]  # fmt: skip
    assert [e["measured"]["label"] for e in entries] == [
        "prefill 512", "prefill 2048", "decode b=1", "decode b=32"
    ]  # fmt: skip
    article = [
        (e["article"].step_ms, e["article"].us_per_token, e["article"].tflops) for e in entries
    ]
    assert article == [
        (0.664, 1.3, 77.6),
        (1.955, 1.0, 105.5),
        (0.319, 318.9, 0.3),
        (0.257, 8.0, 12.6),
    ]


def test_cpu_sized_prompts_pair_by_rank_and_say_so():
    rows = article_phases(prompts=(128, 512), batches=(1, 8))
    entries = report.table_b(rows)
    assert [e["measured"]["label"] for e in entries] == [
        "prefill 128", "prefill 512", "decode b=1", "decode b=8"
    ]  # fmt: skip
    section = build(phases=rows).sections[0]
    assert any("paired by rank" in p for p in section.intro)
    assert len(section.rows) == 4


def test_pair_sizes():
    assert report.pair_sizes([512, 2048], [2048, 512, 128]) == [512, 2048]
    assert report.pair_sizes([512, 2048], [128, 512]) == [128, 512]
    assert report.pair_sizes([1, 32], [1, 4, 16]) == [1, 16]
    assert report.pair_sizes([512, 2048], [1024]) == [1024, None]  # a tie goes to the first
    assert report.pair_sizes([512, 2048], [1500]) == [None, 1500]
    assert report.pair_sizes([512, 2048], [300]) == [300, None]
    assert report.pair_sizes([512, 2048], []) == [None, None]


def test_a_raised_ceiling_is_said_in_the_roofline_section():
    probe = {
        "measured": {"dtype": "fp32", "peak_tflops": 0.134, "peak_gbps": 43.0, "ridge": 3.1,
                     "tflops_source": "prefill 2048 (over the probe)", "gbps_source": "read"},
        "datasheet": None,
    }  # fmt: skip
    raised = [{"ceiling": "matmul", "unit": "TFLOP/s", "from": 0.1, "to": 0.134,
               "by": "prefill 2048"}]  # fmt: skip
    section = report._section_roofline(probe, "roofline.png", raised)
    assert section.rows[0][:2] == ["matmul GFLOP/s", "134"]  # a CPU's rate in GFLOP/s
    assert "raised from 0.1 to 0.134 TFLOP/s: prefill 2048 reached it" in section.notes[0]
    assert not report._section_roofline(probe, None).notes


def test_a_verdict_resting_on_noisy_rows_says_so_beside_it():
    rows = article_phases()
    rows[2] = {**rows[2], "noisy": True, "cv": 0.14}  # decode b=1
    sweep = [{**r, "noisy": r["batch"] == 256, "cv": 0.3} for r in sweep_rows(ARTICLE_A_MS)]
    rep = build(phases=rows, sweep=sweep)
    prefill, batching, latency, occupancy = rep.claims
    assert prefill.caveat == "rests on noisy decode b=1 (CV 14%)"
    assert batching.caveat == "rests on noisy decode b=1 (CV 14%)"
    assert latency.caveat == "rests on noisy decode b=256 (CV 30%)"
    assert occupancy.caveat == ""  # a simulation
    assert prefill.verdict == report.HOLDS  # the verdict itself still follows the numbers
    text = report.to_markdown(rep)
    assert "| holds (rests on noisy decode b=1 (CV 14%)) |" in text
    rows[3] = {**rows[3], "throttled": True}
    assert "throttled decode b=32" in build(phases=rows).claims[1].caveat
    assert all(not c.caveat for c in build().claims)


def test_the_real_engines_verdict_says_when_its_steps_were_uneven():
    real = [
        {"policy": "static", "total_steps": 900, "occupancy": 0.3, "wall_s": 9.0,
         "speedup_vs_static": 1.0, "median_step_ms": 10.0, "p90_step_ms": 31.0},
        {"policy": "continuous", "total_steps": 300, "occupancy": 0.9, "wall_s": 3.6,
         "speedup_vs_static": 2.5, "median_step_ms": 12.0, "p90_step_ms": 13.0},
    ]  # fmt: skip
    claim = build(real=real).claims[-1]
    assert claim.caveat == "rests on uneven steps: static (p90 step 3.1x the median)"


def test_a_missing_or_failed_step_is_shown_as_such():
    rows = article_phases()
    rows[3] = {**rows[3], "status": "oom", "step_ms": math.nan, "tflops": math.nan}
    section = build(phases=rows).sections[0]
    assert section.rows[3][1] == "decode b=32" and section.rows[3][-1] == "oom"
    rows = [r for r in article_phases() if r["phase"] == "decode"]
    section = build(phases=rows).sections[0]
    assert [r[1] for r in section.rows[:2]] == ["not measured", "not measured"]


def test_table_a_has_every_article_batch_and_the_measured_ones():
    measured = {1: 10.0, 8: 20.0, 32: 40.0, 64: 80.0}
    entries = report.table_a(sweep_rows(measured))
    assert [e["batch"] for e in entries] == [1, 8, 32, 64, 128, 256]
    by = {e["batch"]: e for e in entries}
    for batch, (ms, tps) in report.ARTICLE_A.items():
        assert by[batch]["article_step_ms"] == ms and by[batch]["article_tokens_per_s"] == tps
    assert by[64]["article_step_ms"] is None and by[64]["measured"]["step_ms"] == 80.0
    assert by[128]["measured"] is None
    section = build(sweep=sweep_rows(measured)).sections[1]
    assert section.headers[1:] == [f"batch {b}" for b in (1, 8, 32, 64, 128, 256)]
    assert section.rows[1][1:] == ["10", "20", "40", "80", "-", "-"]


def test_table_a_reads_the_article_context_when_measured():
    rows = sweep_rows({1: 1.0, 8: 2.0}, context=128) + sweep_rows({1: 3.0, 8: 4.0}, context=512)
    assert report.sweep_context(rows) == 512
    assert report.table_a(rows)[0]["measured"]["step_ms"] == 3.0
    assert report.sweep_context(sweep_rows({1: 1.0}, context=64)) == 64


def test_table_c_has_both_policies_beside_the_article():
    entries = report.table_c(occupancy_rows(10089, 2576))
    assert [(e["policy"], e["article_total_steps"], e["article_occupancy"]) for e in entries] == [
        ("static", 9602, 0.203),
        ("continuous", 2445, 0.799),
    ]
    assert entries[1]["measured"]["total_steps"] == 2576
    section = build(occupancy=occupancy_rows(10089, 2576)).sections[2]
    assert section.rows[1][1] == "2,445 / 2,576"
    assert section.rows[1][3].startswith("3.93x / 3.92")


# --- verdicts --------------------------------------------------------------------------------


def test_the_article_own_numbers_hold_every_claim():
    rep = build()
    assert [c.verdict for c in rep.claims] == [report.HOLDS] * 4
    rows = {r["label"]: r for r in article_phases()}
    gap = rows["prefill 2048"]["tflops"] / rows["decode b=1"]["tflops"]
    cheaper = rows["decode b=1"]["us_per_token"] / rows["decode b=32"]["us_per_token"]
    assert rep.claims[0].measured == f"{gap:.3g}x (prefill 2048 over decode b=1)"
    assert rep.claims[1].measured == f"{cheaper:.3g}x cheaper (batch 1 to 32)"
    assert rep.claims[2].measured.startswith("throughput x223, step time x1.15")
    assert rep.claims[3].measured.startswith("occupancy 20.3% vs 79.7%, 3.93x")


def test_verdicts_flip_when_the_numbers_contradict_the_claims():
    # Decode as fast per FLOP as prefill; batching that makes steps 32x longer; static and
    # continuous the same.
    per_token = 2 * 12 * 2048**2
    flat = [
        step("prefill", 512, 1.0, per_token * 512),
        step("prefill", 2048, 4.0, per_token * 2048),
        step("decode", 1, 1.0, per_token),
        step("decode", 32, 32.0, per_token * 32),  # each token as dear as alone
    ]
    flat[2]["tflops"] = flat[0]["tflops"]  # decode reaches prefill's rate
    slow = sweep_rows({1: 1.0, 8: 8.0, 32: 32.0, 128: 128.0, 256: 256.0})
    rep = build(phases=flat, sweep=slow, occupancy=occupancy_rows(1000, 1000))
    assert [c.verdict for c in rep.claims] == [report.FAILS] * 4


def test_partly_between_the_thresholds():
    assert report.PREFILL_RULE.verdict(10.0) == report.HOLDS
    assert report.PREFILL_RULE.verdict(9.9) == report.PARTLY
    assert report.PREFILL_RULE.verdict(1.9) == report.FAILS
    assert report.PREFILL_RULE.verdict(None) == report.UNMEASURED
    assert report.PREFILL_RULE.verdict(math.nan) == report.UNMEASURED
    assert report.SPEEDUP_RULE.verdict(1.5) == report.PARTLY
    # Batch 1 -> 32: holds at 8x (a quarter of perfect batching), partly from 1.25x.
    assert report.batching_verdict(8.0, 32) == report.HOLDS
    assert report.batching_verdict(3.2, 32) == report.PARTLY
    assert report.batching_verdict(1.1, 32) == report.FAILS
    assert report.batching_verdict(2.0, 4) == report.HOLDS  # at least 2x, whatever the batch
    # Throughput vs latency: holds while the step at most doubles.
    assert report.latency_verdict(223, 1.15) == report.HOLDS
    assert report.latency_verdict(64 / 3, 3.0) == report.PARTLY
    assert report.latency_verdict(3.2, 20.0) == report.FAILS


def test_claims_without_measurements_say_so():
    claims = report.claims(None, None, None)
    assert [c.verdict for c in claims] == [report.UNMEASURED] * 4
    assert all(c.measured == "not measured" for c in claims)


def test_real_engine_rows_add_a_claim_of_their_own():
    real = [
        {"policy": "static", "total_steps": 900, "occupancy": 0.3, "wall_s": 9.0,
         "tokens_per_s": 30.0, "speedup_vs_static": 1.0},
        {"policy": "continuous", "total_steps": 300, "occupancy": 0.9, "wall_s": 3.6,
         "tokens_per_s": 75.0, "speedup_vs_static": 2.5},
    ]  # fmt: skip
    rep = build(real=real)
    assert rep.claims[-1].key == "C, real engine" and rep.claims[-1].verdict == report.HOLDS
    real_section = rep.sections[3]
    assert real_section.title == "C on the real engine"
    assert real_section.rows[1] == ["continuous", "300", "90.0%", "3.6", "75", "2.5x"]
    assert not real_section.notes
    real[1]["measured_over_sim"] = 4.4
    assert "continuous x4.40" in build(real=real).sections[3].notes[0]


# --- rendering -------------------------------------------------------------------------------


def test_markdown_sets_every_article_number_beside_a_measured_one():
    text = report.to_markdown(build())
    for number in ("0.664", "1.96", "0.319", "0.257", "77.6", "106", "318.9", "12.6"):
        assert number in text, number
    for number in ("3,120", "32,971", "130,006", "561,933", "696,195", "9,602", "2,445"):
        assert number in text, number
    assert "20.3%" in text and "79.9%" in text and "3.93x" in text
    assert text.count("| holds |") == 4
    assert "![B. Prefill vs decode, one step each](phases.png)" in text
    assert "## Verdicts" in text


def test_html_inlines_the_plots_and_escapes_text():
    rep = build()
    rep.notices.append("CPU-sized <run>")
    page = report.to_html(rep, {"phases.png": b"\x89PNG-phases", "sweep.png": b"PNG-sweep"})
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert page.count("data:image/png;base64,") == 2  # occupancy.png was not given
    assert "CPU-sized &lt;run&gt;" in page
    assert page.count('class="v-holds"') == 4


@pytest.mark.parametrize("verdict", [report.HOLDS, report.PARTLY, report.FAILS, report.UNMEASURED])
def test_every_verdict_has_a_style(verdict):
    assert verdict in report.VERDICT_CLASS
