"""Benchmark (not a test): how fast the simulator is, and what the real engine's scheduling costs.

1. Simulating a large workload: 1,000,000 lognormal requests on 256 slots, both policies,
   with per-request metrics (seconds of wall time; it should take seconds).
2. The continuous engine's scheduling overhead: the time a step spends outside the model's
   forward (scheduling, building inputs, bookkeeping) over the whole step time, at 32 slots
   on a small model. It should stay under 5%: the engine must measure the model, not itself.
   A tiny model is shown beside it, where the forward is so short that the overhead shows.

It prints a table, then one JSON line.

    python scripts/bench_occupancy.py [--requests 1000000] [--slots 256] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from benchbatch.core.config import preset
from benchbatch.core.simulate import run_policies
from benchbatch.core.workload import lognormal_workload
from benchbatch.runtime import device
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


def bench_engine(name: str, slots: int, requests: int, dev: torch.device, dtype) -> dict:
    """The continuous engine on a workload that keeps every slot busy most steps."""
    model = Transformer(preset(name), dev, dtype)
    workload = lognormal_workload(requests, max_output=100, prompt_len=64, seed=0)
    Engine(model, "continuous", slots).run(workload[:slots])  # warm-up
    result = Engine(model, "continuous", slots).run(workload)
    outside_ms = [(s.step_s - s.model_s) * 1e3 for s in result.steps]
    return {
        "model": name,
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
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--engine-slots", type=int, default=32)
    parser.add_argument("--engine-requests", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    target = device.resolve(args.device)
    sim = bench_simulation(args.requests, args.slots)
    engines = [
        bench_engine(name, args.engine_slots, args.engine_requests, target.device, target.dtype)
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
    print(f"{'engine':<11}{'slots':>6}{'steps':>7}{'step ms':>9}{'outside ms':>12}{'overhead':>10}")
    for e in engines:
        print(
            f"{e['model']:<11}{e['slots']:>6}{e['steps']:>7}{e['median_step_ms']:>9.2f}"
            f"{e['median_outside_ms']:>12.3f}{e['overhead']:>10.2%}"
        )
    print(
        json.dumps(
            {
                "machine": platform.machine(),
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
