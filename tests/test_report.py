"""The reproduction report as pure functions: every article number has its measured
counterpart, and each verdict follows the measured numbers (and flips against them)."""

from __future__ import annotations

import math

import pytest

from benchbatch.experiments.phases.probe import summary as phases_summary
from benchbatch.experiments.sweep.probe import claim as sweep_claim
from benchbatch.output import report


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


def test_table_b_reads_its_decodes_at_the_context_its_verdicts_compare():
    """With decodes at two contexts, table B showed one context's rows (the last written)
    and the verdicts the other's: both read the smallest now, and the section names it."""
    rows = article_phases()
    later = [r | {"context": 1024, "step_ms": r["step_ms"] * 3, "label": r["label"]}
             for r in rows if r["phase"] == "decode"]  # fmt: skip
    mixed = rows + later  # the larger context written last
    entries = report.table_b(mixed)
    assert [e["measured"]["context"] for e in entries if e["article"].phase == "decode"] == [
        512, 512]  # fmt: skip
    assert report.decode_context(mixed) == 512
    section = build(phases=mixed).sections[0]
    assert any("decode steps are at context 512" in p and "1,024 are in phases.csv" in p
               for p in section.intro)  # fmt: skip
    alone = build(phases=rows)
    assert verdicts(alone) == verdicts(build(phases=mixed))  # the same steps judged


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
    section = report.section_roofline(probe, "roofline.png", raised)
    assert section.rows[0][:2] == ["matmul GFLOP/s", "134"]  # a CPU's rate in GFLOP/s
    assert "raised from 0.1 to 0.134 TFLOP/s: prefill 2048 reached it" in section.notes[0]
    assert not report.section_roofline(probe, None).notes


def test_a_verdict_resting_on_noisy_rows_says_so_beside_it():
    rows = article_phases()
    rows[2] = {**rows[2], "noisy": True, "cv": 0.14}  # decode b=1
    sweep = [{**r, "noisy": r["batch"] == 256, "cv": 0.3} for r in sweep_rows(ARTICLE_A_MS)]
    rep = build(phases=rows, sweep=sweep)
    prefill, batching, latency, occupancy = rep.claims
    # each row named with its table: phases' decode b=1 and sweep's are two rows
    assert prefill.caveat == "rests on noisy phases decode b=1 (CV 14%)"
    assert batching.caveat == "rests on noisy phases decode b=1 (CV 14%)"
    assert latency.caveat == "rests on noisy sweep decode b=256 (CV 30%)"
    assert occupancy.caveat == ""  # a simulation
    assert prefill.verdict == report.HOLDS  # the verdict itself still follows the numbers
    text = report.to_markdown(rep)
    assert "| holds (rests on noisy phases decode b=1 (CV 14%)) |" in text
    rows[3] = {**rows[3], "throttled": True}
    assert "throttled phases decode b=32" in build(phases=rows).claims[1].caveat
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


def below(x: float) -> float:
    """The largest float under x: a threshold moved by any amount lands between the two."""
    return math.nextafter(x, -math.inf)


def above(x: float) -> float:
    return math.nextafter(x, math.inf)


# The documented thresholds (README, report text), written out: a test that read them from
# the code it tests could not notice one being moved.
PREFILL_HOLDS, PREFILL_PARTLY = 10.0, 2.0
SPEEDUP_HOLDS, SPEEDUP_PARTLY = 2.0, 1.2


def test_the_rules_state_the_documented_thresholds():
    assert (report.PREFILL_RULE.holds, report.PREFILL_RULE.partly) == (10.0, 2.0)
    assert (report.SPEEDUP_RULE.holds, report.SPEEDUP_RULE.partly) == (2.0, 1.2)
    assert report.PREFILL_RULE.text == "holds at 10x or more, partly at 2x or more"
    assert report.SPEEDUP_RULE.text == "holds at 2x or more, partly at 1.2x or more"
    assert (report.BATCHING_FRACTION, report.BATCHING_MIN_HOLDS) == (0.25, 2.0)
    assert report.BATCHING_MIN_PARTLY == 1.25
    assert "a quarter of perfect batching" in report.BATCHING_RULE_TEXT
    assert "at least 2x cheaper; partly when at least 1.25x" in report.BATCHING_RULE_TEXT
    assert (report.LATENCY_HOLDS, report.THROUGHPUT_OVER_LATENCY) == (2.0, 2.0)
    assert "at most doubled" in report.LATENCY_RULE_TEXT
    assert report.UNEVEN_STEPS == 1.5


@pytest.mark.parametrize(
    ("rule", "holds", "partly"),
    [
        (report.PREFILL_RULE, PREFILL_HOLDS, PREFILL_PARTLY),
        (report.SPEEDUP_RULE, SPEEDUP_HOLDS, SPEEDUP_PARTLY),
    ],
    ids=["prefill", "speedup"],
)
def test_a_rule_flips_exactly_at_its_thresholds(rule, holds, partly):
    for h, p in ((holds, partly), (rule.holds, rule.partly)):  # documented, and as coded
        assert rule.verdict(above(h)) == report.HOLDS
        assert rule.verdict(h) == report.HOLDS
        assert rule.verdict(below(h)) == report.PARTLY
        assert rule.verdict(p) == report.PARTLY
        assert rule.verdict(below(p)) == report.FAILS
    assert rule.verdict(None) == report.UNMEASURED
    assert rule.verdict(math.nan) == report.UNMEASURED
    assert rule.verdict(math.inf) == report.UNMEASURED


def test_batching_flips_at_a_quarter_of_perfect_and_at_2x_and_1_25x():
    v = report.batching_verdict
    # Batch 1 -> 32: a quarter of perfect batching is 8x; it is more than the 2x floor.
    assert v(8.0, 32) == report.HOLDS and v(below(8.0), 32) == report.PARTLY
    # Batch 1 -> 4: a quarter is 1x, so the 2x floor decides.
    assert v(2.0, 4) == report.HOLDS and v(below(2.0), 4) == report.PARTLY
    # Batch 1 -> 8: a quarter is exactly 2x, the floor as well.
    assert v(2.0, 8) == report.HOLDS and v(below(2.0), 8) == report.PARTLY
    # Partly from 1.25x, whatever the batch.
    for batch_ratio in (4, 32):
        assert v(1.25, batch_ratio) == report.PARTLY
        assert v(below(1.25), batch_ratio) == report.FAILS
    assert v(math.nan, 32) == report.UNMEASURED


def test_throughput_over_latency_flips_at_twice_as_fast_and_a_doubled_step():
    v = report.latency_verdict
    # The step at most doubled: holds when throughput grew at least twice as fast.
    assert v(3.0, 1.5) == report.HOLDS and v(below(3.0), 1.5) == report.FAILS
    assert v(4.0, 2.0) == report.HOLDS
    assert v(5.0, above(2.0)) == report.PARTLY  # the step more than doubled
    # Beyond a doubled step: partly while throughput still grew twice as fast as it.
    assert v(6.0, 3.0) == report.PARTLY and v(below(6.0), 3.0) == report.FAILS
    assert v(math.inf, 1.0) == report.UNMEASURED and v(2.0, math.nan) == report.UNMEASURED


def test_claims_use_their_rules_at_the_thresholds():
    """The verdicts the report shows, built from summaries at the documented thresholds."""
    gap = {"prefill_label": "prefill 2048", "decode_label": "decode b=1"}
    batching = {"decode_batches": [1, 32]}

    def verdict_of(phases=None, sweep=None, occupancy=None) -> list[str]:
        return [c.verdict for c in report.claims(phases, sweep, occupancy)]

    at = {**gap, "prefill_over_decode_tflops": 10.0, **batching, "decode_token_cost_ratio": 8.0}
    assert verdict_of(at)[:2] == [report.HOLDS, report.HOLDS]
    under = {**at, "prefill_over_decode_tflops": below(10.0), "decode_token_cost_ratio": 7.99}
    assert verdict_of(under)[:2] == [report.PARTLY, report.PARTLY]
    low = {**at, "prefill_over_decode_tflops": below(2.0), "decode_token_cost_ratio": 1.2}
    assert verdict_of(low)[:2] == [report.FAILS, report.FAILS]
    sweep = {"batch_from": 1, "batch_to": 8, "throughput_ratio": 6.0, "step_latency_ratio": 3.0}
    assert verdict_of(sweep=sweep)[2] == report.PARTLY
    assert verdict_of(sweep={**sweep, "throughput_ratio": 5.9})[2] == report.FAILS
    for speedup, expected in ((2.0, report.HOLDS), (1.99, report.PARTLY), (1.2, report.PARTLY)):
        rows = occupancy_rows(round(1000 * speedup), 1000)
        assert rows[1]["speedup_vs_static"] == speedup
        assert verdict_of(occupancy=rows)[3] == expected, speedup
    assert verdict_of(occupancy=occupancy_rows(1199, 1000))[3] == report.FAILS


def test_an_uneven_real_run_is_noted_above_one_and_a_half():
    real = [
        {"policy": "static", "total_steps": 9, "wall_s": 9.0, "speedup_vs_static": 1.0},
        {"policy": "continuous", "total_steps": 3, "wall_s": 3.6, "speedup_vs_static": 2.5},
    ]
    real[1]["measured_over_sim"] = 1.5
    assert not build(real=real).sections[3].notes
    real[1]["measured_over_sim"] = above(1.5)
    assert "continuous x1.50" in build(real=real).sections[3].notes[0]


def test_claims_without_measurements_say_so():
    claims = report.claims(None, None, None)
    assert [c.verdict for c in claims] == [report.UNMEASURED] * 4
    assert all(c.measured == "not measured" for c in claims)


def test_real_engine_rows_add_a_claim_of_their_own():
    real = [
        {"policy": "static", "total_steps": 900, "occupancy": 0.3, "wall_s": 9.0,
         "tokens_per_s": 30.0, "speedup_vs_static": 1.0},
        {"policy": "continuous", "total_steps": 300, "occupancy": 0.9, "wall_s": 3.6,
         "tokens_per_s": 75.0, "speedup_vs_static": 2.5, "requests": 128, "slots": 32},
    ]  # fmt: skip
    rep = build(real=real)
    assert rep.claims[-1].key == "C, real engine" and rep.claims[-1].verdict == report.HOLDS
    # its own sizes beside it (on a CPU not the simulated C's: 128 requests, 32 slots)
    assert rep.claims[-1].measured.endswith("2.5x faster (measured wall time; 128 requests on "
                                            "32 slots)")  # fmt: skip
    real_section = rep.sections[3]
    assert real_section.title == "C on the real engine"
    assert real_section.rows[1] == ["continuous", "300", "90.0%", "3.6", "75", "2.5x"]
    assert not real_section.notes
    real[1]["measured_over_sim"] = 4.4
    assert "continuous x4.40" in build(real=real).sections[3].notes[0]


def test_a_real_speedup_of_the_same_work_is_judged_1x():
    """One request on 8 slots: both policies ran the same one step, continuous 1.3x
    "faster" by the wall clock, and the verdict said partly. Runs that did the same work
    (as many steps at the same occupancy) differ by the device's speed: judged 1x, said.
    Fewer steps, or the same steps with less padding, are batching's: as measured."""
    def real(static_steps, continuous_steps, speedup, used=(0.125, 0.125)):
        return [
            {"policy": "static", "total_steps": static_steps, "occupancy": used[0],
             "wall_s": 1.0, "speedup_vs_static": 1.0},
            {"policy": "continuous", "total_steps": continuous_steps, "occupancy": used[1],
             "wall_s": 1.0 / speedup, "speedup_vs_static": speedup},
        ]  # fmt: skip

    same = build(real=real(1, 1, 1.3)).claims[-1]
    assert same.verdict == report.FAILS and "judged 1x" in same.measured
    fewer = build(real=real(1290, 563, 2.46, (0.323, 0.741))).claims[-1]  # 2.29x fewer steps
    assert fewer.verdict == report.HOLDS and "judged" not in fewer.measured
    padded = build(real=real(900, 900, 1.3, (0.5, 0.6))).claims[-1]  # less padding: batching's
    assert padded.verdict == report.PARTLY and "judged" not in padded.measured


# --- rendering -------------------------------------------------------------------------------


def test_markdown_sets_every_article_number_beside_a_measured_one():
    text = report.to_markdown(build())
    # the article's numbers as it gives them (fmt's 1.96, 106 and 319 disagreed with the
    # claims quoting 1.955, 105.5 and 318.9)
    for number in ("0.664", "1.955", "0.319", "0.257", "77.6", "105.5", "318.9", "12.6"):
        assert number in text, number
    assert "| 1.955 / " in text and "| 318.9 / " in text and "| 105.5 / " in text
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


def test_the_serving_claim_judges_the_knees_ranges():
    """Claim S on bisected knees: holds when continuous's knee with every step 10% slower
    is above static's with every step 10% faster, partly when only the knees themselves
    are in that order (ranges overlapping), fails otherwise; without knees, on the swept
    rates (higher holds, equal partly)."""
    from benchbatch.output.report.beyond_claims import serve_claim

    def rows(static, cont):
        keys = ("knee_rps", "knee_rps_slow", "knee_rps_fast")
        return [
            {"policy": p, "source": "sim", "sustained_rps": rate, **dict(zip(keys, k, strict=True))}
            for p, rate, k in (("static", 2.0, static), ("continuous", 6.0, cont))
        ]

    static = (2.6, 2.3, 3.1)
    assert serve_claim(rows(static, (6.3, 5.6, 7.1))).verdict == report.HOLDS
    assert serve_claim(rows(static, (6.3, above(3.1), 7.1))).verdict == report.HOLDS
    assert serve_claim(rows(static, (3.0, 3.1, 3.4))).verdict == report.PARTLY  # touching
    assert serve_claim(rows(static, (above(2.6), 2.3, 2.9))).verdict == report.PARTLY
    assert serve_claim(rows(static, (2.6, 2.3, 3.1))).verdict == report.FAILS
    claim = serve_claim(rows(static, (6.3, 5.6, 7.1)))
    assert "continuous's knee 6.3 req/s (5.6-7.1), static's 2.6 (2.3-3.1)" in claim.measured
    swept = rows((None,) * 3, (None,) * 3)
    assert serve_claim(swept).verdict == report.HOLDS
    swept[1]["sustained_rps"] = 2.0
    assert serve_claim(swept).verdict == report.PARTLY
    swept[1]["sustained_rps"] = 1.0
    assert serve_claim(swept).verdict == report.FAILS
    # static saturated within the sweep (knee 164, 149-182), continuous never did and kept
    # within the SLO to the last rate, 280: holds (both "within up to 280" read partly)
    late = rows((164.0, 149.0, 182.0), (None,) * 3)
    late[0]["sustained_rps"] = late[1]["sustained_rps"] = 280.0
    claim = serve_claim(late)
    assert claim.verdict == report.HOLDS
    assert claim.measured.startswith("continuous within the SLO up to 280 req/s with no knee "
                                     "below it, static's knee 164 req/s (149-182)")  # fmt: skip
    late[1]["sustained_rps"] = 170.0  # above the knee, within its range: partly
    assert serve_claim(late).verdict == report.PARTLY
    late[1]["sustained_rps"] = 120.0
    assert serve_claim(late).verdict == report.FAILS
    # continuous within the SLO at the max point (every request at once): past any knee,
    # said as such (it read "within up to 0 req/s" and failed)
    for top in (float("inf"), "inf", "max"):
        late[1]["sustained_rps"] = top
        claim = serve_claim(late)
        assert claim.verdict == report.HOLDS, top
        assert "up to max (every request at once) with no knee" in claim.measured
    swept[0]["sustained_rps"], swept[1]["sustained_rps"] = 2.0, float("inf")
    assert serve_claim(swept).verdict == report.HOLDS
    assert "continuous within up to max (every request at once), static up to 2 req/s" in (
        serve_claim(swept).measured
    )


def _pred(ratio: float, within: bool | None) -> dict:
    return {"point": "static", "metric": "wall_s", "simulated": 1.0, "measured": ratio,
            "ratio": ratio, "within": within}  # fmt: skip


@pytest.mark.parametrize(
    ("withins", "verdict"),
    [
        ([True] * 4, "holds"),
        ([True, True, True, False], "partly"),
        ([True, True, False, False], "partly"),  # half: partly
        ([True, False, False, False], "does not hold"),
        ([True, True, None, None], "holds"),  # not judged: left out
        ([None], "not measured"),
    ],
)
def test_claim_p_holds_when_every_pair_is_within_and_partly_at_half(withins, verdict):
    """Claim P from prediction.csv's rows as the CSV gives them back (text booleans too)."""
    rows = [_pred(1.0 if w else 1.3, w) for w in withins]
    as_text = [r | {"within": str(r["within"]) if r["within"] is not None else ""} for r in rows]
    for given in (rows, as_text):
        claim = report.prediction_claim(given)
        assert claim.key == "P" and claim.verdict == verdict
    judged = [w for w in withins if w is not None]
    if judged:
        assert claim.measured.startswith(f"{sum(judged)} of {len(judged)} within target")


def test_a_ratio_rounded_across_its_threshold_is_said_with_more_digits():
    """9.996 read "10x" beside "partly" under "holds at 10x or more", and throughput x4 with
    step time x2 beside "does not hold": a verdict and the number it is judged on agree as
    printed (more digits where three would cross a threshold; three otherwise)."""
    from benchbatch.output.report.claims import _latency_claim, _prefill_claim, said

    assert said(9.996, 10, 2) == "9.996" and said(10.004, 10, 2) == "10"  # holds, as said
    assert said(9.5, 10, 2) == "9.5" and said(350.2, 10, 2) == "350"
    near = _prefill_claim({"prefill_over_decode_tflops": 9.996, "prefill_label": "prefill 512",
                           "decode_label": "decode b=1"})  # fmt: skip
    assert near.verdict == report.PARTLY and near.measured.startswith("9.996x")
    lat = _latency_claim({"batch_from": 1, "batch_to": 256, "throughput_ratio": 3.9998,
                          "step_latency_ratio": 2.0001})  # fmt: skip
    assert lat.verdict == report.FAILS
    assert lat.measured.startswith("throughput x3.9998, step time x2.0001")
    far = _latency_claim({"batch_from": 1, "batch_to": 256, "throughput_ratio": 223.4,
                          "step_latency_ratio": 1.104})  # fmt: skip
    assert far.measured.startswith("throughput x223, step time x1.1")


def test_the_prediction_section_sets_each_runs_own_speed_beside_its_ratio():
    """reproduce --engine real: prediction.csv's ratio at each run's own speed (occupancy
    prices its runs' steps after them) as a column, and its line under the verdict; a run
    without (an older run's CSV) keeps the table as it was."""
    from benchbatch.output.report.beyond import section_prediction

    rows = [{"point": "static", "metric": "ttft_p50_s", "simulated": 2.0, "measured": 2.3,
             "ratio": 1.15, "target_low": 0.9, "target_high": 1.1, "within": "False",
             "ratio_at_speed": "1.02"},
            {"point": "static", "metric": "wall_s", "simulated": 4.0, "measured": 4.6,
             "ratio": 1.15, "target_low": 0.9, "target_high": 1.1, "within": "False",
             "ratio_at_speed": math.nan}]  # fmt: skip
    section = section_prediction(rows, "the verdict", None, "the runs ran their steps at x1.15")
    assert section.headers[-1] == "at its run's speed"
    assert [r[-1] for r in section.rows] == ["1.02x", "-"]
    assert [r[4] for r in section.rows] == ["1.15x", "1.15x"]
    assert section.notes == ["the verdict", "the runs ran their steps at x1.15"]
    older = section_prediction([{k: v for k, v in r.items() if k != "ratio_at_speed"}
                                for r in rows], "the verdict", None)  # fmt: skip
    assert "at its run's speed" not in older.headers and len(older.rows[0]) == 7
    assert older.notes == ["the verdict"]
