"""Paired check: serve-sweep runs' real points priced by their own calibration fitted with
and without a term, on the same measured points: the prompt-pair term (per_prompt_pair_s,
the default) or, with --term row-blocks, the row-block and prefill-step terms
(per_row_block_s, prefill_step_s: their columns decode_only_rows and prefill_step, taken
from each step's counts for calibrations recorded before the engine kept them).

For each run folder (serve-sweep with --engine real, e.g. bench_sim_error.py --keep DIR's
round folders), the calibration's steps (calibration_steps.csv; runs made before the term
get each step's prompt_pairs from a replay of the calibration's plans) are fitted twice on
the CPU clock, with the prompt_pairs column and without it, and every real point below
saturation (prediction.csv) is simulated on each fit over the point's own core share, as
serve-sweep prices it (behind the point's client cap where it had one, --max-concurrency,
and labelled as prediction.csv labels it). Prints per run and over all of them, for
TTFT/TPOT/E2E p50: the median and mean |log(measured over simulated)| and how many are
within 10%; then per policy and metric the median ratio. Run on folders made with the
term, the "with" column reproduces the runs' own prediction.csv. Nothing here is a test: a
measurement to quote.

    python scripts/paired_prompt_pairs.py [--term prompt-pairs|row-blocks] RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchbatch.core import calibration as cal
from benchbatch.core.cpu_clock import with_cpu_clock
from benchbatch.core.options import RunOptions, WorkloadOptions
from benchbatch.core.serving import cap_label
from benchbatch.experiments.serve import probe
from benchbatch.experiments.serve import run as serve_run
from benchbatch.experiments.serve.options import ServeOptions
from benchbatch.runtime import calibrate as cb

METRICS = ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")
WAYS = ("with", "without")


def _options(cls, saved: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v
                  for k, v in saved.items() if k in names})  # fmt: skip


def _pairs_by_replay(rows: list[dict], setup, w, max_context: int) -> None:
    """prompt_pairs for a calibration recorded before the engine kept it: its plans again."""
    from benchbatch.core.step_model import prompt_pairs

    prompts = [r.prompt_tokens for r in w.requests]
    plan = cb.plan_for(setup.slots, prompts, setup.chunk, setup.budget, max_context)
    pairs = {(c.run.name, p.step): prompt_pairs(p) for c in cb.runs(plan)
             for p in cb.plans(c.run, c.requests)}  # fmt: skip
    for r in rows:
        r["prompt_pairs"] = pairs[(r["calibration"], r["step"])]


TERMS = {"prompt-pairs": ("prompt_pairs",), "row-blocks": ("decode_only_rows", "prefill_step")}


def _row_columns(rows: list[dict]) -> None:
    """decode_only_rows and prefill_step from a step's counts (the engine's own rule,
    core/simulate.py), for a calibration recorded before the engine kept them."""
    for r in rows:
        lone = r["decode_tokens"] + (r.get("padded") or 0)
        r.setdefault("decode_only_rows", 0 if r["prefill_tokens"] else lone)
        r.setdefault("prefill_step", int(r["prefill_tokens"] > 0))


def run_folder(folder: Path, term: str = "prompt-pairs") -> dict[str, list[tuple[str, str, float]]]:
    """Per way: (policy, metric, measured over simulated) of every point below saturation."""
    meta = json.loads((folder / "metadata.json").read_text())
    saved = meta["options"]
    opts, workload = _options(ServeOptions, saved), _options(WorkloadOptions, saved)
    run = _options(RunOptions, {k: v for k, v in saved.items() if k == "seed"})
    setup, w, _ = serve_run._plan(opts, workload, run)
    steps = pd.read_csv(folder / "calibration_steps.csv")
    rows = cb.fit_rows(steps.to_dict("records"))
    if "prompt_pairs" not in steps:
        _pairs_by_replay(rows, setup, w, (meta.get("model") or {}).get("max_context") or 4096)
    if term == "row-blocks":
        _row_columns(rows)
    blind = [{k: v for k, v in r.items() if k not in TERMS[term]} for r in rows]
    models = {way: with_cpu_clock(cal.fit(r, "calibration"), r, "calibration")["cpu_model"]
              for way, r in zip(WAYS, (rows, blind), strict=True)}  # fmt: skip
    prediction = pd.read_csv(folder / "prediction.csv", dtype={"rate": str})
    below = set(prediction[prediction["below_saturation"].astype(bool)]["point"])
    serve = pd.read_csv(folder / "serve.csv", dtype={"rate": str})
    out: dict[str, list] = {way: [] for way in WAYS}
    for _, row in serve[serve["source"] == "real"].iterrows():
        cap = row.get("max_concurrency")
        cap = None if cap is None or pd.isna(cap) else int(cap)
        if f"{row['policy']} @ {row['rate']} req/s{cap_label(cap)}" not in below:
            continue
        rate = math.inf if row["rate"] == "max" else float(row["rate"])
        capped = probe.at_cap(setup, cap)
        for way, model in models.items():
            scaled = model.scaled(1.0 / row["core_share"])
            point = probe.simulate_point(w, row["policy"], rate, capped, scaled,
                                         int(row["requests"]), probe.MATCHED)  # fmt: skip
            sim = probe.point_row(point, capped)
            out[way] += [(row["policy"], m, row[m] / sim[m]) for m in METRICS]
    return out


def _line(ratios: list[float]) -> str:
    logs = [abs(math.log(r)) for r in ratios]
    within = sum(0.9 <= r <= 1.1 for r in ratios)
    return (f"median |log| {np.median(logs):.3f}, mean {np.mean(logs):.3f}, "
            f"within 10% {within} of {len(ratios)}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="serve-sweep run folders (--engine real)")
    p.add_argument("--term", choices=sorted(TERMS), default="prompt-pairs",
                   help="the term fitted with and without (default: prompt-pairs)")
    args = p.parse_args()
    total: dict[str, list] = {way: [] for way in WAYS}
    for folder in args.runs:
        got = run_folder(folder, args.term)
        print(
            f"{folder.name}: "
            + "; ".join(f"{way}: {_line([r for *_, r in got[way]])}" for way in WAYS if got[way])
        )
        for way in WAYS:
            total[way] += got[way]
    for way in WAYS:
        if not total[way]:
            continue
        print(f"all runs, {way} the term: {_line([r for *_, r in total[way]])}")
        table = pd.DataFrame(total[way], columns=["policy", "metric", "ratio"])
        print(table.groupby(["policy", "metric"])["ratio"].median().round(3).to_string())


if __name__ == "__main__":
    main()
