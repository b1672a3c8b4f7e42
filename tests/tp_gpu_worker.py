"""One rank of tests/test_gpu.py's tensor-parallel check (two GPUs, NCCL).

Each rank takes cuda:LOCAL_RANK, builds the tiny model sharded over the ranks and the whole
model, compares a prefill and a cached decode step in fp16, then replays the sharded decode
step from a CUDA graph (its all-reduces and gather captured on NCCL) and checks the replay
gives the eager logits.

    python tests/tp_gpu_worker.py
"""

from __future__ import annotations

import os

import torch

from benchbatch.core.config import preset
from benchbatch.runtime import backend, distributed, tensor_parallel
from benchbatch.runtime.model import Transformer

TOL = dict(rtol=2e-2, atol=2e-2)  # fp16, sums in another order


@torch.no_grad()
def main() -> None:
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    world = distributed.start(dev, None)
    backend.of(dev).make_current()
    cfg = preset("tiny").replace(hidden=128)
    whole = Transformer(cfg, dev, torch.float16, seed=3)
    part = Transformer(cfg, dev, torch.float16, seed=3, shard=tensor_parallel.of(world))
    gen = torch.Generator(device=dev).manual_seed(0)  # the same prompt on every rank
    ids = torch.randint(0, cfg.vocab, (4, 24), device=dev, generator=gen)
    caches = whole.new_cache(4, 32), part.new_cache(4, 32)
    first = [m.step(ids, c, slice(0, 4), kv_len=24) for m, c in zip((whole, part), caches,
                                                                     strict=True)]  # fmt: skip
    torch.testing.assert_close(first[1].float(), first[0].float(), **TOL)
    nxt = first[0][:, -1].argmax(-1)[:, None]
    out = {}

    def decode():
        caches[1].lengths.fill_(24)
        out["x"] = part.step(nxt, caches[1], slice(0, 4), kv_len=25)

    decode()
    eager = out["x"].clone()
    replay = backend.of(dev).capture(decode)
    out["x"].zero_()
    replay()
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(out["x"], eager)
    caches[0].lengths.fill_(24)
    whole_logits = whole.step(nxt, caches[0], slice(0, 4), kv_len=25)
    torch.testing.assert_close(eager.float(), whole_logits.float(), **TOL)
    print(f"rank {world.rank}: sharded decode replayed from a CUDA graph on NCCL", flush=True)
    distributed.stop()


if __name__ == "__main__":
    main()
