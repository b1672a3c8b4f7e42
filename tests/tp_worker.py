"""One rank of tests/test_tensor_parallel.py: the sharded model against the whole one.

Run on every rank (tests/ranks.py starts them as torchrun would). Each rank builds the model
sharded over all ranks and the whole model on its own, with the same seed, and checks that
they compute the same thing: prefill logits, cached decode steps, a mixed step, the real
engine's tokens under both policies and chunked prefill, and checkpoints loaded in slices.
Prints one line per check; any difference raises (a non-zero exit code).

    python tests/tp_worker.py [CHECKPOINT_DIR ...]
"""

from __future__ import annotations

import sys

import torch

from benchbatch.core.config import ModelConfig, preset
from benchbatch.core.workload import lognormal_columns
from benchbatch.runtime import distributed, tensor_parallel
from benchbatch.runtime.engine import Engine, run_alone
from benchbatch.runtime.model import Transformer

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32: only the order of the sums differs
SHAPES = {
    "gqa (KV heads split)": preset("tiny"),
    "mqa (one KV head, replicated)": preset("tiny").replace(kv_heads=1),
    "tied, biases, odd vocabulary (padded)": preset("tiny").replace(
        tie_embeddings=True, vocab=251, qkv_bias=True, o_bias=True, mlp_bias=True
    ),
    "qwen3 (q/k norm, own head_dim)": ModelConfig(
        hidden=64, layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=96, vocab=128,
        max_context=128, qk_norm=True, name="qwen3-like",
    ),  # fmt: skip
}


def compare(name: str, whole: Transformer, part: Transformer) -> None:
    cfg, gen = whole.cfg, torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (3, 11), generator=gen)
    with torch.inference_mode():
        torch.testing.assert_close(part(tokens), whole(tokens), **TOL)
        pairs = [(m, m.new_cache(4, 20)) for m in (whole, part)]
        first = [m.step(tokens, c, slice(0, 3)) for m, c in pairs]
        torch.testing.assert_close(first[1], first[0], **TOL)
        nxt = first[0][:, -1].argmax(-1)[:, None]
        for _ in range(3):  # cached decode steps
            steps = [m.step(nxt, c, slice(0, 3)) for m, c in pairs]
            torch.testing.assert_close(steps[1], steps[0], **TOL)
            nxt = steps[0][:, -1].argmax(-1)[:, None]
        prompt = torch.randint(0, cfg.vocab, (1, 5), generator=gen)
        parts = [(nxt, torch.tensor([0, 1, 2]), None), (prompt, slice(3, 4), None)]
        mixed = [m.mixed_step(c, parts) for m, c in pairs]
        for a, b in zip(mixed[0], mixed[1], strict=True):
            torch.testing.assert_close(b, a, **TOL)
    print(f"logits ok: {name}", flush=True)


def engine_tokens(whole: Transformer, part: Transformer) -> None:
    requests = lognormal_columns(10, median=6, sigma=0.8, max_output=14, prompt_len=7, seed=3)
    requests = list(requests)
    chunked = dict(chunked_prefill=True, max_num_batched_tokens=8, chunk_size=3)
    runs = [("static", {}), ("continuous", {}), ("continuous", chunked)]
    for policy, settings in runs:
        one = Engine(whole, policy, 4, seed=2, **settings).run(requests)
        many = Engine(part, policy, 4, seed=2, **settings).run(requests)
        assert dict(many.tokens) == dict(one.tokens), (policy, settings)
        assert many.total_steps == one.total_steps
    for r in requests[:3]:
        assert run_alone(part, r, seed=2) == one.tokens[r.id]
    print("engine ok: tokens equal", flush=True)


def checkpoints(folders: list[str], world) -> None:
    from benchbatch.runtime import checkpoint

    for folder in folders:
        whole, _ = checkpoint.load(folder, "cpu", torch.float32)
        part, _ = checkpoint.load(folder, "cpu", torch.float32, shard=tensor_parallel.of(world))
        compare(f"checkpoint {folder.rsplit('/', 1)[-1]}", whole, part)


def main(folders: list[str]) -> None:
    torch.set_num_threads(1)
    world = distributed.start(torch.device("cpu"), None)
    shard = tensor_parallel.of(world)
    assert shard is not None and shard.size == world.size
    for name, cfg in SHAPES.items():
        compare(name, Transformer(cfg, seed=5), Transformer(cfg, seed=5, shard=shard))
    cfg = preset("tiny")
    engine_tokens(Transformer(cfg, seed=7), Transformer(cfg, seed=7, shard=shard))
    checkpoints(folders, world)
    distributed.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
