"""Paired check: serve-sweep runs' real points simulated two ways, on the same requests.

For every real point of the runs under a folder (bench_sim_error.py --keep DIR), its requests
at their arrival times (the run's requests.csv, sim-matched rows) are simulated on the run's
own calibration twice: on the wall-clock fit (the calibration's load, as serve-sweep priced
real points before 2026-12-04) and on the CPU-clock fit over the share of the core the engine
held while it served the point (as serve-sweep prices them now). Prints measured over
simulated per point and, for TTFT/TPOT/E2E p50 over the points below saturation, the median
ratio and the median |log ratio| of each way. Points behind a client cap
(--max-concurrency) are simulated behind it and labelled as prediction.csv labels them, the
'max' rate's (every request queued at once: a concurrency sweep's) included. Run on folders
made after the change, the "share" column reproduces the runs' own prediction.csv.

    python scripts/paired_share.py DIR [DIR ...]   # a folder of runs, or a run folder itself
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchbatch.core import saved_calibration as sc
from benchbatch.core.serving import ServingSLO, cap_label
from benchbatch.core.workload import Request
from benchbatch.experiments.serve import probe, workloads
from benchbatch.experiments.serve.options import chunk_of

METRICS = ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")


def cap_of(row) -> int | None:
    """A row's client cap (max_concurrency): None where the run had none (no column, NaN)."""
    value = row.get("max_concurrency")
    return None if value is None or pd.isna(value) else int(value)


def points(run: Path) -> list[dict]:
    m = json.loads((run / "metadata.json").read_text())
    o = m["options"]
    fits = sc.read(run / "step_cost.json")
    wall, cpu = fits["model"], fits.get("cpu_model")
    if cpu is None:
        return []
    chunk = chunk_of(o["chunk_size"], o["max_num_batched_tokens"])
    setup = probe.Setup(o["slots"], o["max_num_batched_tokens"], chunk,
                        ServingSLO(o["slo_ttft"], o["slo_tpot"]))  # fmt: skip
    serve, req = pd.read_csv(run / "serve.csv"), pd.read_csv(run / "requests.csv")
    pred = pd.read_csv(run / "prediction.csv")
    out = []
    for _, r in serve[serve["source"] == "real"].iterrows():
        cap = cap_of(r)
        same = (req["policy"] == r["policy"]) & (req["rate"].astype(str) == str(r["rate"]))
        if "max_concurrency" in req:
            caps = req["max_concurrency"]
            same &= caps.isna() if cap is None else (caps == cap)
        mine = req[same & (req["source"] == "sim-matched")].sort_values("request_id")
        rate = math.inf if str(r["rate"]) == "max" else float(r["rate_rps"])
        columns = (mine["request_id"], mine["prompt_tokens"], mine["output_tokens"])
        reqs = [Request(int(i), int(p), int(t)) for i, p, t in zip(*columns, strict=True)]
        unit = mine["arrival_s"].to_numpy() * (1.0 if math.isinf(rate) else rate)  # at rate 1
        w = workloads.ServeWorkload(reqs, unit, "requests.csv", "")
        label = f"{r['policy']} @ {probe.rate_label(rate)} req/s{cap_label(cap)}"
        below = bool(pred[pred["point"] == label]["below_saturation"].astype(bool).any())
        capped = probe.at_cap(setup, cap)
        for how, cost in (("wall", wall), ("share", cpu.scaled(1.0 / r["core_share"]))):
            point = probe.simulate_point(w, r["policy"], rate, capped, cost, len(reqs),
                                         probe.MATCHED)  # fmt: skip
            row = probe.point_row(point, capped)
            for metric in METRICS:
                out.append({"run": str(run), "point": label,
                            "core_share": r["core_share"], "below_saturation": below,
                            "how": how, "metric": metric,
                            "ratio": r[metric] / row[metric]})  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="folders of serve-sweep runs")
    args = p.parse_args()
    if missing := [str(f) for f in args.folders if not f.is_dir()]:
        p.error(f"not a folder: {', '.join(missing)}")
    runs = [run for f in args.folders
            for run in ([f] if (f / "step_cost.json").exists() else sorted(f.iterdir()))
            if run.is_dir() and (run / "step_cost.json").exists()]  # fmt: skip
    rows = [x for run in runs for x in points(run)]
    if not rows:
        p.error(f"no real points of a serve-sweep run with a CPU-clock calibration in "
                f"{len(runs)} run folder(s) under {', '.join(map(str, args.folders))}")
    df = pd.DataFrame(rows)
    below = df[df["below_saturation"]]
    if below.empty:
        print(f"none of {df.groupby(['run', 'point']).ngroups} real points is below saturation "
              "(prediction.csv)")  # fmt: skip
        return 0
    table = below.pivot_table(index=["run", "point", "core_share"], columns=["metric", "how"],
                              values="ratio")  # fmt: skip
    print(table.round(2).to_string())
    n = below.groupby(["run", "point"]).ngroups
    print(f"\n{n} points below saturation in {df['run'].nunique()} runs")
    for (how, metric), v in below.groupby(["how", "metric"])["ratio"]:
        print(f"{how:6} {metric:11} median {v.median():.3f}, median |log| "
              f"{np.median(np.abs(np.log(v))):.3f} ({len(v)} points)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
