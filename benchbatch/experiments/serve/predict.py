"""serve-sweep --endpoint --predict: a server benchbatch did not write, predicted.

A short calibration against the endpoint first (core/endpoint_calibration.py's episodes:
single requests at a few prompt lengths, then steady decodes at a few concurrencies, each
on the idle server), fitted by core/calibration.py into a step-cost model with the
server's own latency outside its steps; then every measured point is simulated with those
costs and the server's scheduler as the options describe it (--slots as its max_num_seqs,
--max-num-batched-tokens, --server-scheduler chunked or continuous), and prediction.csv/png
set the two side by side with a verdict. The calibration is saved (step_cost.json,
step_cost.csv, endpoint_calibration.csv) and reusable with --step-costs, its conditions
(the server, its version, the machine's load) checked when it is.

Everything here returns rows or plain results; nothing prints.
"""

from __future__ import annotations

import math
import os

import numpy as np

from benchbatch.core import calibration as cal
from benchbatch.core import endpoint_calibration as ec
from benchbatch.errors import UserError

OPTION = "predict"
# What the server is, in a calibration's conditions: "device" is this word, so an engine
# run refuses an endpoint's calibration (core/calibration.compare), and these are flagged
# when an endpoint run reuses one made against another server, version or load.
DEVICE = "endpoint"
FLAGGED = ("server", "server_version", "load_class", "cores")


def conditions(info: dict) -> dict:
    """What an endpoint calibration was measured under."""
    from benchbatch.core.machine import load_average

    cores = os.cpu_count() or 1
    load = (load_average() or [math.nan])[0]
    return {
        "device": DEVICE,
        "server": f"{info.get('served_model')} at {info.get('url')}",
        "server_version": info.get("version") or "unknown",
        "cores": cores,
        "load_1min": load,
        "load_class": cal.load_class(load, cores),
    }


def compare(saved: dict, info: dict) -> list[str]:
    """Warnings for a reused calibration: another server, version, load or machine size; a
    UserError for an engine's calibration (its steps hold no HTTP, no server)."""
    if saved.get("device") != DEVICE:
        raise UserError(
            "step_costs",
            f"that calibration is of benchbatch's engine on {saved.get('device')!r}, not of a "
            "server: with --endpoint, give an endpoint's step_cost.json (from --predict) or "
            "use --predict to calibrate this one",
        )
    now = conditions(info)
    diff = [f"{k} {saved[k]} at calibration, {now[k]} now" for k in FLAGGED
            if k in saved and saved[k] != now[k]]  # fmt: skip
    if not diff:
        return []
    return [
        "the endpoint calibration was made under other conditions (" + "; ".join(diff) + "): "
        "the prediction may be off by as much as they change the server's steps; calibrate "
        "again with --predict"
    ]


def calibrate(rec, opts, w, setup, target, info) -> dict:
    """The calibration episodes against the endpoint (endpoint_calibration.csv per request
    as each ends), fitted: {"model", "rows", "summary" (with its conditions and seconds)}.
    A UserError naming --predict when the server's answers determine no step cost."""
    import time

    from benchbatch.experiments.serve import endpoint as ep

    episodes = ec.plan([r.prompt_tokens for r in w.requests], setup.slots, setup.budget,
                       info.get("max_model_len"))  # fmt: skip
    seen = conditions(info)
    started = time.perf_counter()
    steps: list[dict] = []
    failed: list[ec.Episode] = []

    def requests():
        for i, e in enumerate(episodes):
            sent = _prompts(opts, target, info, e, rec.meta["options"]["seed"] + 7919 * (i + 1))
            with ep.stream(target, sent, np.zeros(len(sent)), opts) as run:
                records = sorted(run, key=lambda s: s.request_id)
            got = ec.rows(e, records)
            if not got:
                failed.append(e)
            steps.extend(got)
            for j, s in enumerate(records):
                yield ec.request_row(e, j, s)

    total = sum(e.concurrency for e in episodes)
    rec.record("endpoint_calibration", requests(), total=total,
               label="calibrating the endpoint", timed=False, stream=True)  # fmt: skip
    seconds = time.perf_counter() - started
    if failed:
        rec.warning(_failed_line(failed, len(episodes)))
    if not steps:
        raise UserError(OPTION, "the server answered no calibration request in full")
    out = cal.fit(steps, OPTION)
    out["summary"] |= {"calibrated": "endpoint", "conditions": seen, "seconds": seconds,
                       "episodes": len(episodes)}  # fmt: skip
    return out | {"conditions": seen, "source": "endpoint calibration"}


def _failed_line(failed: list, of: int) -> str:
    """What the episodes that gave no step say: a request failed or stopped early, or (a
    decode of c requests that never all ran at once) the server runs fewer sequences than
    --slots says."""
    names = sorted({e.label for e in failed})
    line = (
        f"{len(failed)} of {of} calibration episodes gave no step ({'; '.join(names[:4])}"
        f"{'; ...' if len(names) > 4 else ''}): a request failed or stopped early "
        "(endpoint_calibration.csv says which)"
    )
    if any(e.kind == "decode" and e.concurrency > 1 for e in failed):
        line += (
            ", or its requests never all decoded at once: the server may run fewer "
            "sequences than --slots says (its max_num_seqs)"
        )
    return line


def _prompts(opts, target, info, episode: ec.Episode, seed: int):
    """The episode's prompts, fresh (their own seed: a server's prefix cache never serves
    one episode from another's), each asking for the episode's output."""
    from benchbatch.core.workload import Request
    from benchbatch.experiments.serve import endpoint as ep

    asked = [Request(i, episode.prompt, episode.output) for i in range(episode.concurrency)]
    return ep.prompts(opts, target, info, asked, seed)[0]


def save(rec, out: dict) -> None:
    """step_cost.csv (the fitted rows), step_cost.json (the fit and its conditions, what
    --step-costs reads back) and the metadata."""
    from benchbatch.output import results

    rec.put("step_cost", out["rows"])
    results.write_json(rec.folder / "step_cost.json", out["summary"])
    rec.meta["step_cost"] = out["summary"] | {"source": out["source"]}
    seconds = out["summary"].get("seconds")
    took = "" if seconds is None else f"; {seconds:.0f} s against the server"
    rec.say(cal.line(out["summary"]) + took)
