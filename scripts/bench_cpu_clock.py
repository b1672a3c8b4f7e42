#!/usr/bin/env python3
"""The CPU clock against the wall clock on a shared machine: `benchbatch phases` on the quiet
machine and with other processes competing for the cores, alternating (the order flipped
each round: A B, B A, ...), and how far each clock's step times moved.

    python3 scripts/bench_cpu_clock.py [--rounds 2] [--hogs 3] [--out DIR [--force]]

Each round runs `phases --preset cpu-small --prefill 512 --decode-batch 1,8,32 --context 512
--no-roofline --threads 1` twice: as the machine is, then beside `--hogs` processes (half of
them busy loops, half torch matrix-vector and matrix products on one thread, none pinned),
which the script starts and stops. It prints, per step, the median over the rounds of
step_ms (the compute thread's CPU time) and wall_ms in each condition, loaded over quiet
for each clock, and the loaded runs' core_share; then one JSON line (with the machine, the
threads and each run's load average before it). A non-empty --out is refused unless
--force. Nothing here is a test: the machine is shared, so this is a measurement to quote,
with the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from script_common import fresh_folder, load_now, machine, positive_int, run_child

REPO = Path(__file__).resolve().parent.parent
PHASES = ["phases", "--preset", "cpu-small", "--prefill", "512", "--decode-batch", "1,8,32",
          "--context", "512", "--no-roofline", "--threads", "1"]  # fmt: skip
BUSY = "while True: pass"
TORCH = (
    "import torch\ntorch.set_num_threads(1)\n"
    "a = torch.randn(4096, 4096); x = torch.randn(4096, 1); b = torch.randn(1024, 1024)\n"
    "while True:\n    [a @ x for _ in range(20)]; b @ b"
)


def start_hogs(n: int) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        code = BUSY if i % 2 == 0 else TORCH
        procs.append(subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
    time.sleep(5)  # a benchmark's warm-up of the load (torch's import), not a test's wait
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def run_phases(out: Path) -> list[dict]:
    import pandas as pd

    cmd = [sys.executable, "-m", "benchbatch", *PHASES, "--out", str(out)]
    cmd += ["--force"] if out.exists() else []  # an earlier run's: main allowed it
    run_child(cmd, f"phases into {out}", cwd=REPO)
    rows = pd.read_csv(out / "phases.csv")
    return rows[["label", "step_ms", "wall_ms", "core_share"]].to_dict("records")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=positive_int, default=2, help="A B rounds (default 2)")
    ap.add_argument("--hogs", type=positive_int, default=3,
                    help="competing processes (default 3)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    ap.add_argument("--force", action="store_true", help="write into a non-empty --out")
    args = ap.parse_args()
    out = fresh_folder(ap, args.out, args.force) if args.out else None
    out = out or Path(tempfile.mkdtemp(prefix="bench-cpu-clock-"))
    runs: dict[str, list[list[dict]]] = {"quiet": [], "loaded": []}
    loads: dict[str, list[float]] = {"quiet": [], "loaded": []}
    for r in range(args.rounds):
        for cond in ("quiet", "loaded") if r % 2 == 0 else ("loaded", "quiet"):
            hogs = start_hogs(args.hogs) if cond == "loaded" else []
            try:
                loads[cond].append(load_now())
                runs[cond].append(run_phases(out / f"{cond}-{r}"))
            finally:
                stop(hogs)
            print(f"round {r} {cond} done (load {loads[cond][-1]:.1f})", file=sys.stderr)
    labels = [row["label"] for row in runs["quiet"][0]]

    def med(cond: str, label: str, key: str) -> float:
        return statistics.median(x[key] for run in runs[cond] for x in run if x["label"] == label)

    print(f"{'step':14s} {'cpu quiet':>10s} {'cpu loaded':>11s} {'x':>6s} "
          f"{'wall quiet':>11s} {'wall loaded':>12s} {'x':>6s} {'share':>6s}")  # fmt: skip
    table = []
    for label in labels:
        cq, cl = med("quiet", label, "step_ms"), med("loaded", label, "step_ms")
        wq, wl = med("quiet", label, "wall_ms"), med("loaded", label, "wall_ms")
        share = med("loaded", label, "core_share")
        table.append({"step": label, "cpu_quiet_ms": cq, "cpu_loaded_ms": cl, "cpu_ratio": cl / cq,
                      "wall_quiet_ms": wq, "wall_loaded_ms": wl, "wall_ratio": wl / wq,
                      "loaded_core_share": share})  # fmt: skip
        print(f"{label:14s} {cq:10.2f} {cl:11.2f} {cl / cq:6.2f} {wq:11.2f} {wl:12.2f} "
              f"{wl / wq:6.2f} {share:6.2f}")  # fmt: skip
    print(json.dumps({"machine": machine(threads=1), "rounds": args.rounds, "hogs": args.hogs,
                      "loads": loads, "steps": table}))  # fmt: skip


if __name__ == "__main__":
    main()
