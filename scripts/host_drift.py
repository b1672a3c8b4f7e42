"""Benchmark: how far the device's own speed moves while nothing of the run changes.

One fixed piece of work, the decode-like product of 8 rows by a 2048 x 2048 fp32 weight
(16 MiB, past a core's L2 and inside a shared L3), repeated on one pinned thread and timed
on that thread's CPU clock (other processes' turns on the core do not count), averaged over
windows of --window seconds: first with the machine as it is, then beside a busy loop on
another core (started and stopped by this script, by its pid), then as it is again. The
spread of the windows in each phase is the drift a calibration made in one window meets in
the next: what the simulation's prediction cannot know in advance (prediction.csv's
steps_over_price measures it after a run). It prints a line a window, then a summary of
each phase (median, p10-p90, lowest-highest, each over the first phase's median) and one
JSON line.

    python scripts/host_drift.py [--quiet 30] [--busy 120] [--after 60] [--window 5]
        [--core N] [--busy-core M]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from script_common import load_now, machine


def window(w: torch.Tensor, x: torch.Tensor, seconds: float) -> float:
    """The work's CPU time per repeat over one window, in microseconds."""
    n, cpu0, t0 = 0, time.thread_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            x @ w
        n += 20
    return (time.thread_time() - cpu0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", type=float, default=30, help="seconds as is, first (30)")
    parser.add_argument("--busy", type=float, default=120,
                        help="seconds beside the busy loop (120)")  # fmt: skip
    parser.add_argument("--after", type=float, default=60, help="seconds as is, after (60)")
    parser.add_argument("--window", type=float, default=5, help="seconds a window (5)")
    cpus = sorted(os.sched_getaffinity(0))
    parser.add_argument("--core", type=int, default=cpus[-1],
                        help="the core the work is pinned to (default the last, as "
                        "benchbatch's engine)")  # fmt: skip
    parser.add_argument("--busy-core", type=int, default=cpus[0],
                        help="the busy loop's core (default the first)")  # fmt: skip
    args = parser.parse_args()
    if args.window <= 0 or min(args.quiet, args.busy, args.after) < 0:
        parser.error("--window must be positive, the phases' seconds 0 or more")
    if args.quiet < args.window:  # the first phase is every ratio's baseline
        parser.error(f"--quiet: at least one window ({args.window:g} s), got {args.quiet:g}")
    for name in ("busy", "after"):
        if 0 < getattr(args, name) < args.window:
            parser.error(f"--{name}: 0 (none) or at least one window ({args.window:g} s), got "
                         f"{getattr(args, name):g}")  # fmt: skip
    for name in ("core", "busy_core"):
        if getattr(args, name) not in cpus:
            parser.error(f"--{name.replace('_', '-')}: a core this process may use {cpus}")
    if args.busy and args.core == args.busy_core:
        parser.error(f"--busy-core: another core than the work's (--core {args.core})")
    before = load_now()
    os.sched_setaffinity(0, {args.core})
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(2048, 2048, generator=gen), torch.randn(8, 2048, generator=gen)
    phases: dict[str, list[float]] = {}
    for phase, seconds in (("as is", args.quiet), ("busy", args.busy), ("after", args.after)):
        loop = None
        if phase == "busy" and seconds:
            loop = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, "
                                     f"{{{args.busy_core}}})\nwhile True: pass"])  # fmt: skip
        try:
            for i in range(int(seconds / args.window)):
                us = window(w, x, args.window)
                phases.setdefault(phase, []).append(us)
                print(f"{phase:>6} {i * args.window:5.0f} s  {us:8.1f} us CPU a repeat",
                      file=sys.stderr, flush=True)  # fmt: skip
        finally:
            if loop is not None:
                os.kill(loop.pid, 15)
                loop.wait()
    first = statistics.median(phases["as is"])
    rows = []
    for phase, values in phases.items():
        v = np.array(values)
        rows.append({"phase": phase, "windows": len(v), "median_us": statistics.median(values),
                     "p10_us": float(np.percentile(v, 10)), "p90_us": float(np.percentile(v, 90)),
                     "low_us": float(v.min()), "high_us": float(v.max())})  # fmt: skip
    print(f"CPU time of one fixed repeat, per {args.window:g}-s window, on core {args.core} "
          f"({platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs; "
          f"busy loop on core {args.busy_core}); x: over the first phase's (as is) median")
    for r in rows:
        print(f"{r['phase']:>6}: median {r['median_us']:7.1f} us (x{r['median_us'] / first:.2f}), "
              f"p10-p90 x{r['p10_us'] / first:.2f}-x{r['p90_us'] / first:.2f}, "
              f"lowest-highest x{r['low_us'] / first:.2f}-x{r['high_us'] / first:.2f} "
              f"({r['windows']} windows)")  # fmt: skip
    print(json.dumps({"bench": "host_drift", "machine": machine(threads=1) | {
                      "load_before": before}, "window_s": args.window, "core": args.core,
                      "busy_core": args.busy_core, "phases": rows,
                      "windows": phases}))  # fmt: skip


if __name__ == "__main__":
    main()
