"""Benchmark: the engine's steps with packed weights (oneDNN's prepacked linear) against the
fastest strided layout, side by side, and packed with its row floor against without.

runtime/layout.py chooses a model's weight layout per device by timing its projections
alone; this measures what the choice does to whole steps (attention, norms and the host's
work included): the same model three times, one in the strided layout the chooser takes
without PACKED, one PACKED with no floor, one PACKED at the floor row_floor measures here
(products of fewer rows padded to it), each step timed by the harness
(runtime/steps.run_step: median of its repeats) in alternating rounds (forward, then
backward). Per step the median of each side's rounds and the medians of the rounds' ratios
(above 1, the second side is faster). It prints a table, then one JSON line with the
machine, threads, floor and the load before and after.

    python scripts/bench_packed.py [--preset cpu-small] [--rounds 5] [--threads 1] [--core N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
from script_common import load_line, load_now, machine, positive_int

from benchbatch.core.config import PRESETS, preset
from benchbatch.runtime import device, layout, steps
from benchbatch.runtime.layout import WeightLayout
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.timing import TimingOptions


def plan(max_context: int) -> list[steps.Step]:
    """Prefills of 128 and 512 tokens and decodes at 1, 2, 4, 8 and 32 sequences over 512
    (each within the model's context)."""
    context = min(512, max_context - 1)
    return [steps.prefill(1, min(p, max_context)) for p in (128, 512)] + [
        steps.decode(b, context) for b in (1, 2, 4, 8, 32)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="alternating rounds (default 5)")  # fmt: skip
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="at least this many timed repeats of each step a round")  # fmt: skip
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="compute threads (default 1, as the commands choose here)")
    parser.add_argument("--core", type=int, default=None,
                        help="pin to this CPU (default: not pinned)")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.core is not None:
        if args.core not in os.sched_getaffinity(0):
            parser.error(f"--core {args.core}: not one of this process's CPUs")
        os.sched_setaffinity(0, {args.core})
    before = load_now()
    target = device.resolve("cpu")
    if not layout.packable(target.device, target.dtype):
        raise SystemExit(f"no oneDNN prepacked linear for {target.dtype_name} here: nothing "
                         "to compare")  # fmt: skip
    cfg = preset(args.preset)
    strided = Transformer(cfg, target.device, target.dtype, seed=0)
    strided.lay_out(layout.choose(strided, packed=False))
    floor = layout.row_floor(cfg, target.device, target.dtype)
    models = {"strided": strided}
    padded = WeightLayout(packed=True, floor=floor)
    for name, lay in (("packed", layout.PACKED), ("padded", padded)):
        models[name] = Transformer(cfg, target.device, target.dtype, seed=0).lay_out(lay)
    opts = TimingOptions(min_repeats=args.repeats, min_time_s=0.2)
    times: dict[str, dict[str, list[float]]] = {}
    for i in range(args.rounds):
        order = list(models) if i % 2 == 0 else list(reversed(models))
        for step in plan(cfg.max_context):
            for name in order:
                row = steps.run_step(models[name], target.dtype_name, step, opts)
                times.setdefault(row["label"], {m: [] for m in models})[name].append(row["step_ms"])
    host = machine(threads=args.threads) | {"load_before": before, "core": args.core}
    print(f"{host['cpu']}, {args.threads} thread(s){'' if args.core is None else f' on CPU {args.core}'}, "  # noqa: E501
          f"{target.dtype_name}, preset {args.preset}, {args.rounds} rounds; strided layout: "
          f"{strided.layout.name}; padded to {floor} rows; {load_line(before)}")  # fmt: skip
    pairs = (("strided", "packed"), ("strided", "padded"), ("packed", "padded"))
    print(f"{'step':<14}" + "".join(f"{m + ' ms':>12}" for m in models)
          + "".join(f"{a + '/' + b:>17}" for a, b in pairs))  # fmt: skip
    out = {}
    for label, t in times.items():
        ms = {m: statistics.median(v) for m, v in t.items()}
        ratios = {f"{a}/{b}": [x / y for x, y in zip(t[a], t[b], strict=True)] for a, b in pairs}
        medians = {k: statistics.median(v) for k, v in ratios.items()}
        print(f"{label:<14}" + "".join(f"{ms[m]:>12.2f}" for m in models)
              + "".join(f"{medians[k]:>17.2f}" for k in ratios))  # fmt: skip
        out[label] = {"ms": ms, "ratio": medians, "ratios": ratios}
    print(json.dumps({"host": host, "preset": args.preset, "dtype": target.dtype_name,
                      "strided_layout": strided.layout.name, "floor": floor,
                      "load_after": load_now(), "steps": out}))  # fmt: skip

if __name__ == "__main__":
    main()
