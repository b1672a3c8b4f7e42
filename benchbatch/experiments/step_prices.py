"""How a calibration priced the steps a real engine took, said the same way wherever a real
run stands beside its simulation (serve-sweep's real points, occupancy and ablation with
--engine real, reproduce's real part): each step's price (priced), the spread of
measured over priced per run and step kind (say_prices: metadata's real.step_prices),
and the runs whose steps ran far off their price (say_speeds: a warning)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

# A run's steps priced outside this (median, per policy and kind, of at least PRICED_STEPS
# steps) mean the calibration was made at another speed than the run's: said as a warning.
PRICED_WITHIN = (0.9, 1.1)
PRICED_STEPS = 20
# A run (a serving point, an occupancy policy, an ablation scheme) whose steps took outside
# this of their price (steps_over_price) ran at another speed than the calibration's by more
# than a p99's band: a warning, where the medians per step kind (say_prices) can sit near 1
# while its first points ran slow and its last fast.
SPEED_MOVED = (0.8, 1.25)


def priced(rows: Iterable, cost, cpu_cost=None):
    """The engine's step rows, each with the cost model's price of the step it took
    (priced_ms: what the wall-clock fit charges that plan; priced_cpu_ms: the CPU clock's,
    where the calibration has one). After a run, not between its steps: pricing a step
    costs the host 30-80 us a clock, which a serving loop pricing each step as it ended
    paid between its steps, where its calibration had not (on the 2-core AMD EPYC VM the
    gap between two steps 0.32 ms against the calibration's 0.18, a lone request's token
    gaps x1.03 of their simulation for it)."""
    from benchbatch.core.pricing import price_ms

    for row in rows:
        row = row | {"priced_ms": price_ms(cost, row)}
        if cpu_cost is not None:
            row["priced_cpu_ms"] = price_ms(cpu_cost, row)
        yield row


def price_in_place(rows: Sequence[dict], cost, cpu_cost=None) -> None:
    """priced's columns set on the rows themselves (a run's table, kept by its recorder:
    the CSV written after gets them)."""
    for row, with_price in zip(rows, priced(rows, cost, cpu_cost), strict=True):
        row.update(with_price)


def say_prices(rec, steps: Sequence[dict], key: str = "policy") -> None:
    """How far the calibration priced the steps the real engine took (priced's rows), per
    run (key: the rows' policy, or ablation's scheme) and step kind (metadata's
    real.step_prices): on the CPU clock where the calibration has one (the steps' CPU
    time over the CPU fit's price: the device's speed, which the simulations beside the
    runs assume; the core share is theirs), else on the wall clock. A ratio far from 1
    is the step-cost model's error (the device changed since the calibration), one near
    1 beside a latency far off is the scheduling's or the queue's."""
    from benchbatch.core.pricing import price_errors

    clock = "cpu" if any(r.get("priced_cpu_ms") for r in steps) else "wall"
    errors = price_errors(steps, key=key, clock=clock)
    if not errors:
        return
    rec.meta.setdefault("real", {})["step_prices"] = errors
    rec.meta["real"]["step_prices_clock"] = clock
    by_policy: dict[str, list[str]] = {}
    for e in errors:
        by_policy.setdefault(e[key], []).append(
            f"{e['kind']} x{e['ratio_p50']:.2f} ({e['steps']:,})"
        )
    what = "CPU time" if clock == "cpu" else "time"
    rec.note(
        f"the real engine's steps' {what} over the calibration's price of them (median, "
        "steps): " + "; ".join(f"{p} {', '.join(v)}" for p, v in by_policy.items())
    )
    off = [e for e in errors if e["steps"] >= PRICED_STEPS and not
           PRICED_WITHIN[0] <= e["ratio_p50"] <= PRICED_WITHIN[1]]  # fmt: skip
    if off:
        worst = max(off, key=lambda e: abs(math.log(e["ratio_p50"])))
        why = (
            "the device ran at another speed while it calibrated (a frequency change, "
            "other processes' use of the caches and memory bus)"
            if clock == "cpu"
            else "the machine ran at another speed while it calibrated (another process, a "
            "frequency change)"
        )
        rec.warning(
            f"the calibration priced the real engine's steps off: {worst[key]} "
            f"{worst['kind']} steps took x{worst['ratio_p50']:.2f} of their price "
            f"(median of {worst['steps']:,}); {why}, so the simulation beside them is off "
            "by about as much: run again on a quieter machine, or reuse a calibration made "
            "under the run's conditions with --step-costs"
        )


def say_speeds(rec, speeds: Sequence[tuple[str, float]], unit: str = "points") -> None:
    """A warning naming the runs (label, steps_over_price; `unit` names them) whose steps
    took outside SPEED_MOVED of the calibration's price, the farthest first: the device's
    speed moved during the run, and those runs' errors are mostly its. NaN speeds (no
    steps priced) are left out of the count."""
    known = [(p, v) for p, v in speeds if v == v]
    moved = [(p, v) for p, v in known if not SPEED_MOVED[0] <= v <= SPEED_MOVED[1]]
    if not moved:
        return
    moved.sort(key=lambda m: -abs(math.log(m[1])))
    shown = ", ".join(f"{p} x{v:.2f}" for p, v in moved[:3])
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    one = unit[:-1] if unit.endswith("s") else unit
    rec.warning(
        f"the device's speed moved during the run: at {len(moved)} of {len(known)} {unit} the "
        f"steps took outside x{SPEED_MOVED[0]:g}-x{SPEED_MOVED[1]:g} of their price ({shown}"
        f"{more}), so their simulation is off by about as much (prediction.csv's "
        f"ratio_at_speed prices each {one} at its own speed): run again on a quieter machine"
    )
