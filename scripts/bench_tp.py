"""Benchmark (not a test): a tensor-parallel decode step, sharded by hand against torch's
tensor-parallel API, side by side.

A: benchbatch's own sharding (runtime/tensor_parallel.py): each rank builds its layers on
its shapes and calls the functional collectives' ops (one all-reduce after wo and after
w2, a gather of the logits). B: the whole model with torch's DTensor API, `DeviceMesh` and
`parallelize_module` with ColwiseParallel on wqkv and w13 (their rows laid out per rank
first, so each rank's contiguous block holds its heads and MLP slice), RowwiseParallel on
wo and w2, and ColwiseParallel(output_layouts=Replicate()) on the LM head. Both compute the
same logits (checked first); then decode steps are timed in rounds that alternate, the order
flipped each round (A B, B A, ...: drift and other load hit both alike), and the medians
compared. A timed step ends with its greedy tokens (the logits' argmax, as the engine
takes them), so each side waits its last collective inside the timing: DTensor's logits
come back as an AsyncCollectiveTensor whose gather is otherwise never waited. Every rank
times; the slower rank's round counts. Both models' weights are laid out as the commands
lay them out (runtime/layout.py measures the faster layout on the by-hand model; DTensor
takes its rows or columns, fused: its sharded weights cannot be split by slicing), or
--layout rows|columns. The JSON line names the machine, threads (1 a rank) and the load
average before and after.

    python scripts/bench_tp.py [--presets tiny,cpu-small] [--batch 1] [--context 128]
        [--rounds 8] [--steps 30] [--ranks 2] [--layout measured|rows|columns]

Without torchrun's environment it starts itself under torchrun (gloo on the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from script_common import load_line, load_now, machine, positive_int


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny,cpu-small")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--context", type=positive_int, default=128)
    p.add_argument("--rounds", type=positive_int, default=8)
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--ranks", type=positive_int, default=2)
    p.add_argument("--layout", choices=("measured", "rows", "columns"), default="measured",
                   help="the weights' layout (default: measured, as the commands choose)")
    args = p.parse_args(argv)
    from benchbatch.core.config import PRESETS

    args.presets = [name.strip() for name in args.presets.split(",")]
    if unknown := [name for name in args.presets if name not in PRESETS]:
        p.error(f"--presets: unknown {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    return args


def dtensor_model(cfg, seed: int, world):
    """The whole model, wqkv and w13 laid out per rank, then parallelize_module."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from benchbatch.core import sharding
    from benchbatch.runtime.model import Transformer
    from benchbatch.runtime.tensor_parallel import place

    tp = world.tp
    model = Transformer(cfg, seed=seed)
    local = sharding.local_config(cfg, tp)
    with torch.no_grad():
        for block in model.blocks:
            for name, linear in (("attention.wqkv", block.attention.wqkv),
                                 ("mlp.w13", block.mlp.w13)):  # fmt: skip
                whole = linear.weight.detach()
                parts = []
                for r in range(tp):
                    piece = sharding.piece(f"blocks.0.{name}.weight", cfg, tp, r)
                    dest = whole.new_empty(piece.size, whole.shape[1])
                    place(dest, whole, piece)
                    parts.append(dest)
                linear.weight = torch.nn.Parameter(torch.cat(parts))
            block.attention.cfg = local  # the forward views its local heads
            block.mlp.inter = local.intermediate
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    plan = {"lm_head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(cfg.layers):
        plan |= {
            f"blocks.{i}.attention.wqkv": ColwiseParallel(),
            f"blocks.{i}.attention.wo": RowwiseParallel(),
            f"blocks.{i}.mlp.w13": ColwiseParallel(),
            f"blocks.{i}.mlp.w2": RowwiseParallel(),
        }
    parallelize_module(model, mesh, plan)
    model.local_cfg = local  # its KV cache holds the local KV heads
    return model


def decode_call(model, batch: int, context: int):
    """One decode step at `context`, repeatable (the cache length reset inside): its
    logits, whose last collective may still be in flight (DTensor's)."""
    import torch

    cache = model.new_cache(batch, context + 1)
    gen = torch.Generator().manual_seed(0)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    tokens = torch.randint(0, model.cfg.vocab, (batch, 1), generator=gen)

    def step():
        cache.lengths.fill_(context)
        return model.step(tokens, cache, slice(0, batch), kv_len=context + 1)

    return step


def timed(fn, steps: int) -> float:
    """ms per step of `steps` calls, the slower rank's (a barrier first). Each step ends
    with its greedy tokens, so its last collective is waited inside the timing."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        fn().argmax(-1)
    ms = torch.tensor([(time.perf_counter() - start) * 1e3 / steps], dtype=torch.float64)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def compare(preset: str, args, world) -> dict:
    import torch

    from benchbatch.core.config import preset as shape
    from benchbatch.runtime import layout, tensor_parallel
    from benchbatch.runtime.model import Transformer

    cfg = shape(preset).replace(max_context=max(args.context + 1, 256))
    by_hand = Transformer(cfg, seed=1, shard=tensor_parallel.of(world))
    forced = {"rows": layout.ROWS, "columns": layout.WeightLayout(columns=True)}
    by_hand.lay_out(forced.get(args.layout) or layout.choose(by_hand))
    with_api = dtensor_model(cfg, 1, world)
    with_api.lay_out(layout.WeightLayout(columns=by_hand.layout.columns))
    calls = {"by hand": decode_call(by_hand, args.batch, args.context),
             "DTensor": decode_call(with_api, args.batch, args.context)}  # fmt: skip
    with torch.inference_mode():
        a, b = (call() for call in calls.values())
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        for call in calls.values():  # warm-up
            timed(call, 3)
        times = {k: [] for k in calls}
        for i in range(args.rounds):  # A B, B A, ...
            for name in list(calls) if i % 2 == 0 else list(calls)[::-1]:
                times[name].append(timed(calls[name], args.steps))
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "preset": preset,
        "batch": args.batch,
        "context": args.context,
        "by_hand_layout": by_hand.layout.name,
        "dtensor_layout": with_api.layout.name,
        "by_hand_ms": medians["by hand"],
        "dtensor_ms": medians["DTensor"],
        "dtensor_over_by_hand": medians["DTensor"] / medians["by hand"],
        "rounds": args.rounds,
        "steps_per_round": args.steps,
    }


def worker(args) -> None:
    import torch

    from benchbatch.runtime import distributed

    torch.set_num_threads(1)
    world = distributed.start(torch.device("cpu"), None)
    before = load_now()
    rows = [compare(p, args, world) for p in args.presets]
    if world.rank == 0:
        host = machine(threads=torch.get_num_threads()) | {"load_before": before}
        print(f"{host['cpu']}, {host['cpus']} logical CPUs, {world.size} ranks of "
              f"{host['threads']} thread, torch {torch.__version__}, {load_line(before)}")
        print(f"{'preset':<10} {'batch':>5} {'layout':>16} {'by hand ms':>11} {'DTensor ms':>11} "
              f"{'ratio':>6}")  # fmt: skip
        for r in rows:
            print(f"{r['preset']:<10} {r['batch']:>5} {r['by_hand_layout']:>16} "
                  f"{r['by_hand_ms']:>11.3f} {r['dtensor_ms']:>11.3f} "
                  f"{r['dtensor_over_by_hand']:>6.2f}")  # fmt: skip
        print(json.dumps({"machine": host, "torch": torch.__version__, "ranks": world.size,
                          "backend": world.backend, "rows": rows}))  # fmt: skip
    distributed.stop()


def main() -> None:
    args = parse()
    if "RANK" in os.environ:
        return worker(args)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(here))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.ranks}",
           __file__, *sys.argv[1:]]  # fmt: skip
    sys.exit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
