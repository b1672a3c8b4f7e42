"""A calibration kept with a run (step_cost.json, step_cost.csv): the conditions it was
measured under, checked when it is used again (another device refused, the rest flagged by
name), and the calibration read back for --step-costs (core/calibration.py fits it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from benchbatch.core.calibration import FEATURES, TERMS, fit, model_of
from benchbatch.core.cpu_clock import with_cpu_clock
from benchbatch.errors import UserError

# --- conditions -----------------------------------------------------------------------------


def host_id(name: str) -> str:
    """A host's short fingerprint (its name hashed: the name itself stays out of results)."""
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()[:12]


def load_class(load_1min: float | None, cores: int) -> str:
    """A calibration's load condition: machine.load_level (quiet, busy, saturated or
    unknown), the same rule as the run's own load class, on the physical cores."""
    from benchbatch.core.machine import load_level

    return load_level(load_1min, max(1, cores))


# What differs and how much it matters: another device refuses the calibration (its costs
# are another machine's), the others are flagged: another host of the same device (a CPU
# model's name is shared by many machines, whose memory and neighbours differ), another
# benchbatch (the engine's per-step work may have moved: vidur #60's 700%), and the rest.
REFUSED = ("device",)
FLAGGED = ("host_id", "benchbatch", "threads", "torch", "dtype", "load_class", "pinned_cores")


def compare(saved: dict, current: dict, option: str = "--step-costs") -> list[str]:
    """The differences between a calibration's conditions and this run's: a UserError for
    another device, a warning line for each other difference (host, benchbatch version,
    threads, torch version, dtype, load class, pinning). Conditions a side does not know
    are not compared."""
    for key in REFUSED:
        if key in saved and key in current and saved[key] != current[key]:
            raise UserError(
                option,
                f"the calibration was measured on {saved[key]!r}, this run is on "
                f"{current[key]!r}: its step costs are another device's (calibrate here: "
                "drop --step-costs)",
            )
    out = []
    for key in FLAGGED:
        if key in saved and key in current and saved[key] != current[key]:
            out.append(f"{key} {saved[key]} at calibration, {current[key]} now")
    if not out:
        return []
    return [
        "the step-cost calibration was made under other conditions ("
        + "; ".join(out)
        + "): the simulation may be off by as much as they change a step; calibrate again "
        "(drop --step-costs) to measure under these"
    ]


# --- reading a calibration back ----------------------------------------------------------------


def read(path: Path, option: str = "--step-costs") -> dict | None:
    """A calibration saved with a run: step_cost.json (its coefficients and conditions), or
    a step_cost.csv with the sequences column (refitted; conditions from the step_cost.json
    beside it). None: not a calibration (an older CSV: stepcost reads it)."""
    path = Path(path)
    if path.suffix == ".json":
        return _read_json(path, option)
    head = _header(path, option)
    if "sequences" not in head or "step_ms" not in head:
        return None
    import pandas as pd

    from benchbatch.core.stepcost import _check_numbers, _read_costs_csv

    df = _read_costs_csv(path)
    optional = ("gathered_tokens", "first_tokens", "admitted", "masked_tokens", "batched",
                "settling", "prompt_pairs", "decode_only_rows", "prefill_step")  # fmt: skip
    for name in optional:  # older calibrations lack them
        if name not in df:
            df[name] = 0
    columns = [f for f in FEATURES if f != "row_blocks"]  # row_blocks: computed
    _check_numbers(path, df, columns)
    _check_numbers(path, df, ("step_ms",), (1e-4, 3.6e6))
    clocks = [c for c in ("gap_ms", "cpu_ms", "gap_cpu_ms") if c in df]
    kept = (*columns, "step_ms", *clocks)
    rows = pd.DataFrame({k: df[k] for k in kept}).to_dict("records")
    beside = path.with_suffix(".json")
    saved = _read_json(beside, option) if beside.exists() else {}
    decay = saved["model"].settle_decay if saved else 0.0  # the settling column's
    out = with_cpu_clock(fit(rows, option, (decay,)), rows, option)
    out["conditions"] = saved.get("conditions") if saved else None
    return out


def _header(path: Path, option: str = "--step-costs") -> set[str]:
    """The CSV's column names, read as every input is (core/inputs: a regular file of a
    bounded size; a FIFO or a device is refused, never read forever)."""
    from benchbatch.core.inputs import read_bytes

    data = read_bytes(path, option).removeprefix(b"\xef\xbb\xbf")
    try:
        first = data.split(b"\n", 1)[0].decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(option, f"cannot read {path}: {e}") from None
    return {c.strip() for c in first.split(",")}


def _read_json(path: Path, option: str) -> dict:
    from benchbatch.core.inputs import read_json

    doc = read_json(path, option)  # a regular file of a bounded size, never a FIFO
    try:
        coef = doc["coefficients_s"]
        values = [float(coef.get(t, 0.0)) for t in TERMS]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(option, f"{path} is no calibration's step_cost.json ({e})") from None
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise UserError(option, f"{path}: a coefficient is negative or not a number")
    decay = doc.get("settle_decay") or 0.0
    if not (isinstance(decay, (int, float)) and 0 <= decay < 1):
        raise UserError(option, f"{path}: settle_decay {decay!r} is not a ratio from 0 to 1")
    block = doc.get("row_block") or 0
    if not (isinstance(block, int) and 0 <= block <= 4096):
        raise UserError(option, f"{path}: row_block {block!r} is not a number of rows")
    model = model_of(values, float(decay), block)
    out = {"model": model, "rows": [], "summary": doc, "conditions": doc.get("conditions")}
    clock = doc.get("cpu_clock")
    if isinstance(clock, dict) and isinstance(clock.get("coefficients_s"), dict):
        try:
            cpu = [float(clock["coefficients_s"].get(t, 0.0)) for t in TERMS]
        except (ValueError, TypeError) as e:
            raise UserError(option, f"{path}: its cpu_clock coefficients ({e})") from None
        if not all(math.isfinite(v) and v >= 0 for v in cpu):
            raise UserError(option, f"{path}: a cpu_clock coefficient is negative or not a number")
        cpu_block = clock.get("row_block") or 0
        if not (isinstance(cpu_block, int) and 0 <= cpu_block <= 4096):
            raise UserError(option, f"{path}: cpu_clock row_block {cpu_block!r} is not a number "
                            "of rows")  # fmt: skip
        out["cpu_model"] = model_of(cpu, float(decay), cpu_block)
    return out


def given(paths: Sequence[Path], option: str = "--step-costs") -> dict:
    """--step-costs read: one calibration (step_cost.json, or a calibration's step_cost.csv),
    or earlier runs' step times (phases, sweep, piggyback or an older step_cost.csv, fitted
    by core/stepcost.py as isolated steps). Returns {"model", "rows", "summary",
    "conditions" (None: not known), "source": "calibration" or "isolated steps"}."""
    from benchbatch.core import stepcost

    found = [(p, read(p, option)) for p in paths]
    calibrations = [(p, c) for p, c in found if c is not None]
    if calibrations:
        if len(found) > 1:
            raise UserError(
                option,
                f"{calibrations[0][0]} is a calibration: give it alone (a calibration is "
                "one run's steps, under one run's conditions)",
            )
        return calibrations[0][1] | {"source": "calibration"}
    model, fitted = stepcost.fit(stepcost.cost_rows_from_csv(paths), option)
    summary = stepcost.cost_summary(model, fitted)
    return {"model": model, "rows": fitted, "summary": summary, "conditions": None,
            "source": "isolated steps"}  # fmt: skip
