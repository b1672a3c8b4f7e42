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
from dataclasses import replace

import numpy as np

from benchbatch.core import calibration as cal
from benchbatch.core import endpoint_calibration as ec
from benchbatch.core import pricing
from benchbatch.core.calibration_text import line
from benchbatch.errors import UserError
from benchbatch.experiments.serve import lateness

OPTION = "predict"
# vLLM's BlockPool takes the first block of num_gpu_blocks as its null block (a placeholder
# that is never handed out; vllm/v1/core/block_pool.py): the scheduler has one block less.
NULL_BLOCKS = 1
# What the server is, in a calibration's conditions: "device" is this word, so an engine
# run refuses an endpoint's calibration (core/saved_calibration.compare), and these are flagged
# when an endpoint run reuses one made against another server, version or load, or read by a
# client at another priority (--client-priority: a late client prices the steps slow).
DEVICE = "endpoint"
FLAGGED = ("server", "server_version", "load_class", "cores", "client_priority")


def conditions(info: dict) -> dict:
    """What an endpoint calibration was measured under."""
    from benchbatch.core.machine import core_count, load_average
    from benchbatch.core.saved_calibration import load_class

    cores = os.cpu_count() or 1
    load = (load_average() or [math.nan])[0]
    return {
        "device": DEVICE,
        "server": f"{info.get('served_model')} at {info.get('url')}",
        "server_version": info.get("version") or "unknown",
        "cores": cores,
        "load_1min": load,
        "load_class": load_class(load, core_count()),  # on physical cores, as the run's
        "client_priority": info.get("client_priority") or "normal",
    }


def compare(saved: dict, info: dict) -> list[str]:
    """Warnings for a reused calibration: another server, version, load, machine size or
    client priority; a
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


def calibrate(rec, opts, w, setup, target, info, index: int, client, pause: float = 0.0) -> dict:
    """One calibration (number `index` of the run): the episodes against the idle endpoint
    (endpoint_calibration.csv per request as each ends). client: (prompts, stream), the
    endpoint module's functions that build a point's prompts and stream them (passed in,
    so this module does not import that one, which imports this). pause: the server idle
    this long before each episode (ec.idle_pause of the point it prices). Returns {"steps": its
    step rows, "conditions", "seconds", "fit": its own fit or None where its steps alone
    determine none}."""
    import time

    make_prompts, stream = client
    episodes = ec.plan([r.prompt_tokens for r in w.requests], setup.slots, setup.budget,
                       info.get("max_model_len"), setup.kv,
                       [r.output_tokens for r in w.requests])  # fmt: skip
    seen = conditions(info)
    started = time.perf_counter()
    steps: list[dict] = []
    failed: list[ec.Episode] = []
    seed = rec.meta["options"]["seed"] + 7919 * (1 + index * len(episodes))

    timings: dict = {}  # (concurrency, prompt) -> a decode episode's timing, for mixed ones
    # decode and mixed requests with chunks to judge (ec.judged), those in bursts
    # (ec.stalled), and of those the ones this client read late (ec.read_late)
    streamed = [0, 0, 0]

    def requests():
        for i, e in enumerate(episodes):
            times = ec.arrivals(e, timings.get((e.concurrency, e.decode_prompt)), pause)
            if times is None:
                failed.append(e)
                continue
            sent = _prompts(make_prompts, opts, target, info, e, seed + 7919 * i)
            # an episode's concurrency is its own: the run's --max-concurrency is not its
            with stream(target, sent, np.asarray(times), opts) as run:
                records = sorted(run, key=lambda s: s.request_id)
            if e.kind == "decode":
                timings[(e.concurrency, e.prompt)] = ec.decode_timing(records)
            if e.kind in ("decode", "mixed"):
                streamed[0] += sum(ec.judged(r) for r in records)
                streamed[1] += sum(ec.stalled(r) for r in records)
                streamed[2] += sum(ec.read_late(r) for r in records)
            got = [r | {"calibration": index} for r in ec.rows(e, records)]
            if not got:
                failed.append(e)
            steps.extend(got)
            for j, s in enumerate(records):
                yield {"calibration": index, **ec.request_row(e, j, s)}

    total = sum(len(e.requests()) for e in episodes)
    label = "calibrating the endpoint" + (f" again ({index + 1})" if index else "")
    rec.record("endpoint_calibration", requests(), total=total, label=label, timed=False,
               stream=True)  # fmt: skip
    if failed:
        rec.warning(_failed_line(failed, len(episodes)))
    own = _own_fit(rec, steps, index, *streamed)
    return {"steps": steps, "conditions": seen, "seconds": time.perf_counter() - started,
            "fit": own, "pause_s": pause, "streamed": streamed[0],
            "bursts": streamed[1], "read_late": streamed[2]}  # fmt: skip


def _own_fit(rec, steps: list[dict], index: int, judged: int, bursts: int, late: int):
    """A calibration's own fit of its steps (None where they determine none), its bursts
    (late: those this client read late) said above a share of its judged requests
    (ec.BURSTS_WARN); the run's first calibration with no fit ends the run in one line."""
    held = bursts > ec.BURSTS_WARN * max(1, judged)
    if held:
        rec.warning(lateness.calibration_bursts(judged, bursts, late))
    try:
        own = cal.fit(steps, OPTION) if steps else None
    except UserError:
        own = None
    if index == 0 and own is None:
        whose = (f"{late} of them read late by this client waiting for a core (above)" if late
                 else "their tokens held back on the way (above)")  # fmt: skip
        why = f"; {bursts} of {judged} of its requests came in bursts, {whose}" if held else ""
        raise UserError(
            OPTION,
            "the server's answers to the calibration determine no step cost (every episode "
            f"failed or gave too few steps: endpoint_calibration.csv says which){why}",
        )
    return own


# Where a point's model came from when its own calibrations could not price it.
POOLED = "the run's every calibration pooled (its own gave too few steps)"


def bracket(calibrations: list[dict], k: int, pooled_model=None):
    """The cost model of point k and where it came from: the calibrations just before and
    just after it, fitted together; the one before alone where the one after gave no step;
    and where neither determines the terms (a server whose tokens came in bursts, its
    streaming process waiting for a core, gives few steps), the run's pooled fit of every
    calibration (pooled_model; without it, the UserError of the one before)."""
    tries = [("the calibrations around it", calibrations[k : k + 2]),
             ("the calibration before it", calibrations[k : k + 1])]  # fmt: skip
    for source, parts in tries:
        try:
            return cal.fit([r for c in parts for r in c["steps"]], OPTION)["model"], source
        except UserError:
            if pooled_model is None and len(parts) == 1:
                raise
    return pooled_model, POOLED


def pooled(calibrations: list[dict]) -> dict:
    """Every calibration of the run fitted together (what step_cost.json saves), with how
    far the server's speed moved between them: each calibration's own price of a decode
    step of one sequence over the pooled fit's."""
    steps = [r for c in calibrations for r in c["steps"]]
    out = cal.fit(steps, OPTION)
    parts = [(c["steps"], c["fit"] and c["fit"]["model"]) for c in calibrations]
    out["summary"] |= {
        "calibrated": "endpoint",
        "conditions": calibrations[0]["conditions"],
        "seconds": sum(c["seconds"] for c in calibrations),
        "calibrations": len(calibrations),
        # The server idle before each episode, per calibration (ec.idle_pause).
        "pauses_s": [c.get("pause_s", 0.0) for c in calibrations],
        # Decode and mixed requests judged (ec.judged), and those in bursts (ec.stalled), per one.
        "streamed_requests": [c.get("streamed", 0) for c in calibrations],
        "burst_requests": [c.get("bursts", 0) for c in calibrations],
        # of those, the ones this client read late, its thread waiting for a core (ec.read_late)
        "client_burst_requests": [c.get("read_late", 0) for c in calibrations],
        "drift": pricing.drift(parts, out["model"]),
    }
    return out | {"source": "endpoint calibration"}


def server_kv(opts, info: dict, requests):
    """The server's KV pool as the prediction models it: --server-kv, else what its
    /metrics says (vLLM's cache_config_info; block size 16, vLLM's default, where only the
    count is known), less vLLM's null block. Returns (KVBudget or None, where it came
    from); None where nothing names the blocks (KV for every running sequence). A request
    that could not run alone in the pool: UserError naming --server-kv."""
    from benchbatch.core.kvblocks import DEFAULT_BLOCK_SIZE, KVBudget, blocks_for

    said = info.get("metrics") or {}
    given_blocks, given_size = opts.server_kv_value
    blocks = given_blocks or said.get("kv_blocks")
    if blocks is None:
        return None, "KV for every running sequence (the server's /metrics names no KV pool)"
    size = given_size or said.get("kv_block_size") or DEFAULT_BLOCK_SIZE
    if blocks < 2:
        raise UserError("server_kv", f"{blocks} block: vLLM keeps one as its null block, none left")
    kv = KVBudget(blocks - NULL_BLOCKS, size)
    for r in requests:
        need = blocks_for(kv.peak_tokens(r.prompt_tokens, r.output_tokens), size)
        if need > blocks:
            raise UserError(
                "server_kv",
                f"request {r.id} ({r.prompt_tokens:,}-token prompt, {r.output_tokens:,} output "
                f"tokens) needs {need:,} blocks of {size} tokens, more than the {kv.blocks:,} "
                f"the server hands out: it could never run there",
            )
    metrics = "the server's /metrics"
    blocks_from = "--server-kv" if given_blocks else metrics
    size_from = ("--server-kv" if given_size
                 else metrics if said.get("kv_block_size") else "vLLM's default")  # fmt: skip
    return kv, (f"{blocks:,} KV blocks ({blocks_from}) of {size} tokens ({size_from}), "
                f"{kv.blocks:,} handed out (vLLM keeps one as its null block)")  # fmt: skip


def preempted_line(count: int, calibrations: int, kv) -> str:
    """The warning for calibrations during which the server preempted: their episodes were
    cut to fit the pool as the prediction knows it, so the pool is smaller than that."""
    pool = "KV for every running sequence" if kv is None else f"{kv.blocks:,} KV blocks"
    return (
        f"the server preempted {count:,} requests during the {calibrations} calibrations, "
        f"made to fit {pool}: "
        "its pool is smaller, its decode steps were not steady and the fitted costs are off; "
        "give --server-kv BLOCKSxTOKENS (vLLM's num_gpu_blocks and block size)"
    )


def server_setup(rec, opts, info: dict, setup, requests):
    """setup as the server runs: its KV pool (server_kv, said and recorded in the metadata)
    and its prefill chunks as long as the token budget allows (vLLM's default: no
    long-prefill threshold; --chunk-size gives one). Checked before any request is sent:
    a UserError naming the option the scheduler refuses."""
    from benchbatch.core.scheduler_config import SchedulerConfig
    from benchbatch.experiments.serve import probe

    kv, where = server_kv(opts, info, requests)
    rec.meta["prediction_kv"] = {"blocks": kv and kv.blocks, "block_size": kv and kv.block_size,
                                 "source": where}  # fmt: skip
    rec.say(f"predicted with {where}")
    out = replace(setup, kv=kv, chunk=opts.chunk_size or setup.budget)
    SchedulerConfig(out.slots, **probe.settings(opts.server_scheduler, out)[1])
    return out


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


def _prompts(make_prompts, opts, target, info, episode: ec.Episode, seed: int):
    """The episode's prompts, fresh (their own seed: a server's prefix cache never serves
    one episode from another's), each asking for the episode's output."""
    from benchbatch.core.workload import Request

    asked = [Request(i, p, o) for i, (p, o) in enumerate(episode.requests())]
    return make_prompts(opts, target, info, asked, seed)[0]


def save(rec, calibrations: list[dict]):
    """The run's calibrations pooled (pooled()), saved; returns the pooled cost model."""
    out = pooled(calibrations)
    save_given(rec, out)
    d = out["summary"]["drift"]
    if len(calibrations) > 1 and math.isfinite(d["decode_step_low"]):
        rec.say(
            f"the server's decode step moved x{d['decode_step_low']:.2f}-"
            f"x{d['decode_step_high']:.2f} of the pooled fit over {len(calibrations)} "
            "calibrations (one before each point, one after the last): each point is "
            "predicted from the two around it"
        )
    return out["model"]


def save_given(rec, out: dict) -> None:
    """step_cost.csv (the fitted rows), step_cost.json (the fit and its conditions, what
    --step-costs reads back) and the metadata."""
    from benchbatch.output import results

    if out["rows"]:
        rec.put("step_cost", out["rows"])
    results.write_json(rec.folder / "step_cost.json", out["summary"])
    rec.meta["step_cost"] = out["summary"] | {"source": out.get("source", "calibration")}
    seconds = out["summary"].get("seconds")
    took = "" if seconds is None else f"; {seconds:.0f} s against the server"
    rec.say(line(out["summary"]) + took)
