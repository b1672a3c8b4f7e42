"""The step-cost model: a step's time as a linear function of what it computes (decode
tokens, prefill tokens, KV entries read), fitted to steps timed on this device, or read from
earlier runs' CSVs (--step-costs). The ablation, the serving curve and occupancy's timed
simulation all price their simulated steps with it.

The steps to fit are timed by benchbatch/runtime/mixed.py (fit_points, cost_rows). The fit is
least squares on relative error; a per-token cost never comes out negative, and
a step measured far above the first fit (another process had the cores) is left out of a
second one. Everything here returns rows or models; nothing prints.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from benchbatch.core.inputs import numeric
from benchbatch.core.metrics import percentile
from benchbatch.core.step_model import StepCostModel, fit_step_cost
from benchbatch.errors import UserError

STEP_COSTS_OPTION = "--step-costs"
OUTLIER = 0.5  # a step measured over 1.5x the fitted cost is treated as noise and refitted


def cost_rows_from_csv(paths: Iterable[Path]) -> list[dict]:
    """Step times from earlier runs: a phases or sweep CSV (phase, batch, tokens, context,
    step_ms), a piggyback.csv (decode_batch, context, prefill_tokens, step_ms) or an
    ablation's step_cost.csv (decode_tokens, prefill_tokens, context_tokens, step_ms)."""
    rows = []
    for path in paths:
        rows += [{"source": str(path), **r} for r in _csv_cost_rows(Path(path))]
    return rows


def _csv_cost_rows(path: Path) -> list[dict]:
    df = _read_costs_csv(path)
    if "status" in df:
        df = df[df["status"] == "ok"]  # the index keeps each row's place, for errors
    cols = set(df.columns)
    if {"decode_tokens", "prefill_tokens", "context_tokens", "step_ms"} <= cols:
        _check_numbers(path, df, ("decode_tokens", "prefill_tokens", "context_tokens"))
        d, p, c = df["decode_tokens"], df["prefill_tokens"], df["context_tokens"]
    elif {"decode_batch", "context", "prefill_tokens", "step_ms"} <= cols:
        _check_numbers(path, df, ("decode_batch", "context", "prefill_tokens"))
        d, p, c = df["decode_batch"], df["prefill_tokens"], df["decode_batch"] * df["context"]
    elif {"phase", "batch", "tokens", "context", "step_ms"} <= cols:
        _check_numbers(path, df, ("batch", "tokens", "context"))
        decode = df["phase"] == "decode"
        d = df["batch"].where(decode, 0)
        p = (df["batch"] * df["tokens"]).where(~decode, 0)
        c = df["batch"] * df["context"]
    else:
        raise UserError(
            STEP_COSTS_OPTION,
            f"{path} has no step times this reads (phases, sweep, piggyback or step_cost CSV)",
        )
    _check_numbers(path, df, ("step_ms",), STEP_MS_RANGE, missing_ok=True)
    out = pd.DataFrame({"decode_tokens": d, "prefill_tokens": p, "context_tokens": c})
    out["step_ms"] = df["step_ms"]
    out["kind"] = "file"
    out = out.dropna()
    if not len(out):
        raise UserError(STEP_COSTS_OPTION, f"{path} holds no measured step")
    return out.to_dict("records")


# A step time in ms no device and no model gives: faster than 100 ns, slower than an hour.
STEP_MS_RANGE = (1e-4, 3.6e6)
TOKENS_RANGE = (0, 1e9)  # tokens, batches and contexts of one step


def _read_costs_csv(path: Path) -> pd.DataFrame:
    import io

    from benchbatch.core.inputs import read_bytes, reason

    data = read_bytes(path, STEP_COSTS_OPTION).removeprefix(b"\xef\xbb\xbf")
    try:
        df = pd.read_csv(io.BytesIO(data), index_col=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as e:
        raise UserError(STEP_COSTS_OPTION, f"cannot read {path}: {reason(e)}") from None
    _check_last_line(path, data)
    return df


def _check_last_line(path: Path, data: bytes) -> None:
    """A file cut short (core/inputs.cut_short) is refused, never read as a step with its
    last fields empty."""
    from benchbatch.core.inputs import cut_short

    said = cut_short(data)
    if said:
        raise UserError(STEP_COSTS_OPTION, f"{path} {said}")


def _check_numbers(path, df, columns, bounds=TOKENS_RANGE, missing_ok: bool = False) -> None:
    """Each column numbers within bounds (an empty cell only where missing_ok: a step that
    was not measured); else a UserError naming the file, line and column."""
    lo, hi = bounds
    for col in columns:
        numbers = numeric(df[col])
        bad = ~numbers.between(lo, hi)
        if missing_ok:
            bad &= df[col].notna()
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(
                STEP_COSTS_OPTION,
                f"{path} row {df.index[i] + 1}: {col} {str(df[col].iloc[i])[:40]!r} is not a "
                f"number in [{lo:g}, {hi:g}]",
            )
        df[col] = numbers


def fit(rows: list[dict], option: str = STEP_COSTS_OPTION) -> tuple[StepCostModel, list[dict]]:
    """The linear step-cost model, least squares on relative error (each step counts alike,
    so the short decode steps that make up TBT are fitted as well as the long prefills).
    A per-token cost never comes out negative: a feature whose coefficient would (noise, or
    samples that cannot separate it, e.g. one context only) is left out and the rest refitted.
    When timing noise hides every per-token cost the model is flat (cost_summary says which
    costs were left unmeasured); samples too few to determine one are refused. Returns the
    model and the rows with its prediction beside each measurement."""
    model = _fit_nonnegative(rows, option)
    # A busy device only ever slows a step down: a measurement far above the first fit is
    # noise (another process had the cores), so it is left out of a second fit.
    used = [predict(model, r) * 1e3 * (1 + OUTLIER) >= r["step_ms"] for r in rows]
    if not all(used):
        kept = [r for r, u in zip(rows, used, strict=True) if u]
        try:
            model = _fit_nonnegative(kept, option)
        except UserError:
            used = [True] * len(rows)
    fitted = []
    for r, u in zip(rows, used, strict=True):
        ms = 1e3 * predict(model, r)
        fitted.append({**r, "fitted_ms": ms, "error": ms / r["step_ms"] - 1, "used": u})
    return model, fitted


def _fit_nonnegative(rows: list[dict], option: str) -> StepCostModel:
    """Least squares, leaving out a feature whose cost comes out negative (noise: down to a
    flat model if need be) or that the samples cannot separate (the context, first), and
    fitting through the origin when the base cost comes out negative; samples that
    determine nothing even then are refused."""
    samples = [
        (r["decode_tokens"], r["prefill_tokens"], r["context_tokens"], r["step_ms"] / 1e3)
        for r in rows
    ]
    weights = [1 / s[3] ** 2 for s in samples]
    left_out: set[int] = set()  # 0 decode, 1 prefill, 2 context
    through_origin = False  # a negative base (noise) would price small steps below zero
    while True:
        kept = [(*(0 if j in left_out else s[j] for j in range(3)), s[3]) for s in samples]
        intercept = not through_origin or len(left_out) == 3  # a flat model keeps its base
        try:
            model = fit_step_cost(kept, weights, intercept)
        except ValueError:
            if 2 in left_out:
                raise UserError(
                    option,
                    "the step times do not determine a cost model: they need decode steps of "
                    "two batch sizes or more and, for prefills, two prompt lengths or more",
                ) from None
            left_out.add(2)
            continue
        if model.base_s < 0 and not through_origin:
            through_origin = True
            continue
        bad = [j for j in (2, 0, 1) if j not in left_out and _per_token(model)[j] < 0]
        if not bad:
            return model
        left_out.add(bad[0])


def unmeasured(model: StepCostModel, rows: list[dict]) -> list[str]:
    """Per-token costs the samples held but the fit left at 0: decode or prefill tokens that
    did not make any step measurably slower (timing noise larger than their cost)."""
    names = ("decode_tokens", "prefill_tokens")
    return [
        name
        for name, coef in zip(names, _per_token(model)[:2], strict=False)
        if coef == 0 and any(r[name] for r in rows)
    ]


def _per_token(model: StepCostModel) -> tuple[float, float, float]:
    return model.per_decode_token_s, model.per_prefill_token_s, model.per_context_token_s


def predict(model: StepCostModel, row: dict) -> float:
    return (
        model.base_s
        + model.per_decode_token_s * row["decode_tokens"]
        + model.per_prefill_token_s * row["prefill_tokens"]
        + model.per_context_token_s * row["context_tokens"]
    )


def cost_summary(model: StepCostModel, fitted: list[dict]) -> dict:
    """step_cost.json: the coefficients, and how well they fit (median and largest |error|)."""
    errors = [abs(r["error"]) for r in fitted if r["used"]]
    return {
        "per_token_costs_unmeasured": unmeasured(model, fitted),
        "base_ms": model.base_s * 1e3,
        "per_decode_token_ms": model.per_decode_token_s * 1e3,
        "per_prefill_token_ms": model.per_prefill_token_s * 1e3,
        "per_context_token_us": model.per_context_token_s * 1e6,
        "samples": sum(r["used"] for r in fitted),
        "left_out_as_noise": sum(not r["used"] for r in fitted),
        "median_abs_error": percentile(errors, 50),
        "max_abs_error": max(errors),
        "fit": "least squares on relative error",
    }
