"""`benchbatch sweep` on a tiny model, its memory ceiling and knees, and its bad-input answers."""

import json
import math

import pandas as pd
import pytest
import torch

from benchbatch.app.cli import app
from benchbatch.core import accounting
from benchbatch.core.config import preset
from benchbatch.experiments.sweep import probe

FAST = ["--preset", "tiny", "--repeats", "1", "--min-time", "0", "--device", "cpu", "--no-roofline"]

# The tiny preset by hand: hidden 64, 2 layers, 4 heads of 16, 2 KV heads (kv_dim 32),
# intermediate 128, vocab 256, untied embeddings.
TINY_PARAMS = 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 128) + 5 * 64 + 2 * 256 * 64
TINY_ROTARY_FP32 = 2 * 4096 * 8 * 4  # cos and sin, max context 4096 x head_dim / 2, 4 B
TINY_KV_PER_TOKEN_FP32 = 2 * 2 * 32 * 4  # layers x (k, v) x kv_dim x 4 bytes = 512
# A step's workspace for one sequence: widest activations (2*64 + 64 + 2*32 + 3*128 = 640
# values) plus its fp32 logits (256 x 4 bytes).
TINY_WORKSPACE_FP32 = 640 * 4 + 256 * 4


def run_sweep(runner, out, *extra):
    fast = [a for a in FAST if a != "--no-roofline" or "--ceilings" not in extra]
    return runner.invoke(app, ["sweep", *fast, "--out", str(out), *extra])


def test_sweep_rows_columns_metadata_and_plot(runner, tmp_path):
    result = run_sweep(runner, tmp_path / "run", "--batch", "4,1,2,2", "--context", "16,8")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert len(df) == 6
    assert list(zip(df["context"], df["batch"], strict=True)) == [
        (8, 1), (8, 2), (8, 4), (16, 1), (16, 2), (16, 4)
    ]  # fmt: skip
    for column in (
        "batch", "context", "step_ms", "tokens_per_s", "us_per_token", "flops", "bytes",
        "tflops", "gbps", "arithmetic_intensity", "kv_cache_bytes", "status", "noisy",
    ):  # fmt: skip
        assert column in df.columns
    assert (df["status"] == "ok").all() and (df["step_ms"] > 0).all()
    for row in df.itertuples():
        # The CSV keeps 6 significant digits.
        assert row.tokens_per_s == pytest.approx(row.batch / (row.step_ms / 1e3), rel=1e-5)
        assert row.us_per_token == pytest.approx(row.step_ms * 1e3 / row.batch, rel=1e-5)
        # The step's cache holds context + 1 tokens per sequence.
        assert row.kv_cache_bytes == row.batch * (row.context + 1) * TINY_KV_PER_TOKEN_FP32
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["status"] == "complete" and meta["options"]["batch"] == [1, 2, 4]
    assert meta["batches"] == [1, 2, 4]  # as planned (the device's default without --batch)
    assert set(meta["predicted_max_batch"]) == {"8", "16"}
    assert set(meta["knees"]) == {"8", "16"}
    assert [s["context"] for s in meta["summary"]] == [8, 16]
    said = "no prediction (--no-roofline: no ceilings measured)"  # not "unknown device"
    assert meta["knees"]["8"]["predicted_knee_note"] == said
    assert (tmp_path / "run" / "sweep.png").stat().st_size > 1000
    assert "batch 1 -> 4: throughput x" in result.stdout
    assert "largest batch context 8:" in result.stdout


def test_json_output_is_one_document(runner, tmp_path):
    result = run_sweep(runner, tmp_path / "run", "--batch", "1,2", "--context", "8", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc["rows"]) == 2 and doc["folder"].endswith("run")
    (s,) = doc["summary"]
    assert s["batch_from"] == 1 and s["batch_to"] == 2
    assert s["throughput_ratio"] == pytest.approx(
        doc["rows"][1]["tokens_per_s"] / doc["rows"][0]["tokens_per_s"]
    )


def test_out_of_memory_is_recorded_and_earlier_rows_stay_on_disk(runner, tmp_path, monkeypatch):
    from benchbatch.runtime import steps

    real, on_disk = steps.prepare, []

    def fail_big(model, step, opts, cuda_graphs=True, seed=0, **layout):
        if step.batch >= 4:
            on_disk.append(len(pd.read_csv(tmp_path / "run" / "sweep.csv")))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(model, step, opts, cuda_graphs, seed, **layout)

    monkeypatch.setattr(steps, "prepare", fail_big)
    monkeypatch.setattr(steps, "group_budget", lambda dev: 0)  # each step a group of its own
    result = run_sweep(runner, tmp_path / "run", "--batch", "1,2,4,8", "--context", "8")
    assert result.exit_code == 0, result.output
    assert on_disk == [2, 3]  # the ok rows were written before the failures
    df = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert list(df["status"]) == ["ok", "ok", "oom", "oom"]
    assert df["step_ms"].isna().tolist() == [False, False, True, True]
    assert "batch 1 -> 2: throughput x" in result.stdout


def test_out_of_memory_in_a_group_leaves_the_rest_of_it_timed(runner, tmp_path, monkeypatch):
    from benchbatch.runtime import steps

    real = steps.prepare

    def fail_big(model, step, opts, cuda_graphs=True, seed=0, **layout):
        if step.batch == 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real(model, step, opts, cuda_graphs, seed, **layout)

    monkeypatch.setattr(steps, "prepare", fail_big)
    result = run_sweep(runner, tmp_path / "run", "--batch", "1,2,4,8", "--context", "8")
    assert result.exit_code == 0, result.output
    df = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert list(df["status"]) == ["ok", "ok", "oom", "ok"]
    # One group: the three that were prepared alternated their repeats.
    assert df["timing_group"].nunique() == 1
    assert list(df["interleaved"]) == [3, 3, 0, 3]


def test_predicted_max_batch_matches_hand_arithmetic():
    cfg = preset("tiny")
    weights = TINY_PARAMS * 4 + TINY_ROTARY_FP32
    assert weights == 427_264 + 262_144 == accounting.weight_bytes(cfg, "fp32")
    # Context 127: the decode step holds 128 tokens per sequence.
    per_seq = 128 * TINY_KV_PER_TOKEN_FP32 + TINY_WORKSPACE_FP32  # 65,536 + 3,584
    usable = 9_000_000 - weights  # 10 MB free, 10% held back
    assert usable // per_seq == 120
    assert probe.ceilings(cfg, "fp32", [127], 10_000_000) == {127: 120}
    # fp16 halves weights, KV and activations; the logits stay fp32.
    per_seq16 = 128 * TINY_KV_PER_TOKEN_FP32 // 2 + 640 * 2 + 256 * 4
    assert (9_000_000 - weights // 2) // per_seq16 == 246
    assert probe.ceilings(cfg, "fp16", [127, 255], 10_000_000)[127] == 246
    assert probe.ceilings(cfg, "fp32", [127], weights) == {127: 0}


def test_batches_over_the_ceiling_are_skipped_unless_try_oom(runner, tmp_path, monkeypatch):
    from benchbatch.experiments import common
    from benchbatch.runtime import device, steps

    # Context 8: 9 tokens x 512 B + 3,584 B workspace = 8,192 B a sequence; room for 3.5
    # beside the weights (max context 256: rotary tables of 16,384 B).
    free = math.ceil((TINY_PARAMS * 4 + 16_384 + 3.5 * 8192) / 0.9)
    monkeypatch.setattr(device, "free_memory_bytes", lambda dev: free)
    timed, real = [], steps.prepare

    def spy(model, step, opts, cuda_graphs=True, seed=0, **layout):
        timed.append(step.batch)
        return real(model, step, opts, cuda_graphs, seed, **layout)

    monkeypatch.setattr(steps, "prepare", spy)
    monkeypatch.setattr(common, "estimate_run", lambda *args: None)  # it times steps too
    short = ["--max-context", "256"]
    result = run_sweep(runner, tmp_path / "a", "--batch", "1,2,4,8", "--context", "8", *short)
    assert result.exit_code == 0, result.output
    assert "largest batch context 8: 3;" in result.stdout
    df = pd.read_csv(tmp_path / "a" / "sweep.csv")
    assert list(df["status"]) == ["ok", "ok", "skipped", "skipped"]
    assert df["step_ms"].isna().tolist() == [False, False, True, True]
    assert (df["predicted_max_batch"] == 3).all() and timed == [1, 2]
    assert df["flops"].notna().all()  # skipped rows still carry their accounting

    timed.clear()
    result = run_sweep(runner, tmp_path / "b", "--batch", "2,4", "--context", "8", "--try-oom",
                       *short)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert list(pd.read_csv(tmp_path / "b" / "sweep.csv")["status"]) == ["ok", "ok"]
    assert timed == [2, 4]

    # every batch over the ceiling: said so, not "fewer than two batches measured"
    result = run_sweep(runner, tmp_path / "c", "--batch", "4,8", "--context", "8", *short)
    assert result.exit_code == 0, result.output
    assert ("context 8: no batch measured (2 skipped over the memory ceiling: --try-oom "
            "tries them): no claim to check") in result.stdout.replace("\n", " ")


def test_measured_knee_on_synthetic_step_times():
    points = [(1, 10.0), (8, 11.0), (32, 12.6), (128, 20.0)]
    assert probe.measured_knee(points, 0.25) == 32
    assert probe.measured_knee(points, 0.05) == 8
    assert probe.measured_knee(points, 1.5) is None
    assert probe.measured_knee([(8, 12.5), (1, 10.0)], 0.25) is None  # exactly +25%: no knee
    assert probe.measured_knee(list(reversed(points)), 0.25) == 32  # order does not matter
    # Failed batches (NaN) are ignored; the smallest measured batch is the base.
    assert probe.measured_knee([(1, math.nan), (2, 10.0), (4, 12.0), (8, 13.0)], 0.25) == 8
    assert probe.measured_knee([(1, 10.0)], 0.25) is None


def _intensity(cfg, batch, context):
    return accounting.decode_cost(cfg, "fp16", batch, context).arithmetic_intensity


def test_roofline_knee_is_the_first_batch_reaching_the_ridge():
    cfg = preset("article")
    limit = probe.intensity_limit(cfg, "fp16", 128)
    assert _intensity(cfg, 10**7, 128) == pytest.approx(limit, rel=1e-4)
    ridge = limit * 0.8
    knee = probe.predicted_knee(cfg, "fp16", 128, ridge, ceiling=10**6)
    assert knee.fits and knee.batch > 1
    assert _intensity(cfg, knee.batch, 128) >= ridge > _intensity(cfg, knee.batch - 1, 128)
    assert f"batch {knee.batch:,}" in knee.note
    # a CPU's ridge of 3.37 FLOP/B said as 3.37, not rounded to 3
    small = probe.predicted_knee(cfg, "fp32", 128, 3.37, ceiling=10**6)
    assert small.note.endswith("(intensity reaches the ridge, 3.37 FLOP/B)"), small.note
    low = probe.predicted_knee(cfg, "fp16", 128, ridge, ceiling=knee.batch - 1)
    assert low.batch == knee.batch and not low.fits and "memory" in low.note


def test_roofline_knee_when_unknown_or_never_reached():
    cfg = preset("article")
    unknown = probe.predicted_knee(cfg, "fp16", 512, None, ceiling=100)
    assert unknown.batch is None and unknown.note == "no prediction (unknown device)"
    # H200 fp16 datasheet ridge (989 TFLOP/s / 4.8 TB/s): a 16-head MHA model's KV reads
    # keep a decode step's intensity below it at any batch.
    never = probe.predicted_knee(cfg, "fp16", 512, 989e12 / 4.8e12, ceiling=10**6)
    assert never.batch is None and not never.fits
    assert never.note.startswith("never") and "KV-cache" in never.note
    assert probe.matmul_knee("fp16", 206.04) == 207 and probe.matmul_knee("fp32", None) is None


def test_claim_and_summary_on_synthetic_rows():
    rows = [
        {"context": 8, "batch": b, "step_ms": ms, "tokens_per_s": b / ms * 1e3, "status": st}
        for b, ms, st in [(1, 2.0, "ok"), (8, 2.2, "ok"), (32, 8.0, "ok"), (64, math.nan, "oom")]
    ]
    c = probe.claim(rows)
    assert (c["batch_from"], c["batch_to"]) == (1, 32)
    assert c["throughput_ratio"] == pytest.approx(32 / 4) and c["step_latency_ratio"] == 4
    (s,) = probe.summarize(rows, preset("tiny"), "fp32", {8: 40}, None, 0.25)
    assert s["measured_knee"] == 32 and s["predicted_max_batch"] == 40
    assert s["measured_knee_step_ratio"] == 4
    assert s["statuses"] == {"ok": 3, "oom": 1}


BAD = [
    (["--batch", "0"], "--batch"),
    (["--batch=-8"], "--batch"),
    (["--batch", "1,x"], "--batch"),
    (["--context", "-1"], "--context"),
    (["--context", "8,4096"], "--context"),  # tiny max_context 4096: 4096 + 1 does not fit
    (["--context", "8", "--knee-threshold", "0"], "--knee-threshold"),
    (["--context", "8", "--knee-threshold=-0.5"], "--knee-threshold"),
    # a workload's prompt no model position holds: memory_ceiling.csv counted it
    (["--context", "8", "--prompt-len", "5000"], "--prompt-len"),
]


@pytest.mark.parametrize(("args", "option"), BAD)
def test_bad_input_is_one_line_naming_the_option(runner, tmp_path, args, option):
    result = run_sweep(runner, tmp_path / "run", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and option in lines[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "run").exists()  # nothing written before the input is checked


def test_figure_marks_knees_ceiling_skipped_and_oom(tmp_path):
    from benchbatch.output.plots.sweep import sweep_figure

    statuses = {256: "skipped", 128: "oom"}
    rows = []
    for c in (128, 512):
        for b in (1, 8, 32, 128, 256):
            ms = math.nan if b in statuses else 0.3 + b / 400 * c / 512
            status = statuses.get(b, "ok")
            row = {"context": c, "batch": b, "step_ms": ms, "tokens_per_s": b / ms * 1e3}
            rows.append({**row, "status": status})
    summary = [
        {"context": c, "predicted_max_batch": 200, "measured_knee": 32, "knee_threshold": 0.25,
         "predicted_knee": k, "predicted_knee_fits": k is not None, "matmul_knee": 207,
         "predicted_knee_note": "never: intensity tends to 27 FLOP/B" if k is None else ""}
        for c, k in ((128, 100), (512, None))
    ]  # fmt: skip
    sweep_figure(rows, summary, tmp_path / "sweep.png", "synthetic")
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_measured_ceilings_give_the_roofline_knee_and_mfu(runner, tmp_path):
    probe = tmp_path / "probe.csv"
    probe.write_text(
        "kind,label,dtype,tflops,gbps,status\n"
        "matmul,matmul 1024,fp32,100,,ok\ncopy,copy 64 MiB,fp32,,50000,ok\n"
    )  # far above what the tiny model reaches: no step raises them
    result = run_sweep(
        runner, tmp_path / "run", "--batch", "1,2", "--context", "8", "--ceilings", str(probe)
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["ridge_flop_per_byte"] == pytest.approx(2.0)  # 100e12 / 50e12
    assert meta["ridge_source"].startswith("measured")
    assert meta["knees"]["8"]["predicted_knee_note"] != "no prediction (unknown device)"
    df = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert ((df["mfu"] / (df["tflops"] / 100) - 1).abs() < 1e-5).all()
    assert (tmp_path / "run" / "roofline.png").exists()


def test_groups_hold_what_memory_allows_and_at_most_max_group_steps():
    from benchbatch.runtime import steps

    cfg = preset("tiny")
    plan = [steps.decode(b, 8) for b in range(1, 41)]
    need = [steps.held_bytes(cfg, "fp32", s) for s in plan]
    together = steps.groups(plan, cfg, "fp32", budget=10**12)
    assert [len(g) for g in together] == [16, 16, 8] and sum(together, []) == plan
    # A budget that holds batches 1-3 together; 4 and 5 (more memory each) not together.
    tight = steps.groups(plan[:5], cfg, "fp32", budget=sum(need[:3]))
    assert need[3] + need[4] > sum(need[:3]) >= need[4]
    assert [len(g) for g in tight] == [3, 1, 1] and sum(tight, []) == plan[:5]
    assert [len(g) for g in steps.groups(plan[:3], cfg, "fp32", budget=0)] == [1, 1, 1]


def test_a_paged_sweep_counts_whole_blocks_for_its_memory(runner, tmp_path):
    """--kv-layout paged: the ceiling and each row's kv_cache_bytes are the paged cache's
    (whole blocks, a scratch block), never the contiguous one's it does not allocate."""
    from benchbatch.core import accounting
    from benchbatch.core.config import preset

    out = tmp_path / "run"
    result = run_sweep(runner, out, "--batch", "1,2", "--context", "20", "--kv-layout", "paged",
                       "--block-size", "16")  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    cfg, free = preset("tiny"), meta["free_memory_bytes_before_model"]
    assert meta["predicted_max_batch"]["20"] == accounting.max_batch(cfg, "fp32", 21, free,
                                                                      block_size=16)  # fmt: skip
    rows = pd.read_csv(out / "sweep.csv")
    for _, r in rows.iterrows():  # 21 tokens: two blocks of 16 a sequence, one scratch block
        per_token = accounting.kv_bytes_per_token(cfg, "fp32")
        assert r["kv_cache_bytes"] == (int(r["batch"]) * 2 + 1) * 16 * per_token


def test_the_memory_ceiling_counts_no_sequence_past_the_models_context(runner, tmp_path):
    """--max-context 256 with the default workload (outputs up to 2,000 tokens): every
    sequence was counted reserving 2,064 tokens, none of which the model holds."""
    out = tmp_path / "run"
    result = run_sweep(runner, out, "--batch", "1", "--context", "8", "--max-context", "256")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "memory_ceiling.csv")
    assert (rows["reserved_tokens"] == 256).all()
    assert (rows["paged_mean_tokens"] <= 256).all()
    assert "no sequence grows past it" in result.stderr


def test_ctrl_c_keeps_the_summary_of_the_contexts_it_finished(runner, tmp_path, monkeypatch):
    """A sweep interrupted in its second context kept no summary nor knees (null), though
    its first context was whole: that context's are kept, the cut one left out, its knee
    note saying why there is no prediction (--no-roofline, not an unknown device)."""
    from benchbatch.experiments import common
    from benchbatch.runtime import steps

    real = steps.run_group

    def cut(model, dtype, group, *args, **kwargs):
        if group[0].context == 16:
            raise KeyboardInterrupt
        return real(model, dtype, group, *args, **kwargs)

    monkeypatch.setattr(steps, "run_group", cut)
    monkeypatch.setattr(common, "estimate_run", lambda *args: None)
    out = tmp_path / "run"
    result = run_sweep(runner, out, "--batch", "1,2", "--context", "8,16")
    assert result.exit_code == 130, result.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "interrupted"
    assert [s["context"] for s in meta["summary"]] == [8] and set(meta["knees"]) == {"8"}
    assert meta["summary"][0]["batch_from"] == 1 and meta["summary"][0]["batch_to"] == 2
    assert meta["summary_of"] == {"contexts": [8], "interrupted": True, "left_out": [16]}
    said = "no prediction (--no-roofline: no ceilings measured)"
    assert meta["knees"]["8"]["predicted_knee_note"] == said
    document = json.loads((out / "result.json").read_text())
    assert [s["context"] for s in document["metrics"]["summary"]] == [8]


def test_ceilings_with_no_roofline_are_refused(runner, tmp_path):
    """A good probe.csv with --no-roofline: the file won (roofline.png, mfu and mbu
    written), where --reprobe with --no-roofline is refused."""
    probe = tmp_path / "probe.csv"
    probe.write_text("kind,label,dtype,tflops,gbps,status\n"
                     "matmul,matmul 1024,fp32,100,,ok\ncopy,copy 64 MiB,fp32,,50000,ok\n")
    result = run_sweep(runner, tmp_path / "run", "--batch", "1", "--context", "8",
                       "--ceilings", str(probe), "--no-roofline")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--ceilings: places the rows on a roofline: it does nothing with --no-roofline" in (
        result.stderr)  # fmt: skip
    assert not (tmp_path / "run").exists()
