"""GPU checks: they skip themselves without CUDA (run by scripts/gpu_check.sh)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchbatch import accounting, cuda
from benchbatch.config import preset
from benchbatch.engines.model import Transformer
from benchbatch.probes import steps
from benchbatch.timing import TimingOptions, measure

pytestmark = pytest.mark.gpu


@torch.no_grad()
def test_cached_decode_matches_full_forward_in_fp16():
    model = Transformer(preset("tiny").replace(hidden=128), "cuda", torch.float16)
    tokens = torch.randint(0, model.cfg.vocab, (4, 40), device="cuda")
    full = model(tokens).float()
    cache = model.new_cache(4, 64)
    out = [model.step(tokens[:, :30], cache, slice(0, 4), all_logits=True)]
    out += [model.step(tokens[:, i : i + 1], cache, slice(0, 4)) for i in range(30, 40)]
    torch.testing.assert_close(torch.cat(out, 1).float(), full, rtol=2e-2, atol=2e-2)


@torch.no_grad()
def test_cuda_graph_replay_gives_the_eager_logits():
    model = Transformer(preset("tiny"), "cuda", torch.float16)
    cache = model.new_cache(8, 33)
    cache.k.normal_()
    cache.v.normal_()
    tokens = torch.randint(0, model.cfg.vocab, (8, 1), device="cuda")
    logits = {}

    def run():
        cache.lengths.fill_(32)
        logits["x"] = model.step(tokens, cache, slice(0, 8), kv_len=33)

    run()
    eager = logits["x"].clone()
    replay = cuda.capture_graph(run, torch.device("cuda"))
    replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(logits["x"], eager)


@torch.no_grad()
def test_flop_counter_on_cuda_counts_dense_attention():
    cfg = preset("tiny")
    model = Transformer(cfg, "cuda", torch.float16)
    tokens = torch.randint(0, cfg.vocab, (2, 16), device="cuda")
    with FlopCounterMode(display=False) as counter:
        model(tokens)
    cost = accounting.step_cost(cfg, "fp16", 2, 16, 0, logits_per_seq=16)
    matmuls = cost.linear_flops + cost.lm_head_flops
    dense = accounting.dense_attention_flops(cfg, 2, 16, 0)
    assert counter.get_total_flops() in (matmuls, matmuls + dense)


def test_event_timing_and_decode_step_row():
    model = Transformer(preset("tiny"), "cuda", torch.float16)
    opts = TimingOptions(min_repeats=5, min_time_s=0.0)
    m = measure(lambda: torch.ones(1 << 20, device="cuda").sum(), torch.device("cuda"), opts)
    assert m.repeats == 5 and m.min_ms > 0
    row = steps.run_step(model, "fp16", steps.decode(4, 64), opts)
    assert row["status"] == "ok" and row["step_ms"] > 0 and row["tflops"] > 0
