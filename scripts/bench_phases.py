"""Benchmark: phases at a CPU-sized model, and decode bandwidth against plain torch.

A batch-1 decode step reads every weight once, so on a machine whose caches hold a small
part of the weights it should move bytes at close to the memory bandwidth. This script
measures, side by side in one run: the phases rows of a model, and a plain matrix-vector
product over a weight of the same total size (what the memory system gives to torch).
It prints a table, then one JSON line.

    python scripts/bench_phases.py [--hidden 1024] [--layers 8] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from benchbatch import accounting, device
from benchbatch.config import preset
from benchbatch.engines.model import Transformer
from benchbatch.probes import steps
from benchbatch.timing import TimingOptions, measure


def plain_matvec_gbps(weight_bytes: int, dev: torch.device, dtype, opts) -> float:
    """GB/s of x @ W.T with one row, W as large as the model's matmul weights."""
    cols = 4096
    rows = max(1, weight_bytes // (cols * torch.finfo(dtype).bits // 8))
    w = torch.randn(rows, cols, device=dev, dtype=dtype)
    x = torch.randn(1, cols, device=dev, dtype=dtype)
    m = measure(lambda: x @ w.T, dev, opts)
    return w.nbytes / (m.median_ms / 1e3) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    target = device.resolve(args.device)
    cfg = preset("article").replace(hidden=args.hidden, layers=args.layers)
    opts = TimingOptions(min_repeats=args.repeats, min_time_s=0.5)
    model = Transformer(cfg, target.device, target.dtype)
    plan = [steps.prefill(1, p) for p in (128, 512)] + [steps.decode(b, 512) for b in (1, 8, 32)]
    rows = [steps.run_step(model, target.dtype_name, s, opts) for s in plan]
    weights = accounting.weight_bytes(cfg, target.dtype_name)
    plain = plain_matvec_gbps(weights, target.device, target.dtype, opts)
    decode1 = next(r for r in rows if r["label"] == "decode b=1")
    print(
        f"{device.device_name(target.device)}, {torch.get_num_threads()} threads, "
        f"{target.dtype_name}, hidden {cfg.hidden}, {cfg.layers} layers, "
        f"weights {weights / 1e6:.0f} MB"
    )
    print(f"{'step':<14}{'ms':>9}{'us/token':>11}{'GFLOP/s':>10}{'GB/s':>8}{'CV':>7}")
    for r in rows:
        print(
            f"{r['label']:<14}{r['step_ms']:>9.2f}{r['us_per_token']:>11.1f}"
            f"{r['tflops'] * 1e3:>10.1f}{r['gbps']:>8.2f}{r['cv']:>7.2f}"
        )
    ratio = decode1["gbps"] / plain
    print(
        f"decode b=1 moves {decode1['gbps']:.2f} GB/s; a plain matrix-vector product over "
        f"the same bytes {plain:.2f} GB/s (ratio {ratio:.2f})"
    )
    print(
        json.dumps(
            {
                "machine": platform.machine(),
                "device": device.device_name(target.device),
                "threads": torch.get_num_threads(),
                "dtype": target.dtype_name,
                "hidden": cfg.hidden,
                "layers": cfg.layers,
                "rows": {
                    r["label"]: {
                        "step_ms": r["step_ms"],
                        "gbps": r["gbps"],
                        "tflops": r["tflops"],
                        "cv": r["cv"],
                    }
                    for r in rows
                },
                "plain_matvec_gbps": plain,
                "decode_b1_over_plain": ratio,
            }
        )
    )


if __name__ == "__main__":
    main()
