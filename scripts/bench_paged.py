"""Benchmark: the price of paging, a decode step through block tables against contiguous rows.

The paged cache (PagedKVCache) keeps keys and values in blocks scattered over a pool and
reads each sequence's blocks through its block table: one gather per layer, which a
contiguous cache (a row per sequence, read as a view) does not pay. This script times the
article's decode steps (batch 1, 32 and 128 at context 512) in both layouts, alternating
them, the order flipped each round (A B, B A, ...), so drift on a shared machine falls on
both alike, and prints the median of each layout's rounds and the ratio, then one JSON line
(with the machine, threads and the load average before and after). The model's weights are
laid out as the commands lay them out (runtime/layout.py; --layout forces one); --threads 1
is the setting that measures the memory on a shared machine (docs/benchmarks.md).

    python scripts/bench_paged.py [--preset cpu-small] [--rounds 4] [--device auto]
        [--threads N] [--layout measured|rows|columns]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch
from script_common import int_list, load_line, load_now, machine, positive_float, positive_int

from benchbatch.core.config import preset
from benchbatch.runtime import device, layout, steps
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import TimingOptions

LAYOUTS = ("contiguous", "paged")


def rounds(model, batch: int, context: int, opts, n: int, block_size: int) -> dict:
    """n rounds of A then B (the order flipped every other round): each layout's medians."""
    step = steps.decode(batch, context)
    out: dict[str, list[float]] = {kv: [] for kv in LAYOUTS}
    for i in range(n):
        for kv in LAYOUTS if i % 2 == 0 else LAYOUTS[::-1]:
            m = steps.time_step(model, step, opts, kv_layout=kv, block_size=block_size)
            out[kv].append(m.median_ms)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu-small")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batches", type=int_list, default=[1, 32, 128],
                        help="decode batches, comma-separated (default 1,32,128)")  # fmt: skip
    parser.add_argument("--context", type=positive_int, default=512)
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--rounds", type=positive_int, default=4)
    parser.add_argument("--min-time", type=positive_float, default=0.3)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads (default: torch's choice)")  # fmt: skip
    parser.add_argument("--layout", choices=("measured", "rows", "columns"), default="measured",
                        help="the weights' layout (default: measured, as the commands)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    before = load_now()
    target = device.resolve(args.device)
    cfg = preset(args.preset)
    model = Transformer(cfg, target.device, target.dtype)
    forced = {"rows": layout.ROWS, "columns": layout.WeightLayout(columns=True)}
    model.lay_out(forced.get(args.layout) or layout.choose(model))
    opts = TimingOptions(min_repeats=5, min_time_s=args.min_time)
    batches = args.batches
    print(
        f"{device.device_name(target.device)}, {torch.get_num_threads()} threads, "
        f"{target.dtype_name}, {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers, weights "
        f"{model.layout.name}), decode at context {args.context}, blocks of {args.block_size}, "
        f"{args.rounds} rounds A B, B A, ..."
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
    print(f"(spread: largest minus smallest per-round ratio); {load_line(before)}")
    doc = {
        "machine": platform.machine(),
        "host": machine(threads=torch.get_num_threads()) | {"load_before": before},
        "weight_layout": model.layout.name,
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
