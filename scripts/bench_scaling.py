"""Benchmark (not a test): how the occupancy simulation's cost grows with the work.

For each size (default 10k, 100k, 1M and 10M requests on 256 slots) a fresh Python process
runs the whole `benchbatch occupancy` pipeline minus the CLI: the lognormal workload drawn
as columns, both policies simulated, the occupancy rows and the run-length timeline table,
occupancy.csv and timeline.csv written, and the figure drawn. It reports the wall time of
each stage and of the whole, and the process's peak memory (RSS, so each size is measured
on its own), then one JSON line (with the machine and each size's load average before and
after; the pipeline is single-threaded Python and numpy). Cost should grow about linearly
with the requests.

    python scripts/bench_scaling.py [--sizes 10000,100000,1000000,10000000] [--slots 256]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from script_common import int_list, load_now, machine, positive_int, run_child

STAGES = ("workload", "simulate", "tables", "csv", "figure")


def run_one(requests: int, slots: int, folder: Path) -> dict:
    """The pipeline at one size, in this process: stage times and sizes of what it wrote."""
    started = time.perf_counter()
    from benchbatch.core.simulate import occupancy_rows, run_policies, timeline_table
    from benchbatch.core.workload import lognormal_columns
    from benchbatch.output import results
    from benchbatch.output.plots.occupancy import occupancy_figure

    imported = time.perf_counter()
    rss_after_imports = _peak_rss_mib()
    times = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        times[stage], clock = now - clock, now

    workload = lognormal_columns(requests, seed=0)
    lap("workload")
    sims = run_policies(workload, slots)
    lap("simulate")
    rows = [{"seed": 0, **row} for row in occupancy_rows(sims)]
    timeline = timeline_table(sims)
    lap("tables")
    results.write_csv(folder / "occupancy.csv", rows)
    results.write_csv(folder / "timeline.csv", timeline)
    lap("csv")
    title = f"{requests:,} requests, {slots} slots: active slots per step"
    occupancy_figure(timeline, rows, folder / "occupancy.png", title)
    lap("figure")
    return {
        "requests": requests,
        "slots": slots,
        "wall_s": clock - imported,
        "import_s": imported - started,
        **{f"{stage}_s": times[stage] for stage in STAGES},
        "peak_rss_mib": _peak_rss_mib(),
        "rss_after_imports_mib": rss_after_imports,
        "steps": {p: r.total_steps for p, r in sims.items()},
        "timeline_rows": len(timeline),
        "timeline_csv_mib": (folder / "timeline.csv").stat().st_size / 2**20,
    }


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(requests: int, slots: int) -> dict:
    """One size in a fresh process, so its peak memory is its own."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, __file__, "--one", str(requests), "--slots", str(slots)]
        before = load_now()
        done = run_child([*command, "--folder", folder], f"the run of {requests:,} requests",
                         stdout=subprocess.PIPE)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"load_before": before,
                                                               "load_after": load_now()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int_list, default=[10_000, 100_000, 1_000_000, 10_000_000],
                        help="requests, comma-separated whole numbers "
                        "(default 10000,100000,1000000,10000000)")  # fmt: skip
    parser.add_argument("--slots", type=positive_int, default=256)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args.one, args.slots, args.folder)))
        return
    print(
        f"{'requests':>10} {'wall s':>7} {'us/req':>7} {'peak MiB':>9} {'rows':>9} "
        f"{'csv MiB':>8}  " + " ".join(f"{s:>8}" for s in STAGES) + "      load"
    )
    runs = []
    for requests in args.sizes:
        r = measure(requests, args.slots)
        runs.append(r)
        print(
            f"{r['requests']:>10,} {r['wall_s']:>7.2f} {1e6 * r['wall_s'] / requests:>7.2f} "
            f"{r['peak_rss_mib']:>9.0f} {r['timeline_rows']:>9,} {r['timeline_csv_mib']:>8.1f}  "
            + " ".join(f"{r[f'{s}_s']:>8.2f}" for s in STAGES)
            + f"  {r['load_before']:.1f}-{r['load_after']:.1f}",
            flush=True,
        )
    host = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version,
            **machine()}  # fmt: skip
    print(json.dumps({"benchmark": "scaling", "machine": host, "runs": runs}))


if __name__ == "__main__":
    main()
