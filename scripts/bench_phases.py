"""Benchmark: phases at a CPU-sized model, and decode bandwidth against plain torch.

A batch-1 decode step reads every weight once, so on a machine whose caches hold a small
part of the weights it should move bytes at close to the memory bandwidth. This script
measures, side by side in one run: the phases rows of a model, and a plain matrix-vector
product over a weight as large as all the model's parameters (accounting.weight_bytes: the
embedding table and rotary tables counted too, so somewhat more than a decode step reads;
what the memory system gives to torch). The decode b=1 comparison is --rounds alternating
rounds (step, then the plain product): each side's median GB/s over those rounds and the
median of the rounds' ratios, so load from other processes hits both alike (the table's
rows are a separate, earlier measurement). The model's weights are laid out as the commands
lay them out (runtime/layout.py measures the device's faster layout); --layout
rows|columns|packed forces one, to compare. It prints a table, then one JSON line (with the
machine, threads and the load average before and after).

    python scripts/bench_phases.py [--hidden 1024] [--layers 8] [--device auto] [--rounds 5]
        [--threads N] [--compile] [--decode-only]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch
from script_common import load_line, load_now, machine, positive_int

from benchbatch.core import accounting
from benchbatch.core.config import preset
from benchbatch.runtime import compiled, device, layout, steps
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import TimingOptions, measure


def plain_matvec_gbps(weight_bytes: int, dev: torch.device, dtype, opts) -> float:
    """GB/s of x @ W.T with one row, W of weight_bytes (all the model's parameters)."""
    cols = 4096
    rows = max(1, weight_bytes // (cols * torch.finfo(dtype).bits // 8))
    w = torch.randn(rows, cols, device=dev, dtype=dtype)
    x = torch.randn(1, cols, device=dev, dtype=dtype)
    m = measure(lambda: x @ w.T, dev, opts)
    return w.nbytes / (m.median_ms / 1e3) / 1e9


def alternating_rounds(models: dict, dtype_name: str, weights: int, opts, rounds: int
                       ) -> dict[str, list[float]]:  # fmt: skip
    """Each round's decode b=1 GB/s of each model and the plain product's (each model's
    step in turn, then the plain product): {name: [GB/s a round], "plain": [...]}."""
    first = next(iter(models.values())).embed.weight
    out: dict[str, list[float]] = {name: [] for name in (*models, "plain")}
    for _ in range(rounds):
        for n, m in models.items():
            out[n].append(steps.run_step(m, dtype_name, steps.decode(1, 512), opts)["gbps"])
        out["plain"].append(plain_matvec_gbps(weights, first.device, first.dtype, opts))
    return out


def ratios_of(gbps: dict[str, list[float]], name: str) -> list[float]:
    """A model's GB/s over the plain product's, round by round."""
    return [a / b for a, b in zip(gbps[name], gbps["plain"], strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=positive_int, default=10)
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="alternating decode/plain rounds (default 5)")  # fmt: skip
    parser.add_argument("--layout", choices=("measured", "rows", "columns", "packed"),
                        default="measured")  # fmt: skip
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="default: torch's choice")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="steps through torch.compile")
    parser.add_argument("--decode-only", action="store_true", help="skip the prefill rows")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    before = load_now()
    target = device.resolve(args.device)
    cfg = preset("article").replace(hidden=args.hidden, layers=args.layers)
    opts = TimingOptions(min_repeats=args.repeats, min_time_s=0.5)
    model = Transformer(cfg, target.device, target.dtype)
    chosen = {"rows": layout.ROWS, "columns": layout.WeightLayout(columns=True),
              "packed": layout.PACKED}  # fmt: skip
    model.lay_out(chosen.get(args.layout) or layout.choose(model))
    models = {"eager": model}
    if args.compile:  # an eager twin stays, to alternate with (same seed: same weights)
        twin = Transformer(cfg, target.device, target.dtype).lay_out(model.layout)
        compiled.compile_model(twin, on_fallback=print)
        model = models["compiled"] = twin
    plan = [] if args.decode_only else [steps.prefill(1, p) for p in (128, 512)]
    plan += [steps.decode(b, 512) for b in (1, 8, 32)]
    rows = [steps.run_step(model, target.dtype_name, s, opts) for s in plan]
    weights = accounting.weight_bytes(cfg, target.dtype_name)
    gbps = alternating_rounds(models, target.dtype_name, weights, opts, args.rounds)
    every = {name: ratios_of(gbps, name) for name in models}
    shown = "compiled" if args.compile else "eager"
    ratios = every[shown]
    host = machine(threads=torch.get_num_threads()) | {"load_before": before}
    print(
        f"{device.device_name(target.device)}, {torch.get_num_threads()} threads, "
        f"{target.dtype_name}, hidden {cfg.hidden}, {cfg.layers} layers, "
        f"weights {weights / 1e6:.0f} MB, layout {model.layout.name}"
        + (f", compiled ({model.compiled.info})" if args.compile else ", eager")
    )
    print(f"{'step':<14}{'ms':>9}{'us/token':>11}{'GFLOP/s':>10}{'GB/s':>8}{'CV':>7}"
          f"{'compile s':>11}")  # fmt: skip
    for r in rows:
        print(
            f"{r['label']:<14}{r['step_ms']:>9.2f}{r['us_per_token']:>11.1f}"
            f"{r['tflops'] * 1e3:>10.1f}{r['gbps']:>8.2f}{r['cv']:>7.2f}"
            f"{r.get('compile_s', 0.0):>11.1f}"
        )
    ratio = statistics.median(ratios)
    decode1, plain = statistics.median(gbps[shown]), statistics.median(gbps["plain"])
    print(
        f"over {len(ratios)} alternating rounds: decode b=1 moves {decode1:.2f} GB/s, a plain "
        f"matrix-vector product over {weights / 1e6:.0f} MB {plain:.2f} GB/s (medians); the "
        f"rounds' ratios {', '.join(f'{r:.2f}' for r in ratios)}, median {ratio:.2f}; "
        f"{load_line(before)}"
    )
    if args.compile:
        eager = statistics.median(every["eager"])
        slower = statistics.median(e / c for e, c in zip(every["eager"], ratios, strict=True))
        print(f"eager twin, same rounds: ratio {eager:.2f}; compiled over eager step time "
              f"{slower:.2f}")  # fmt: skip
    print(
        json.dumps(
            {
                "machine": platform.machine(),
                "host": host,
                "device": device.device_name(target.device),
                "threads": torch.get_num_threads(),
                "dtype": target.dtype_name,
                "hidden": cfg.hidden,
                "layers": cfg.layers,
                "layout": model.layout.name,
                "compile": model.compiled.info if args.compile else None,
                "rows": {
                    r["label"]: {
                        "step_ms": r["step_ms"],
                        "gbps": r["gbps"],
                        "tflops": r["tflops"],
                        "cv": r["cv"],
                        "compile_s": r.get("compile_s"),
                    }
                    for r in rows
                },
                "plain_matvec_gbps": plain,
                "decode_b1_gbps": decode1,
                "decode_b1_over_plain": ratio,
                "decode_b1_over_plain_rounds": every,
                "rounds_gbps": gbps,
            }
        )
    )


if __name__ == "__main__":
    main()
