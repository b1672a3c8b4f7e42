"""Benchmark (not a test): how fast the simulator is, and what the real engine's scheduling costs.

1. Simulating a large workload: 1,000,000 lognormal requests on 256 slots, both policies,
   with per-request metrics (seconds of wall time; it should take seconds).
2. The continuous engine's scheduling overhead: the run's wall time outside the model's
   forward (scheduling, building inputs, bookkeeping, and the host's gaps between steps)
   over its whole wall time (records' `overhead`), at 32 slots on a small model, with its
   weights laid out as the commands lay them out (runtime/layout.py; --layout forces one).
   It should stay under 5% (the table says where it does not): the engine must measure the
   model, not itself. A tiny model is shown beside it, where the forward is so short that
   the overhead shows.

It prints a table, then one JSON line (with the machine, threads and the load average
before and after).

    python scripts/bench_occupancy.py [--requests 1000000] [--slots 256] [--device auto]
        [--threads N] [--layout measured|rows|columns]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from script_common import load_line, load_now, machine, positive_int

from benchbatch.core.config import preset
from benchbatch.core.simulate import run_policies
from benchbatch.core.workload import lognormal_workload
from benchbatch.runtime import device, layout
from benchbatch.runtime.engine import Engine
from benchbatch.runtime.model import Transformer


def bench_simulation(requests: int, slots: int) -> dict:
    start = time.perf_counter()
    workload = lognormal_workload(requests, seed=0)
    made = time.perf_counter()
    results = run_policies(workload, slots)
    done = time.perf_counter()
    return {
        "requests": requests,
        "slots": slots,
        "workload_s": made - start,
        "simulate_s": done - made,
        "steps": {p: r.total_steps for p, r in results.items()},
        "occupancy": {p: r.occupancy for p, r in results.items()},
    }


TARGET = 0.05  # the engine's overhead should stay under this share of the run


def bench_engine(name: str, slots: int, requests: int, dev: torch.device, dtype, lay: str
                 ) -> dict:  # fmt: skip
    """The continuous engine on a workload that keeps every slot busy most steps."""
    model = Transformer(preset(name), dev, dtype)
    forced = {"rows": layout.ROWS, "columns": layout.WeightLayout(columns=True)}
    model.lay_out(forced.get(lay) or layout.choose(model))
    workload = lognormal_workload(requests, max_output=100, prompt_len=64, seed=0)
    Engine(model, "continuous", slots).run(workload[:slots])  # warm-up
    result = Engine(model, "continuous", slots).run(workload)
    outside_ms = [(s.step_s - s.model_s) * 1e3 for s in result.steps]
    return {
        "model": name,
        "weight_layout": model.layout.name,
        "slots": slots,
        "requests": requests,
        "steps": result.total_steps,
        "occupancy": result.occupancy,
        "median_step_ms": statistics.median(s.step_s * 1e3 for s in result.steps),
        "median_outside_ms": statistics.median(outside_ms),
        "overhead": result.overhead,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=positive_int, default=1_000_000)
    parser.add_argument("--slots", type=positive_int, default=256)
    parser.add_argument("--engine-slots", type=positive_int, default=32)
    parser.add_argument("--engine-requests", type=positive_int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads (default: torch's choice)")  # fmt: skip
    parser.add_argument("--layout", choices=("measured", "rows", "columns"), default="measured",
                        help="the weights' layout (default: measured, as the commands)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    before = load_now()
    target = device.resolve(args.device)
    sim = bench_simulation(args.requests, args.slots)
    engines = [
        bench_engine(name, args.engine_slots, args.engine_requests, target.device, target.dtype,
                     args.layout)  # fmt: skip
        for name in ("cpu-small", "tiny")
    ]
    print(
        f"{device.device_name(target.device)}, {torch.get_num_threads()} threads, "
        f"{target.dtype_name}"
    )
    print(
        f"simulate {sim['requests']:,} requests on {sim['slots']} slots: workload "
        f"{sim['workload_s']:.2f} s, both policies {sim['simulate_s']:.2f} s "
        f"(static {sim['steps']['static']:,} steps, continuous {sim['steps']['continuous']:,})"
    )
    print(f"{'engine':<11}{'slots':>6}{'steps':>7}{'step ms':>9}{'outside ms':>12}{'overhead':>10}"
          f"  layout")  # fmt: skip
    for e in engines:
        over = "  (over the 5% target)" if e["overhead"] >= TARGET else ""
        print(
            f"{e['model']:<11}{e['slots']:>6}{e['steps']:>7}{e['median_step_ms']:>9.2f}"
            f"{e['median_outside_ms']:>12.3f}{e['overhead']:>10.2%}  {e['weight_layout']}{over}"
        )
    print(f"overhead: the run's wall time outside the model's forward, host gaps included; "
          f"{load_line(before)}")  # fmt: skip
    print(
        json.dumps(
            {
                "machine": platform.machine(),
                "host": machine(threads=torch.get_num_threads()) | {"load_before": before},
                "device": device.device_name(target.device),
                "threads": torch.get_num_threads(),
                "dtype": target.dtype_name,
                "simulation": sim,
                "engine": engines,
            }
        )
    )


if __name__ == "__main__":
    main()
