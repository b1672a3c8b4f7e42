#!/usr/bin/env python3
"""How steady the engine's calibration is from run to run, and how well it prices the steps
a serving run took: several calibrations of serve-sweep's defaults on cpu-small, each
pricing the same served steps.

    python3 scripts/bench_calibration.py --reference RUN/real_steps.csv [--runs 4]
        [--tree PATH ...] [--out DIR]

Each run is `serve-sweep --preset cpu-small --engine sim --rates max` (the calibration, then
a quick simulation) from each --tree in turn (default: this checkout; give two trees, e.g.
a `git worktree` of another commit, to compare two calibrations alternately, the order flipped
each run: A B, B A, ...). Each calibration goes to its own folder under --out (refused where
it holds an earlier run's, unless --force). Per
calibration it prints the fit's |error| medians per step kind, its base, decode-token and
batched terms, and the median of measured over priced of the reference run's steps per
kind (the served steps' loop time, step and host gap, over the calibration's price of
them, priced as serve-sweep prices them: the saved calibration's model, its settle and
row-block terms included; 1 is right). Per tree: the spread of those medians across runs.
Each JSON line names the machine, the load before and after, and threads (serve-sweep's
own choice). Nothing here is a test: the machine is shared, so this is a measurement to
quote, with the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from script_common import fresh_folder, load_now, machine, positive_int, run_child

REPO = Path(__file__).resolve().parent.parent
RUN = ["serve-sweep", "--preset", "cpu-small", "--engine", "sim", "--rates", "max"]


def calibrate(tree: Path, out: Path) -> dict:
    env = os.environ | {"PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "benchbatch", *RUN, "--out", str(out)]
    cmd += ["--force"] if out.exists() else []  # an earlier run's: main allowed it
    run_child(cmd, f"serve-sweep into {out}", cwd=tree, env=env)
    return json.loads((out / "step_cost.json").read_text())


def priced(step_cost: Path, reference: list[dict]) -> dict[str, float]:
    """Per step kind, the median of the reference steps' loop time over this calibration's
    price of them: the saved calibration's model (its settle decay and row block with it),
    the price serve-sweep uses."""
    from benchbatch.core import calibration as cal
    from benchbatch.core import pricing, saved_calibration

    model = saved_calibration.read(step_cost)["model"]
    by: dict[str, list[float]] = {}
    for r in reference:
        kind = cal.step_kind(r)
        if kind != "idle" and r["step_ms"] > 0:
            by.setdefault(kind, []).append(pricing.loop_ms(r) / pricing.price_ms(model, r))
    return {k: statistics.median(v) for k, v in sorted(by.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", type=Path, required=True, help="a run's real_steps.csv")
    ap.add_argument("--runs", type=positive_int, default=4,
                    help="calibrations per tree (default 4)")  # fmt: skip
    ap.add_argument("--tree", type=Path, action="append", help="a checkout (default: this)")
    ap.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    ap.add_argument("--force", action="store_true", help="write into a non-empty --out")
    args = ap.parse_args()
    if not args.reference.is_file():
        ap.error(f"--reference: no file {args.reference}")
    trees = [t.resolve() for t in args.tree or [REPO]]
    if len(set(trees)) < len(trees):
        ap.error("--tree: each checkout once (the same tree twice would share its folders)")
    out = fresh_folder(ap, args.out, args.force) if args.out else None
    out = out or Path(tempfile.mkdtemp(prefix="bench-calibration-"))
    import pandas as pd

    reference = pd.read_csv(args.reference).to_dict("records")
    host = machine()
    results: dict[str, list[dict]] = {str(t): [] for t in trees}
    for i in range(args.runs):
        order = trees if i % 2 == 0 else trees[::-1]
        for tree in order:
            folder = out / f"run{i}-{trees.index(tree)}"
            before = load_now()
            s = calibrate(tree, folder)
            coef = s["coefficients_s"]
            row = {
                "tree": str(tree),
                "run": i,
                "cpu": host["cpu"],
                "cpus": host["cpus"],
                "steps": s["samples"],
                "load_before": before,
                "load_after": load_now(),
                "errors": {k: round(v["median_abs_error"], 3) for k, v in s["kinds"].items()},
                "base_ms": coef["base_s"] * 1e3,
                "decode_token_ms": coef["per_decode_token_s"] * 1e3,
                "batched_ms": coef.get("batched_step_s", 0.0) * 1e3,
                "priced": priced(folder / "step_cost.json", reference),
            }
            results[str(tree)].append(row)
            print(json.dumps(row), flush=True)
    for tree, rows in results.items():
        kinds = sorted({k for r in rows for k in r["priced"]})
        spread = {
            k: (min(r["priced"][k] for r in rows), max(r["priced"][k] for r in rows))
            for k in kinds
        }
        errors = [r["errors"].get("decode", float("nan")) for r in rows]
        print(
            f"{tree}: {len(rows)} calibrations, base {min(r['base_ms'] for r in rows):.1f}-"
            f"{max(r['base_ms'] for r in rows):.1f} ms, decode |error| median "
            f"{min(errors):.0%}-{max(errors):.0%}; reference steps measured over priced: "
            + ", ".join(f"{k} x{lo:.2f}-x{hi:.2f}" for k, (lo, hi) in spread.items())
        )


if __name__ == "__main__":
    main()
