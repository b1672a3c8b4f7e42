"""How a calibration's fit prices the steps a run executed: a step's price from its record
(price_ms, the fit's own design row), what the serving loop paid for it (loop_ms, and
loop_cpu_ms on the CPU clock), the spread of measured over priced per run and step kind
(price_errors), and how far a run's calibrations moved between each other (drift). No
torch; core/calibration.py fits the model."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from benchbatch.core.calibration import coefficients, design, step_kind
from benchbatch.core.metrics import percentile
from benchbatch.core.step_model import StepCostModel
from benchbatch.core.wake import idle_s


def price_ms(model: StepCostModel, row: dict) -> float:
    """The model's price of an executed step from its record (runtime/engine.py's row:
    active, decode, prefill, padded, context, gathered and masked tokens, batched), in ms,
    by the fit's own design row: what the simulation charges the same plan (StepCostModel:
    padded rows as decoding sequences), and the core's wake after an idle wait (idle_ms)."""
    padded = row.get("padded", 0)
    features = {**row, "sequences": row["active"] + padded,
                "decode_tokens": row["decode_tokens"] + padded}  # fmt: skip
    x = design([features], model.settle_decay, model.row_block)[0]
    woken = model.woken_s(idle_s(row))  # the first step after an idle wait: the core's wake
    return 1e3 * (float(x @ np.array(coefficients(model))) + woken)


def loop_cpu_ms(row: dict) -> float:
    """loop_ms on the CPU clock: the step's CPU time and its gap's (NaN without them)."""
    cpu, gap = row.get("cpu_ms", math.nan), row.get("gap_cpu_ms", 0.0)
    return cpu + (gap if gap == gap and gap > 0 else 0.0)


def loop_ms(row: dict) -> float:
    """What a step costs the serving loop: the step itself and the host gap before it
    (gap_ms: handing the last record on, releasing arrivals; 0 where a row has none)."""
    gap = row.get("gap_ms", 0.0)
    return row["step_ms"] + (gap if gap == gap and gap > 0 else 0.0)  # a NaN cell: none


def price_errors(rows: Sequence[dict], key: str = "policy", clock: str = "wall") -> list[dict]:
    """Per run (key) and step kind: the steps, and the median and p10/p90 of measured over
    priced (loop_ms / priced_ms: the step and the gap before it): how far the calibration
    prices the steps a run took. clock "cpu": the steps' CPU time (loop_cpu_ms) over the CPU
    clock fit's price (priced_cpu_ms), the device's speed whatever share of the core the
    engine had; rows without either are left out."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        pair = priced_step(r, clock)
        if pair is not None:
            groups.setdefault((r[key], step_kind(r)), []).append(pair[0] / pair[1])
    return [
        {
            key: name,
            "kind": kind,
            "steps": len(v),
            "ratio_p50": percentile(v, 50),
            "ratio_p10": percentile(v, 10),
            "ratio_p90": percentile(v, 90),
        }  # fmt: skip
        for (name, kind), v in groups.items()
    ]


def speed(rows: Sequence[dict], clock: str = "wall") -> float:
    """How fast the device ran a run's steps against the calibration's price of them: their
    summed time (loop_ms; clock "cpu": loop_cpu_ms, the device's speed whatever share of the
    core the engine had) over their summed price (priced_ms; priced_cpu_ms). Summed, not a
    median: a latency adds its steps' times, so a few dear steps count as much as they cost.
    Idle steps and rows without either are left out; NaN where none is left."""
    pairs = [p for r in rows if (p := priced_step(r, clock)) is not None]
    spent, priced = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return spent / priced if priced > 0 else math.nan


def priced_step(row: dict, clock: str = "wall") -> tuple[float, float] | None:
    """A step's time and the calibration's price of it, (loop_ms, priced_ms), or on the
    CPU clock (loop_cpu_ms, priced_cpu_ms); None for an idle step or one without either."""
    price = row.get("priced_ms" if clock == "wall" else "priced_cpu_ms")
    took = loop_ms(row) if clock == "wall" else loop_cpu_ms(row)
    if step_kind(row) != "idle" and price and price == price and row["step_ms"] > 0 and took > 0:
        return took, price
    return None


DRIFT_RULE = "each calibration's own fit of a decode step of one sequence, over the pooled fit's"


def drift(parts: Sequence[tuple[Sequence[dict], StepCostModel | None]], pooled) -> dict:
    """How far the device's (or a server's) speed moved between a run's calibrations, fitted
    together as `pooled`: per calibration (its steps, its own fit; None where it determined
    none), its own price of its first decode step of one sequence over the pooled price."""
    each = []
    for steps, own in parts:
        ref = next((r for r in steps if r["decode_tokens"] == 1 and not r["prefill_tokens"]),
                   None)  # fmt: skip
        if own is not None and ref is not None:
            mine = design([ref], own.settle_decay, own.row_block)[0] @ coefficients(own)
            each.append(float(mine) / float(design([ref], pooled.settle_decay,
                                                   pooled.row_block)[0]
                                            @ coefficients(pooled)))  # fmt: skip
    return {
        "decode_step_low": min(each, default=math.nan),
        "decode_step_high": max(each, default=math.nan),
        "each": each,
        "rule": DRIFT_RULE,
    }
