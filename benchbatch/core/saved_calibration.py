"""A calibration kept with a run (step_cost.json, step_cost.csv): the conditions it was
measured under, checked when it is used again (another device refused, the rest flagged by
name), and the calibration read back for --step-costs (core/calibration.py fits it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
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
# The model's shape, its weights' layout (chosen by timing in each run), --compile and the
# KV cache's layout change what a step costs as much as the device's threads do.
REFUSED = ("device",)
FLAGGED = ("host_id", "benchbatch", "threads", "torch", "dtype", "load_class", "pinned_cores",
           "model", "weight_layout", "compiled", "kv_layout")  # fmt: skip


def refuse_device(saved: dict | None, device: str | None, option: str = "--step-costs") -> None:
    """A UserError where a calibration's device is known and is not this run's: its costs
    are another machine's (checked as the run opens, before its folder, and again when
    its conditions are compared)."""
    was = (saved or {}).get("device")
    if was is not None and device is not None and was != device:
        raise UserError(
            option,
            f"the calibration was measured on {was!r}, this run is on {device!r}: its step "
            "costs are another device's (calibrate here: drop --step-costs)",
        )


def compare(saved: dict, current: dict, option: str = "--step-costs") -> list[str]:
    """The differences between a calibration's conditions and this run's: a UserError for
    another device, a warning line for each other difference (host, benchbatch version,
    threads, torch version, dtype, load class, pinning, model shape, weight layout,
    compile, KV layout), and one naming the conditions the calibration does not say (an
    older benchbatch's, or edited), which are not compared. Values compare as text (a
    threads of "1" is 1)."""
    refuse_device(saved, current.get("device"), option)
    out = []
    for key in FLAGGED:
        if key in saved and key in current and str(saved[key]) != str(current[key]):
            out.append(f"{key} {saved[key]} at calibration, {current[key]} now")
    lines = [] if not out else [
        "the step-cost calibration was made under other conditions ("
        + "; ".join(out)
        + "): the simulation may be off by as much as they change a step; calibrate again "
        "(drop --step-costs) to measure under these"
    ]  # fmt: skip
    unknown = [k for k in (*REFUSED, *FLAGGED) if k not in saved and k in current]
    if unknown:
        lines.append(
            f"the step costs do not say their {', '.join(unknown)} (not recorded where they "
            "were measured): not checked against this run's"
        )
    return lines


# --- reading a calibration back ----------------------------------------------------------------


def read(path: Path, option: str = "--step-costs") -> dict | None:
    """A calibration saved with a run: step_cost.json (its coefficients and conditions), or
    a step_cost.csv with the sequences column (refitted; conditions from the step_cost.json
    beside it, whose "samples" its rows must match: a CSV cut short, or another run's, is
    refused). None: not a calibration (an older CSV: stepcost reads it). The result's
    "notes": warnings to say (a calibration whose conditions are unknown)."""
    path = Path(path)
    if path.suffix == ".json":
        return _read_json(path, option)
    head = _header(path, option)
    if "sequences" not in head or "step_ms" not in head:
        return None
    import pandas as pd

    from benchbatch.core.stepcost import _check_numbers, _read_costs_csv

    df = _read_costs_csv(path)  # a last line cut short is refused there
    beside = path.with_suffix(".json")
    saved = _read_json(beside, option) if beside.exists() else {}
    if saved and len(df) != saved["summary"]["samples"]:
        raise UserError(
            option,
            f"{path} has {len(df)} steps, its step_cost.json says {saved['summary']['samples']}: "
            "cut short or from another run (give the step_cost.json, or the pair as saved)",
        )
    optional = ("gathered_tokens", "first_tokens", "admitted", "masked_tokens", "batched",
                "settling", "prompt_pairs", "decode_only_rows", "prefill_step")  # fmt: skip
    for name in optional:  # older calibrations lack them
        if name not in df:
            df[name] = 0
    columns = [f for f in FEATURES if f != "row_blocks"]  # row_blocks: computed
    _check_numbers(path, df, columns)
    _check_numbers(path, df, ("step_ms",), (1e-4, 3.6e6))
    clocks = [c for c in ("gap_ms", "cpu_ms", "gap_cpu_ms", "idle_ms") if c in df]
    kept = (*columns, "step_ms", *clocks)
    rows = pd.DataFrame({k: df[k] for k in kept}).to_dict("records")
    decay = saved["model"].settle_decay if saved else 0.0  # the settling column's
    out = with_cpu_clock(fit(rows, option, (decay,)), rows, option)
    out["conditions"] = saved.get("conditions") if saved else None
    out["notes"] = saved["notes"] if saved else [_unknown(path, "no step_cost.json beside it")]
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
    if not any(values):
        raise UserError(option, f"{path}: a calibration with no coefficients (every step "
                        "would cost nothing): no calibration's step_cost.json")  # fmt: skip
    _check_fit(path, doc, option)
    decay = doc.get("settle_decay") or 0.0
    if not (isinstance(decay, (int, float)) and 0 <= decay < 1):
        raise UserError(option, f"{path}: settle_decay {decay!r} is not a ratio from 0 to 1")
    block = doc.get("row_block") or 0
    if not (isinstance(block, int) and 0 <= block <= 4096):
        raise UserError(option, f"{path}: row_block {block!r} is not a number of rows")
    model = _woken(model_of(values, float(decay), block), doc, path, option)
    conditions = doc.get("conditions")
    conditions = conditions if isinstance(conditions, dict) and conditions else None
    notes = [] if conditions else [_unknown(path, 'it records no "conditions"')]
    out = {"model": model, "rows": [], "summary": doc, "conditions": conditions, "notes": notes}
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
        _check_fit(path, clock, option, "cpu_clock ")
        out["cpu_model"] = _woken(model_of(cpu, float(decay), cpu_block), clock, path, option,
                                  "cpu_clock ")  # fmt: skip
    return out


def _woken(model, doc: dict, path: Path, option: str, where: str = ""):
    """The model with the saved fit's wake (core/wake.py; none in older calibrations)."""
    ms, power = doc.get("wake_ms") or 0.0, doc.get("wake_power") or 0.5
    numbers = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (ms, power))
    if not (numbers and ms >= 0 and 0 < power <= 2):
        raise UserError(option, f"{path}: {where}wake_ms {ms!r} or wake_power {power!r} is "
                        "not a time and an exponent from 0 to 2")  # fmt: skip
    return replace(model, wake_s=ms / 1e3, wake_power=float(power))


def given(paths: Sequence[Path], option: str = "--step-costs") -> dict:
    """--step-costs read: one calibration (step_cost.json, or a calibration's step_cost.csv),
    or earlier runs' step times (phases, sweep, piggyback or an older step_cost.csv, fitted
    by core/stepcost.py as isolated steps; their runs' conditions read from the
    metadata.json beside each: files of two devices are refused). Returns {"model", "rows",
    "summary", "conditions" (None: not known), "source": "calibration" or "isolated
    steps", "notes": one-line warnings for the caller to say (conditions unknown, or files
    whose runs differ)}."""
    from benchbatch.core import stepcost

    found = [(p, read(p, option)) for p in paths]
    where = [str(Path(p).resolve()) for p in paths]  # what a run that reuses them keeps
    calibrations = [(p, c) for p, c in found if c is not None]
    if calibrations:
        if len(found) > 1:
            raise UserError(
                option,
                f"{calibrations[0][0]} is a calibration: give it alone (a calibration is "
                "one run's steps, under one run's conditions)",
            )
        return {"notes": []} | calibrations[0][1] | {"source": "calibration", "paths": where}
    conditions, notes = _isolated_conditions([Path(p) for p in paths], option)
    model, fitted = stepcost.fit(stepcost.cost_rows_from_csv(paths), option)
    summary = stepcost.cost_summary(model, fitted)
    if conditions is not None:  # kept with the run's step_cost.json and metadata
        summary["conditions"] = conditions
    return {"model": model, "rows": fitted, "summary": summary, "conditions": conditions,
            "source": "isolated steps", "notes": notes, "paths": where}  # fmt: skip


def _unknown(path: Path, why: str) -> str:
    return f"{path}: {why}: its conditions are unknown: not checked against this run's"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_fit(path: Path, doc: dict, option: str, where: str = "") -> None:
    """What the calibration's line (core/calibration_text.py) and the runs that reuse it
    read of its fit: the steps it was fitted to ("samples", the top level's), each kind's
    errors ("kinds"), the standard errors and the host gap; missing or of another type,
    refused in one line naming the key."""
    problems = []
    if not where:
        samples = doc.get("samples")
        if not (_number(samples) and samples == int(samples) and samples > 0):
            problems.append(f'"samples" {samples!r} (the steps it was fitted to)')
    kinds = doc.get("kinds", None if not where else {})
    if not isinstance(kinds, dict) or not all(
        isinstance(v, dict) and _number(v.get("median_abs_error"))
        and _number(v.get("p90_abs_error")) for v in kinds.values()
    ):  # fmt: skip
        problems.append(f'"kinds" {str(kinds)[:40]!r} (each step kind\'s errors)')
    errors = doc.get("std_errors_s", None if not where else {})
    if not isinstance(errors, dict) or not all(
        v is None or _number(v) for v in errors.values()
    ):
        problems.append(f'"std_errors_s" {str(errors)[:40]!r} (each term\'s standard error)')
    for key in ("host_gap_ms", "median_abs_error", "core_share"):
        if doc.get(key) is not None and not _number(doc[key]):
            problems.append(f'"{key}" {str(doc[key])[:40]!r}')
    if where and doc.get("core_share") is not None and not _number(doc.get("median_abs_error")):
        problems.append('"median_abs_error" (the CPU clock fit\'s error)')
    if problems:
        raise UserError(
            option,
            f"{path}: its {where}fit lacks or mangles {'; '.join(problems)}: no calibration's "
            "step_cost.json",
        )


# What a run's metadata.json says of the conditions its step times were measured under, in
# runtime/calibrate.py's conditions' names and forms (dtype as torch names it, the model's
# shape as calibrate.model_shape writes it); the device is refused when files differ, the
# rest said.
DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
NOTED = ("threads", "dtype", "model", "torch", "benchbatch", "load_class")


def _isolated_conditions(paths: Sequence[Path], option: str) -> tuple[dict | None, list[str]]:
    """The step-time files' runs' conditions, from the metadata.json beside each: the ones
    every file that has them agrees on (None where no file has any), and the notes to say
    (a file without them; files whose runs differ). Files of two devices: a UserError."""
    notes, known = [], []
    for path in paths:
        cond, why = _run_conditions(path, option)
        if cond is None:
            notes.append(_unknown(path, why))
        else:
            known.append((path, cond))
    devices = {}
    for path, cond in known:
        if isinstance(cond.get("device"), str):
            devices.setdefault(cond["device"], path)
    if len(devices) > 1:
        (one, a), (other, b) = list(devices.items())[:2]
        raise UserError(
            option,
            f"{a} was measured on {one!r}, {b} on {other!r}: step times of two devices are "
            "not one device's step costs (give one device's files)",
        )
    differ = []
    for key in NOTED:
        seen = {str(c[key]): p for p, c in known if key in c}
        if len(seen) > 1:
            shown = (f"'{v}' ({p})" if ", " in v else f"{v} ({p})" for v, p in seen.items())
            differ.append(f"{key} " + ", ".join(shown))
    if differ:
        notes.append(
            "the step-time files' runs differ (" + "; ".join(differ) + "): fitted together, "
            "the step costs are a mix of them, off for each (give one run's files)"
        )
    if not known:
        return None, notes
    first = known[0][1]
    agreed = {k: v for k, v in first.items() if all(str(c.get(k)) == str(v) for _, c in known)}
    return agreed or None, notes


def _run_conditions(path: Path, option: str) -> tuple[dict | None, str]:
    """The conditions of the run whose folder holds `path`, from its metadata.json (a
    step_cost.csv's own, as that run saved them with its step costs, else the run's device,
    dtype, threads, torch, benchbatch, load class and model shape); (None, why) without."""
    from benchbatch.core.inputs import read_json

    meta_path = path.parent / "metadata.json"
    if not meta_path.exists():
        return None, "no metadata.json beside it"
    try:
        meta = read_json(meta_path, option)
    except UserError:
        return None, "its metadata.json cannot be read"
    if not isinstance(meta, dict):
        return None, "its metadata.json holds no run's metadata"
    saved = meta.get("step_cost")
    if path.name.startswith("step_cost") and isinstance(saved, dict):
        own = saved.get("conditions")
        if isinstance(own, dict) and own:
            return own, ""
    env, threads, cfg = (meta.get(k) if isinstance(meta.get(k), dict) else {}
                         for k in ("environment", "threads", "config"))  # fmt: skip
    out = {
        "device": env.get("device_name"),
        "dtype": DTYPE_NAMES.get(env.get("dtype"), env.get("dtype")),
        "threads": threads.get("threads"),
        "torch": env.get("torch_version"),
        "benchbatch": env.get("benchbatch_version"),
        "model": _shape(cfg),
    }
    load, cores = threads.get("load_average"), threads.get("physical_cores")
    if _number(load) and _number(cores):
        out["load_class"] = load_class(float(load), int(cores))
    out = {k: v for k, v in out.items() if v is not None and isinstance(v, (str, int, float))}
    if not out:
        return None, "its metadata.json names no device, dtype, threads or model"
    return out, ""


def _shape(cfg: dict) -> str | None:
    """A model config's shape as runtime/calibrate.py's model_shape writes it (None: not all
    of it said)."""
    keys = ("hidden", "layers", "heads", "intermediate", "vocab")
    if not all(_number(cfg.get(k)) for k in keys):
        return None
    kv = cfg.get("kv_heads") or cfg["heads"]
    return (f"hidden {cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads "
            f"({kv} KV), intermediate {cfg['intermediate']}, vocab {cfg['vocab']}")  # fmt: skip
