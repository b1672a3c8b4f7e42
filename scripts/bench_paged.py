"""Benchmark: the price of paging, a decode step through block tables against contiguous rows.

The paged cache (PagedKVCache) keeps keys and values in blocks scattered over a pool and
reads each sequence's blocks through its block table: one gather per layer, which a
contiguous cache (a row per sequence, read as a view) does not pay. This script times the
article's decode steps (batch 1, 32 and 128 at context 512) in both layouts, alternating
them (A B A B ...) so drift on a shared machine falls on both alike, and prints the median
of each layout's rounds and the ratio, then one JSON line.

    python scripts/bench_paged.py [--preset cpu-small] [--rounds 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch

from benchbatch.core.config import preset
from benchbatch.runtime import device, steps
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import TimingOptions

LAYOUTS = ("contiguous", "paged")


def rounds(model, batch: int, context: int, opts, n: int, block_size: int) -> dict:
    """n rounds of A then B (the order flipped every other round): each layout's medians."""
    step = steps.decode(batch, context)
    out: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for i in range(n):
        for layout in LAYOUTS if i % 2 == 0 else LAYOUTS[::-1]:
            m = steps.time_step(model, step, opts, kv_layout=layout, block_size=block_size)
            out[layout].append(m.median_ms)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu-small")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batches", default="1,32,128")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--min-time", type=float, default=0.3)
    args = parser.parse_args()
    target = device.resolve(args.device)
    cfg = preset(args.preset)
    model = Transformer(cfg, target.device, target.dtype)
    opts = TimingOptions(min_repeats=5, min_time_s=args.min_time)
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"{device.device_name(target.device)}, {torch.get_num_threads()} threads, "
        f"{target.dtype_name}, {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers), decode "
        f"at context {args.context}, blocks of {args.block_size}, {args.rounds} rounds A B"
    )
    print(f"{'decode':<10}{'contiguous ms':>15}{'paged ms':>11}{'paged/contig':>14}{'spread':>9}")
    results = {}
    for b in batches:
        times = rounds(model, b, args.context, opts, args.rounds, args.block_size)
        med = {layout: statistics.median(times[layout]) for layout in LAYOUTS}
        ratios = [p / c for p, c in zip(times["paged"], times["contiguous"], strict=True)]
        spread = max(ratios) - min(ratios)
        results[b] = {**{f"{k}_ms": v for k, v in med.items()}, "ratios": ratios}
        print(
            f"{'b=' + str(b):<10}{med['contiguous']:>15.2f}{med['paged']:>11.2f}"
            f"{med['paged'] / med['contiguous']:>14.3f}{spread:>9.3f}"
        )
    print("(spread: largest minus smallest per-round ratio)")
    doc = {
        "machine": platform.machine(),
        "device": device.device_name(target.device),
        "threads": torch.get_num_threads(),
        "dtype": target.dtype_name,
        "model": cfg.name,
        "context": args.context,
        "block_size": args.block_size,
        "rounds": args.rounds,
        "results": results,
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
