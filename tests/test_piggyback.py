"""The piggyback probe: mixed steps timed through the shared harness, its rows and summary,
the chunk-size sweep, and the command end to end on a tiny model."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest

from benchbatch.app.cli import app
from benchbatch.core import accounting
from benchbatch.core.config import preset
from benchbatch.experiments.piggyback import probe
from benchbatch.experiments.piggyback.options import PiggybackOptions
from benchbatch.runtime.timing import Measurement, TimingOptions

QUICK = TimingOptions(min_repeats=2, min_time_s=0.0, warmup=1, warmup_s=0.0)
ROW_COLUMNS = {
    "decode_batch",
    "context",
    "prefill_tokens",
    "prefill_per_decode_token",
    "step_ms",
    "decode_only_ms",
    "over_decode",
    "extra_ms",
    "extra_us_per_prefill_token",
    "prefill_alone_ms",
    "separate_ms",
    "saved_ms",
    "step_ms_min",
    "step_ms_iqr",
    "step_ms_p10",
    "step_ms_p90",
    "cv",
    "repeats",
    "noisy",
    "attempts",
    "interleaved",
    "host_ms",
    "launch_bound",
    "throttled",
    "power_capped",
}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_mixed_step_features_match_the_scheduler_counts():
    step = probe.MixedStep(4, 100, 32, 64)
    assert step.features == (4, 32, 4 * 100 + 64) and step.kind == "mixed"
    assert probe.MixedStep(4, 100).kind == "decode" and probe.MixedStep(0, 0, 8).kind == "prefill"
    with pytest.raises(AssertionError):
        probe.MixedStep(0, 10)


OPTS = PiggybackOptions(
    decode_batch=(4,), context=(16,), piggyback_tokens=(8, 32), chunk_prompt=100,
    chunks=(16, 64, 500), tiles=(65, 64),
)  # fmt: skip


def test_plan_times_each_step_of_each_table_in_order():
    plan = probe.plan(replace(OPTS, decode_batch=(1, 4)))
    steps = [(t.part, t.step) for t in plan]
    assert steps[:6] == [
        ("piggyback", probe.MixedStep(b, 16, p)) for b in (1, 4) for p in (0, 8, 32)
    ]
    assert steps[6:8] == [("piggyback", probe.MixedStep(0, 0, p)) for p in (8, 32)]
    chunked = [s.chunk for part, s in steps if part == "chunked"]
    assert chunked == [16, 64, 100]  # a chunk past the prompt is the one prefill
    assert [s.prefill_tokens for part, s in steps if part == "tile"] == [64, 65]


def test_piggyback_rows_have_the_columns_and_positive_times(tiny_model):
    opts = replace(OPTS, chunks=(100,), tiles=(8,))
    raw = list(probe.rows(tiny_model, opts, QUICK, cuda_graphs=False))
    assert len(raw) == len(probe.plan(opts)) and {r["status"] for r in raw} == {"ok"}
    rows = probe.piggyback_rows(raw)
    # Each table's steps were timed together, their repeats interleaved.
    parts = {r["part"]: (r["timing_group"], r["interleaved"]) for r in raw}
    assert len({g for g, _ in parts.values()}) == 3
    assert parts["piggyback"][1] == 5 and parts["tile"][1] == 1
    assert [r["prefill_tokens"] for r in rows] == [0, 8, 32]
    for r in rows:
        assert set(r) == ROW_COLUMNS
        assert r["step_ms"] > 0 and r["decode_only_ms"] > 0 and r["repeats"] >= 2
    assert rows[0]["over_decode"] == 1.0 and math.isnan(rows[0]["extra_us_per_prefill_token"])
    assert all(r["prefill_alone_ms"] > 0 for r in rows[1:])
    s = probe.piggyback_summary(rows, 0.1)
    assert s["decode_batch"] == 4 and s["context"] == 16
    # The largest P before the first step more than 10% over decode-only, read off the rows.
    over = {r["prefill_tokens"]: r["over_decode"] for r in rows}
    free = 0 if over[8] > 1.1 else 8 if over[32] > 1.1 else 32
    assert s["free_prefill_tokens"] == free and s["free_prefill_per_decode_token"] == free / 4


def raw(step, ms: float, part: str = "piggyback", throttled: bool = False) -> dict:
    return {**probe.raw_row(probe.Timed(part, step), Measurement([ms])), "throttled": throttled}


def fake_rows(overs: dict[int, float], base_ms: float = 10.0) -> list[dict]:
    steps = [raw(probe.MixedStep(8, 64, p), base_ms * o) for p, o in overs.items()]
    steps += [raw(probe.MixedStep(0, 0, p), p * 0.1) for p in overs if p]
    return probe.piggyback_rows(steps)


def test_free_prefill_tokens_is_the_largest_p_before_the_first_crossing():
    rows = fake_rows({0: 1.0, 16: 1.02, 32: 1.08, 64: 1.2, 128: 1.05, 256: 2.0})
    assert probe.free_prefill_tokens(rows, 0.1) == 32  # 128 is back within, but 64 was not
    assert probe.free_prefill_tokens(rows, 0.25) == 128
    assert probe.free_prefill_tokens(rows, 0.0) == 0
    s = probe.piggyback_summary(rows, 0.1)
    assert s["free_prefill_per_decode_token"] == 32 / 8
    # The largest chunk: 256 tokens add 10 ms, so the 10 ms decode step is worth 256 tokens.
    assert s["prefill_tokens_per_decode_step"] == pytest.approx(256)
    assert s["prefill_tokens_per_decode_token"] == pytest.approx(32)
    by_p = {r["prefill_tokens"]: r for r in rows}
    assert by_p[64]["separate_ms"] == pytest.approx(10 + 6.4)
    assert by_p[64]["saved_ms"] == pytest.approx(10 + 6.4 - 12)


def test_one_curve_per_decode_batch_and_context():
    steps = [raw(probe.MixedStep(b, 64, p), b * (1 + p / 100)) for b in (1, 8) for p in (0, 50)]
    steps += [raw(probe.MixedStep(0, 0, 50), 0.5)]
    rows = probe.piggyback_rows(steps)
    assert [(r["decode_batch"], r["prefill_tokens"]) for r in rows] == [
        (1, 0),
        (1, 50),
        (8, 0),
        (8, 50),
    ]
    summaries = probe.summaries(rows, 0.1)
    assert [s["decode_batch"] for s in summaries] == [1, 8]
    assert [r["over_decode"] for r in rows] == pytest.approx([1.0, 1.5, 1.0, 1.5])


def test_chunk_sweep_and_tiles(tiny_model):
    opts = replace(OPTS, piggyback_tokens=(4,), decode_batch=(1,), context=(8,))
    steps = list(probe.rows(tiny_model, opts, QUICK, cuda_graphs=False))
    rows = probe.chunk_rows(steps, tiny_model.cfg, "fp32")
    assert [(r["chunk_tokens"], r["chunks"]) for r in rows] == [(16, 7), (64, 2), (100, 1)]
    whole = rows[-1]
    assert whole["over_one_prefill"] == 1.0 and whole["extra"] == 0.0
    assert all(r["total_ms"] > 0 and r["kind"] == "chunked" for r in rows)
    # More chunks read the weights more often and re-read more of the KV cache.
    assert rows[0]["weight_bytes"] > 6 * whole["weight_bytes"]
    assert rows[0]["kv_read_bytes"] > rows[1]["kv_read_bytes"] > whole["kv_read_bytes"]
    tiles = probe.tile_rows(steps)
    assert [r["chunk_tokens"] for r in tiles] == [64, 65]
    assert math.isnan(tiles[0]["over_previous"]) and tiles[1]["over_previous"] > 0


def test_an_oom_step_is_a_row_and_the_others_go_on(tiny_model, monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(probe, "prepare_chunked", out_of_memory)
    steps = list(probe.rows(tiny_model, replace(OPTS, tiles=(8,)), QUICK, cuda_graphs=False))
    assert {r["status"] for r in steps if r["part"] == "chunked"} == {"oom"}
    assert {r["status"] for r in steps if r["part"] != "chunked"} == {"ok"}
    assert probe.chunk_rows(steps, tiny_model.cfg, "fp32") == []
    assert len(probe.piggyback_rows(steps)) == 3


def test_timed_mixed_step_leaves_the_model_unchanged(tiny_model):
    """Timing replays the step in place: the cache lengths are reset inside every call."""
    m = probe.time_mixed(tiny_model, probe.MixedStep(2, 10, 6, 3), QUICK)
    assert m.repeats >= 2 and min(m.times_ms) > 0


TINY = ["--preset", "tiny", "--device", "cpu", "--repeats", "1", "--min-time", "0"]
TINY += ["--no-roofline"]
SMALL = ["--decode-batch", "2", "--context", "16", "--prefill", "8,32"]
SMALL += ["--chunk-prompt", "96", "--chunks", "32,96", "--tiles", "32,33"]


def test_command_writes_rows_plot_and_json(runner, tmp_path):
    out = tmp_path / "pb"
    result = runner.invoke(app, ["piggyback", "--out", str(out), *TINY, *SMALL, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [s["decode_batch"] for s in doc["summary"]] == [2]
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == 9 and set(steps["part"]) == {"piggyback", "chunked", "tile"}
    # Each kind of attention call a step makes, and the backend torch picks for it here.
    assert (
        list(steps["sdpa_backend"][:3]) == ["decode: flash"] + ["decode: flash; prefill: flash"] * 2
    )
    assert list(steps["sdpa_backend"][5:7]) == ["prefill: flash; masked: flash", "prefill: flash"]
    rows = pd.read_csv(out / "piggyback.csv")
    assert set(ROW_COLUMNS) <= set(rows.columns) and list(rows["prefill_tokens"]) == [0, 8, 32]
    assert (rows["step_ms"] > 0).all()
    chunks = pd.read_csv(out / "chunks.csv")
    assert list(chunks["kind"]) == ["chunked", "chunked", "tile", "tile"]
    assert (chunks["total_ms"] > 0).all()
    assert (out / "piggyback.png").stat().st_size > 0
    assert not rows["throttled"].any() and not chunks["throttled"].any()  # a CPU never is
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["summary"][0]["threshold"] == 0.1


def test_steps_are_placed_on_the_roofline(runner, tmp_path):
    probe_csv = tmp_path / "probe.csv"
    probe_csv.write_text(
        "kind,label,dtype,tflops,gbps,status\n"
        "matmul,matmul 4096,fp32,1000,,ok\nread,read 1 GiB,fp32,,1000,ok\n"
    )  # far above the tiny model: no row raises them
    out = tmp_path / "pb"
    args = ["piggyback", "--out", str(out), *TINY[:-1], *SMALL, "--ceilings", str(probe_csv)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    steps = pd.read_csv(out / "steps.csv")
    cfg = preset("tiny")
    mixed = steps[steps["label"] == "decode b=2 ctx=16 + chunk 32"].iloc[0]
    flops, nbytes = accounting.mixed_cost(cfg, "fp32", 2, 16, 32)
    assert (mixed["flops"], mixed["bytes"], mixed["phase"]) == (flops, nbytes, "mixed")
    assert mixed["mfu"] == pytest.approx(mixed["tflops"] / 1000, rel=1e-5)
    assert mixed["tflops"] == pytest.approx(flops / mixed["step_ms"] / 1e9, rel=1e-5)
    ridge = 1000.0  # 1000 TFLOP/s over 1000 GB/s: FLOP per byte
    expected = ["compute" if x >= ridge else "memory" for x in steps["arithmetic_intensity"]]
    assert list(steps["bound"]) == expected
    assert (out / "roofline.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--decode-batch", "0"], "--decode-batch"),
        (["--prefill", "8,-1"], "--prefill"),
        (["--chunks", "x"], "--chunks"),
        (["--threshold", "-0.1"], "--threshold"),
        (["--chunk-prompt", "5000"], "--chunk-prompt"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(runner, tmp_path, args, option):
    argv = ["piggyback", "--out", str(tmp_path / "x"), *TINY, *SMALL, *args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {option}:"), result.stderr


class SlowsAt:
    """A ThrottleWatch that says the GPU slowed down at the given looks (1 is the first)."""

    looks_throttled: set[int] = set()

    def __init__(self, device):
        self.looks = 0

    def look(self):
        from benchbatch.runtime.telemetry import Slowdown

        self.looks += 1
        return Slowdown(throttled=self.looks in self.looks_throttled)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_throttled_rows_are_flagged_and_warned_about(runner, tmp_path, monkeypatch):
    """SMALL times three groups, each table's steps together: 5 piggyback steps (decode +
    0, 8, 32; 8 and 32 alone), 2 chunked prefills and 2 tiles; one look at the GPU serves
    a group. It slows during the last group (the tiles): both tile rows are throttled, and
    nothing else is."""
    from benchbatch.runtime import telemetry

    monkeypatch.setattr(SlowsAt, "looks_throttled", {3})
    monkeypatch.setattr(telemetry, "ThrottleWatch", SlowsAt)
    out = tmp_path / "pb"
    result = runner.invoke(app, ["piggyback", "--out", str(out), *TINY, *SMALL])
    assert result.exit_code == 0, result.output
    assert list(pd.read_csv(out / "steps.csv")["throttled"]) == [False] * 7 + [True] * 2
    assert list(pd.read_csv(out / "piggyback.csv")["throttled"]) == [False, False, False]
    assert list(pd.read_csv(out / "chunks.csv")["throttled"]) == [False, False, True, True]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["untrusted"]["throttled"] == ["tile 32", "tile 33"]
    warning = " ".join(result.stderr.split())
    assert "slowed its clocks (thermal or power limit) during: tile 32, tile 33" in warning
    assert "--repeats" in warning and "--min-time" in warning


def test_a_slow_reference_step_flags_every_row_computed_from_it():
    """The decode-only step is every piggyback row's reference; one prefill, every chunked
    row's; a tile, the next tile's."""

    def curve(slow: set[int]) -> list[bool]:
        parts = [probe.MixedStep(2, 8, 0), probe.MixedStep(2, 8, 4), probe.MixedStep(0, 0, 4)]
        steps = [raw(s, 1.0 + i, throttled=i in slow) for i, s in enumerate(parts)]
        return [r["throttled"] for r in probe.piggyback_rows(steps)]

    assert curve({0}) == [True, True]
    assert curve({1}) == [False, True]
    assert curve({2}) == [False, True]  # the prefill alone, the second row's other reference
    chunked = [raw(probe.Chunked(32, c), 1.0, "chunked", c == 32) for c in (8, 16, 32)]
    assert [r["throttled"] for r in probe.chunk_rows(chunked, preset("tiny"), "fp32")] == [True] * 3
    tiles = [raw(probe.MixedStep(0, 0, t), 1.0, "tile", t == 8) for t in (8, 9, 10)]
    assert [r["throttled"] for r in probe.tile_rows(tiles)] == [True, True, False]


def test_chunks_not_shorter_than_the_prompt_are_said_to_be_the_whole_prefill():
    """--chunk-prompt 64 --chunks 128 measured one whole prefill in place of 128, unsaid."""
    from benchbatch.experiments.piggyback.options import PiggybackOptions

    assert PiggybackOptions().whole_chunks() is None  # 2048 is the default prompt: the whole
    assert PiggybackOptions(chunk_prompt=96, chunks=(32, 96)).whole_chunks() is None
    assert PiggybackOptions(chunk_prompt=64, chunks=(32, 128)).whole_chunks() == (
        "--chunks 128: not shorter than the 64-token --chunk-prompt, so one whole prefill, "
        "measured once (a longer --chunk-prompt chunks it)"
    )
    assert PiggybackOptions(chunk_prompt=64, chunks=(64, 128)).whole_chunks().startswith(
        "--chunks 64, 128: not shorter"
    )


def test_the_summary_says_average_and_never_inf():
    """The decode step's worth in prefill tokens rests on the average cost of a prefill token
    at the largest count riding (said "marginal"); a largest mixed step no slower than decode
    alone said "as much as inf prefill tokens"."""
    from benchbatch.app.views.piggyback import _summary_line
    from benchbatch.experiments.piggyback.probe import piggyback_summary

    def rows(extra_ms):
        return [{"decode_batch": 4, "context": 64, "decode_only_ms": 2.0, "prefill_tokens": p,
                 "extra_ms": e, "over_decode": (2.0 + e) / 2.0}
                for p, e in zip((16, 64), extra_ms, strict=True)]  # fmt: skip

    s = piggyback_summary(rows((0.1, 0.5)), 0.1)
    assert s["prefill_tokens_per_decode_step"] == pytest.approx(2.0 / (0.5 / 64))  # 256
    line = _summary_line(s)
    assert "average cost of a prefill token when 64 ride" in line and "256 prefill" in line
    flat = _summary_line(piggyback_summary(rows((0.0, 0.0)), 0.1))
    assert "inf" not in flat and "not measurable here" in flat and "64 riding" in flat
