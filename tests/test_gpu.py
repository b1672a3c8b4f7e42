"""GPU checks: they skip themselves without CUDA (run by scripts/gpu_check.sh).

What the CPU tests check through a fake torch.cuda (tests/test_cuda_backend.py) is checked
here against the real one: graphs replay the eager result (prefill, decode, the chunked
prefill loop), events time the work, a second GPU is timed on its own stream, NVML finds
this GPU. No test asserts a speed.
"""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchbatch.core import accounting
from benchbatch.core.config import preset
from benchbatch.experiments.piggyback import probe as piggyback
from benchbatch.experiments.piggyback.options import PiggybackOptions
from benchbatch.runtime import backend, steps, telemetry
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import TimingOptions, measure

pytestmark = pytest.mark.gpu
GPU = torch.device("cuda", 0)
QUICK = TimingOptions(min_repeats=5, min_time_s=0.0)


@torch.no_grad()
def test_cached_decode_matches_full_forward_in_fp16():
    model = Transformer(preset("tiny").replace(hidden=128), "cuda", torch.float16)
    tokens = torch.randint(0, model.cfg.vocab, (4, 40), device="cuda")
    full = model(tokens).float()
    cache = model.new_cache(4, 64)
    out = [model.step(tokens[:, :30], cache, slice(0, 4), all_logits=True)]
    out += [model.step(tokens[:, i : i + 1], cache, slice(0, 4)) for i in range(30, 40)]
    torch.testing.assert_close(torch.cat(out, 1).float(), full, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("batch", "tokens", "context"), [(8, 1, 32), (2, 48, 0)])
@torch.no_grad()
def test_graph_replay_gives_the_eager_logits(batch, tokens, context):
    """A decode step and a prefill step, each replayed from its CUDA graph."""
    model = Transformer(preset("tiny"), "cuda", torch.float16)
    cache = model.new_cache(batch, context + tokens)
    cache.k.normal_()
    cache.v.normal_()
    ids = torch.randint(0, model.cfg.vocab, (batch, tokens), device="cuda")
    logits = {}

    def run():
        cache.lengths.fill_(context)
        logits["x"] = model.step(ids, cache, slice(0, batch), kv_len=context + tokens)

    run()
    eager = logits["x"].clone()
    replay = backend.of(GPU).capture(run)
    logits["x"].zero_()
    replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(logits["x"], eager)
    assert cache.lengths.tolist() == [context + tokens] * batch  # a replay does not advance


@torch.no_grad()
def test_the_chunked_prefill_loop_replays_as_one_graph():
    model = Transformer(preset("tiny"), "cuda", torch.float16)
    ids = torch.randint(0, model.cfg.vocab, (1, 40), device="cuda")
    whole, chunked = model.new_cache(1, 40), model.new_cache(1, 40)
    model.step(ids, whole, slice(0, 1), kv_len=40)

    def run():
        chunked.lengths.zero_()
        for s in range(0, 40, 16):
            e = min(s + 16, 40)
            model.step(ids[:, s:e], chunked, slice(0, 1), kv_len=e)

    replay = backend.of(GPU).capture(run)
    chunked.k.zero_()
    chunked.v.zero_()
    replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(chunked.k, whole.k, rtol=2e-2, atol=2e-2)
    assert chunked.lengths.tolist() == [40]


@torch.no_grad()
def test_flop_counter_on_cuda_counts_dense_attention():
    """Equal query and KV head counts: torch 2.11's SDPA FLOP formula rejects grouped-query
    shapes on flash attention."""
    cfg = preset("tiny")
    cfg = cfg.replace(kv_heads=cfg.heads)
    model = Transformer(cfg, "cuda", torch.float16)
    tokens = torch.randint(0, cfg.vocab, (2, 16), device="cuda")
    with FlopCounterMode(display=False) as counter:
        model(tokens)
    cost = accounting.step_cost(cfg, "fp16", 2, 16, 0, logits_per_seq=16)
    matmuls = cost.linear_flops + cost.lm_head_flops
    dense = accounting.dense_attention_flops(cfg, 2, 16, 0)
    assert counter.get_total_flops() in (matmuls, matmuls + dense)


def test_event_timing_and_step_rows():
    model = Transformer(preset("tiny"), "cuda", torch.float16)
    m = measure(lambda: torch.ones(1 << 20, device="cuda").sum(), GPU, QUICK)
    assert m.repeats == 5 and m.min_ms > 0 and m.host_ms > 0
    for step in (steps.decode(4, 64), steps.prefill(1, 64)):
        row = steps.run_step(model, "fp16", step, QUICK)
        assert row["status"] == "ok" and row["step_ms"] > 0 and row["tflops"] > 0
        assert row["host_ms"] > 0 and isinstance(row["launch_bound"], bool)
    opts = PiggybackOptions(decode_batch=(2,), context=(16,), piggyback_tokens=(8,),
                            chunk_prompt=64, chunks=(16,), tiles=(8,))  # fmt: skip
    rows = piggyback.chunk_rows(list(piggyback.rows(model, opts, QUICK)), model.cfg, "fp16")
    assert [r["chunks"] for r in rows] == [4, 1] and all(r["total_ms"] > 0 for r in rows)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
@torch.no_grad()
def test_the_second_gpu_is_timed_on_its_own_stream():
    """cuda:1 while cuda:0 is current: the step runs, and is timed, on device 1."""
    dev = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    model = Transformer(preset("tiny"), dev, torch.float16)
    seen = []
    m = measure(
        lambda: (seen.append(torch.cuda.current_device()), model(model_ids(dev))), dev, QUICK
    )
    assert set(seen) == {1} and m.min_ms > 0
    row = steps.run_step(model, "fp16", steps.decode(4, 64), QUICK)
    assert row["status"] == "ok" and row["step_ms"] > 0
    assert torch.cuda.current_device() == 0


def model_ids(dev: torch.device) -> torch.Tensor:
    return torch.zeros(1, 8, dtype=torch.long, device=dev)


def test_nvml_finds_this_gpu():
    snap = telemetry.snapshot(GPU)
    if not snap["available"]:
        pytest.skip(snap["reason"])
    if not snap.get("mig"):
        assert snap["name"] == torch.cuda.get_device_name(GPU)
    assert snap["sm_clock_mhz"] is None or snap["sm_clock_mhz"] > 0
    with telemetry.ThrottleWatch(GPU) as watch:
        look = watch.look()
    assert isinstance(look, telemetry.Slowdown)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_tensor_parallel_decode_replays_from_a_cuda_graph_on_nccl(tmp_path):
    """Two ranks on two GPUs (tests/tp_gpu_worker.py): the sharded model's logits are the
    whole model's, and its decode step, all-reduces included, replays from a CUDA graph."""
    from ranks import REPO, launch

    ranks = launch([str(REPO / "tests" / "tp_gpu_worker.py")], tmp_path, timeout=120)
    for r in ranks:
        assert r.returncode == 0, r.stderr
        assert "replayed from a CUDA graph on NCCL" in r.stdout
