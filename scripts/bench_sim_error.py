"""Benchmark: how far the serving simulation is from the real engine, as users run it.

Runs `benchbatch serve-sweep --preset cpu-small` with its defaults (as a user types it:
the engine calibrated as it runs, then the rates that fit --real-time served on the model
beside their simulation), alternating a run on the machine as it is with one where another
process competes for a core (a busy loop this script starts, and stops by its pid), A B B A;
--busy-core pins the loop (benchbatch's engine pins its one compute thread to the last
core), and several (--busy-core any,0,1) alternate every condition in turn.
Each run's prediction.csv holds measured over simulated for TTFT, TPOT and E2E p50/p99 at
its real points; the table is, per condition and metric, the median over the runs and the
points below saturation (prediction.csv's below_saturation: served at 90% of the offered
rate or more, the drain counted as one median E2E), beside the target (0.9-1.1 for the
p50s, 0.8-1.25 for the p99s); then the same for each policy's points alone, and one JSON
line.

--command occupancy does the same for `benchbatch occupancy --engine real --requests 64
--slots 8 --max-output 200` (the run its CPU hint suggests): static and continuous batching
on the model, every request at once, beside their simulation; its metrics are the wall time
and TTFT and E2E p50/p99 (no TPOT), each policy's run one point.

    python scripts/bench_sim_error.py [--command serve-sweep|occupancy] [--rounds 2]
        [--busy-core any|N[,...]] [--keep DIR] [-- extra options for the command]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchbatch.core.prediction import METRICS, NAMES, TARGETS


def busy_name(core: str) -> str:
    """A busy condition's name: unpinned, or pinned to a core."""
    return "one core busy" if core == "any" else f"core {core} busy"


def busy_loop(core: int | None = None, nice: int = 0) -> subprocess.Popen:
    """Another process holding a core: a Python busy loop (stopped by its pid), where the
    operating system puts it, or pinned to one core; at a lower priority with nice > 0."""
    pin = f"import os\nos.sched_setaffinity(0, {{{core}}})\n" if core is not None else ""
    pin += f"import os\nos.nice({nice})\n" if nice else ""
    loop = subprocess.Popen([sys.executable, "-c", pin + "while True: pass"])
    time.sleep(0.5)
    if loop.poll() is not None:  # never measure "busy" beside a loop that did not start
        raise SystemExit(f"the busy loop ended at once (exit {loop.returncode})")
    return loop


# Each command as this benchmark runs it, and the metrics its prediction.csv judges.
COMMANDS = {
    "serve-sweep": (["serve-sweep", "--preset", "cpu-small"], METRICS),
    "occupancy": (["occupancy", "--engine", "real", "--requests", "64", "--slots", "8",
                   "--max-output", "200"],
                  ("wall_s", "ttft_p50_s", "e2e_p50_s", "ttft_p99_s", "e2e_p99_s")),
}  # fmt: skip


def run_once(folder: Path, extra: list[str], command: str = "serve-sweep") -> pd.DataFrame:
    """One run of the command with its defaults into folder; its prediction.csv (every
    pair below saturation where the command has no arrivals to saturate)."""
    cmd = [sys.executable, "-m", "benchbatch", *COMMANDS[command][0], "--out", str(folder),
           *extra]  # fmt: skip
    root = str(Path(__file__).resolve().parents[1])  # this checkout, installed or not
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")]))}  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    table = pd.read_csv(folder / "prediction.csv", dtype={"rate": str})
    if "below_saturation" not in table:
        table["below_saturation"] = True
    if "policy" not in table:
        table["policy"] = table["point"]
    return table


def speed_by_sixth(folder: Path, steps_file: str) -> list[float]:
    """How fast the device ran a run's steps, sixth by sixth of them in order: each sixth's
    CPU time (with the gap before each step) over the calibration's CPU-clock price of it
    (step_cost.json), idle steps left out; [] without a CPU-clock fit. A run whose sixths
    move as far as its ratios do met the device's drift, not the model's error."""
    from benchbatch.core import saved_calibration
    from benchbatch.core.calibration import step_kind
    from benchbatch.core.pricing import loop_cpu_ms, price_ms

    cpu = saved_calibration.given([folder / "step_cost.json"]).get("cpu_model")
    if cpu is None or not (folder / steps_file).is_file():
        return []
    rows = [r for r in pd.read_csv(folder / steps_file).to_dict("records")
            if step_kind(r) != "idle"]  # fmt: skip
    took = [loop_cpu_ms(r) for r in rows]
    price = [price_ms(cpu, r) for r in rows]
    n = len(rows)
    cuts = [(i * n // 6, (i + 1) * n // 6) for i in range(6)]
    return [sum(took[a:b]) / sum(price[a:b]) for a, b in cuts if b > a and sum(price[a:b]) > 0]


STEPS_FILE = {"serve-sweep": "real_steps.csv", "occupancy": "engine_steps.csv"}


def measure(
    rounds: int, keep: Path, extra: list[str], cores: dict[str, int | None],
    command: str = "serve-sweep",
) -> dict[str, list[pd.DataFrame]]:
    """cores: each busy condition's core (None: unpinned)."""
    conditions = ("as is", *cores)
    out: dict[str, list[pd.DataFrame]] = {c: [] for c in conditions}
    for i in range(rounds):
        order = conditions if i % 2 == 0 else conditions[::-1]
        for condition in order:
            folder = keep / f"round{i}-{condition.replace(' ', '-')}"
            loop = busy_loop(cores[condition]) if condition in cores else None
            try:
                load = os.getloadavg()[0]
                table = run_once(folder, extra, command)
            finally:
                if loop is not None:
                    os.kill(loop.pid, 15)
                    loop.wait()
            table["round"], table["load_1min_before"], table["condition"] = i, load, condition
            out[condition].append(table)
            sixths = speed_by_sixth(folder, STEPS_FILE[command])
            said = " ".join(f"x{v:.2f}" for v in sixths)
            print(f"round {i}, {condition}: {folder} (load {load:.1f} before); its steps over "
                  f"their price, sixth by sixth: {said or 'no CPU clock'}", file=sys.stderr)
    return out


def medians(runs: dict[str, list[pd.DataFrame]], policy: str | None = None,
            column: str = "ratio", metrics=METRICS) -> list[dict]:  # fmt: skip
    """Per metric and condition: the median ratio over the runs' points below saturation
    (of one policy's points where policy is given; column "ratio_at_speed": each point
    priced at the speed its steps ran, known only after the run)."""
    rows = []
    for metric in metrics:
        lo, hi = TARGETS[metric]
        row = {"metric": NAMES[metric], "target": f"{lo:g}-{hi:g}"}
        if policy is not None:
            row["policy"] = policy
        for condition, tables in runs.items():
            df = pd.concat(tables)
            df = df[(df["metric"] == metric) & df["below_saturation"].astype(bool)]
            if policy is not None:
                df = df[df["policy"] == policy]
            ratios = [r for r in df.get(column, ()) if math.isfinite(r)]  # an unjudged: NaN
            med = statistics.median(ratios) if ratios else math.nan
            row[condition] = med
            row[f"{condition} points"] = len(ratios)
            row[f"{condition} within"] = bool(lo <= med <= hi) if ratios else None
        rows.append(row)
    return rows


def show(rows: list[dict], conditions: tuple[str, ...]) -> None:
    head = f"{'metric':<10}{'target':>11}" + "".join(f"{c:>16}{'in':>5}" for c in conditions)
    print(head)
    for r in rows:
        cells = "".join(
            f"{r[c]:>11.3f} ({r[f'{c} points']:>2}){'yes' if r[f'{c} within'] else 'no':>5}"
            if r[f"{c} points"] else f"{'-':>16}{'':>5}"  # no value judged (occupancy's wall
            for c in conditions  # time at its own speed: x1 by the speed's definition)
        )
        print(f"{r['metric']:<10}{r['target']:>11}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", choices=tuple(COMMANDS), default="serve-sweep",
                        help="what to run: serve-sweep's real points (default) or occupancy "
                        "--engine real's two policies")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2, help="A B rounds (default 2)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="folder for the runs (default: a temporary one, removed)")  # fmt: skip
    parser.add_argument("--busy-core", default="any",
                        help="where the busy loop runs: any (where the operating system puts "
                        "it), a core's number (pinned), or several, comma-separated (default "
                        "any)")  # fmt: skip
    parser.add_argument("extra", nargs="*", help="more serve-sweep options, after --")
    args = parser.parse_args()
    picked = [c.strip() for c in args.busy_core.split(",")]
    known = {"any", *map(str, sorted(os.sched_getaffinity(0)))}
    if any(c not in known for c in picked) or len(set(picked)) < len(picked):
        parser.error(f"--busy-core: any or a core this process may use ({', '.join(sorted(known))}"
                     f"), comma-separated, each once; got {args.busy_core!r}")  # fmt: skip
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    cores = {busy_name(c): (None if c == "any" else int(c)) for c in picked}
    with tempfile.TemporaryDirectory() as tmp:
        keep = args.keep or Path(tmp)
        keep.mkdir(parents=True, exist_ok=True)
        runs = measure(args.rounds, keep, args.extra, cores, args.command)
    metrics = COMMANDS[args.command][1]
    rows = medians(runs, metrics=metrics)
    print(f"{args.command}: measured over simulated, median of {args.rounds} runs per "
          "condition and the points below saturation (in parentheses); "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs")
    show(rows, ("as is", *cores))
    # The goal holds for every policy: each one's points alone, the same way.
    policies = list(dict.fromkeys(p for t in runs["as is"] for p in t["policy"]))
    by_policy = {p: medians(runs, p, metrics=metrics) for p in policies}
    for p, prow in by_policy.items():
        print(f"\n{p} alone:")
        show(prow, ("as is", *cores))
    # What stays off once each point is priced at the speed its steps ran (prediction.csv's
    # ratio_at_speed): the error left once the device's speed over each point is known.
    at_speed = medians(runs, column="ratio_at_speed", metrics=metrics)
    if any(r["as is points"] for r in at_speed):
        print("\npriced at each point's own speed (ratio_at_speed, known only after the run):")
        show(at_speed, ("as is", *cores))
        speeds = pd.concat([t for tables in runs.values() for t in tables])
        if "steps_over_price" in speeds:
            per_point = speeds.dropna(subset=["steps_over_price"])  # a pair without: NaN
            per_point = per_point.drop_duplicates(["condition", "round", "point"])
            per_point = per_point["steps_over_price"]
            print(f"the points' steps took x{per_point.min():.2f}-x{per_point.max():.2f} of "
                  f"their price (median x{per_point.median():.2f}, {len(per_point)} points)")
    print(json.dumps({"bench": "sim_error", "command": args.command, "rounds": args.rounds,
                      "rows": rows,
                      "by_policy": by_policy, "at_speed": at_speed}))  # fmt: skip


if __name__ == "__main__":
    main()
