"""Benchmark: how slow a core comes back from idle, with no model and no engine.

One compute thread pinned to the last core multiplies a 64x512 by a 512x2048 matrix six
times an op (a few ms); after warming up, the op's median CPU time is the steady one. Then,
for each wait, ROUNDS times: sleep that long, and time the next 60 ops, each over the steady
time. Prints, per wait, the first op, the second, and the medians of ops 2-3, 4-9, 10-29 and
30-59, with when (ms after the wait) ops 1, 3, 8, 20 and 59 began. What benchbatch's
calibration measures as the core's wake (core/wake.py, docs/simulation.md) on the bare
device: if the first op after a wait is slow here, the engine's first step is too.

    python scripts/bench_idle_wake.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import time

import torch

WAITS_S = (0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="times each wait is taken (default 8)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: must be 1 or more")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    a, w = torch.randn(64, 512), torch.randn(512, 2048)

    def op() -> float:
        t = time.thread_time()
        for _ in range(6):
            a @ w
        return (time.thread_time() - t) * 1e3

    for _ in range(300):
        op()
    steady = st.median(op() for _ in range(200))
    print(f"steady op: {steady:.3f} ms of CPU time (1 thread, pinned)")
    for wait in WAITS_S:
        runs = []
        for _ in range(args.rounds):
            time.sleep(wait)
            t0, seq = time.perf_counter(), []
            for _ in range(60):
                seq.append((time.perf_counter() - t0, op() / steady))
            runs.append(seq)

        def med(i0: int, i1: int, runs=runs) -> float:
            return st.median(r[k][1] for r in runs for k in range(i0, i1))

        began = [st.median(r[k][0] for r in runs) * 1e3 for k in (1, 3, 8, 20, 59)]
        print(f"wait {wait:5g} s: op 0 x{med(0, 1):.2f}, op 1 x{med(1, 2):.2f}, "
              f"ops 2-3 x{med(2, 4):.2f}, 4-9 x{med(4, 10):.2f}, 10-29 x{med(10, 30):.2f}, "
              f"30-59 x{med(30, 60):.2f}; ops 1, 3, 8, 20, 59 began at "
              f"{', '.join(f'{b:.0f}' for b in began)} ms")  # fmt: skip


if __name__ == "__main__":
    main()
