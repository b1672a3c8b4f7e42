"""A step-cost fit in one line, as the views and scripts print it: the engine's calibration
(step_cost.json's fit, calibration.summary: `line`) or an isolated-step fit
(stepcost.cost_summary: `cost_line`); `step_cost_line` says whichever it is given."""

from __future__ import annotations

import math

from benchbatch.core.units import significant


def line(s: dict) -> str:
    """The calibration in one line, with each term's standard error and the kinds' errors."""
    # NaN (no error: a term at its bound) is null once written to step_cost.json.
    se = {k: math.nan if v is None else v for k, v in s["std_errors_s"].items()}
    decay = s.get("settle_decay") or 0
    terms = [("base_s", 1e3, "ms"), ("per_sequence_s", 1e3, "ms/seq"),
             ("per_decode_token_s", 1e3, "ms/decode tok"),
             ("per_prefill_token_s", 1e3, "ms/prefill tok"),
             ("per_context_token_s", 1e6, "us/context tok"),
             ("per_gathered_token_s", 1e6, "us/gathered tok"),
             ("request_overhead_s", 1e3, "ms/request"),
             ("per_admitted_s", 1e3, "ms/admitted"),
             ("per_masked_token_s", 1e6, "us/masked tok"),
             ("batched_step_s", 1e3, "ms/batched step"),
             ("settle_s", 1e3, f"ms/change (x{decay:.2f} a step on)"),
             ("per_prompt_pair_s", 1e9, "ns/prompt pair"),
             ("per_row_block_s", 1e3, f"ms/block of {s.get('row_block') or 0} decode rows"),
             ("per_decode_only_row_s", 1e3, "ms/decode-only row"),
             ("prefill_step_s", 1e3, "ms/prefill step")]  # fmt: skip
    coef = s["coefficients_s"]
    # A term no step holds (zero, no error: an engine's request overhead, an endpoint's
    # per-sequence and gathered costs) is left out of the line.
    if s.get("masked_keys_tied"):  # one price: said once
        terms = [(t, k, "us/context or masked tok" if t == "per_context_token_s" else u)
                 for t, k, u in terms if t != "per_masked_token_s"]  # fmt: skip
    parts = [f"{significant(coef.get(t, 0.0) * k, 3)}±{significant(se.get(t, math.nan) * k, 2)} {u}"
             for t, k, u in terms
             if coef.get(t) or math.isfinite(se.get(t, math.nan))]  # fmt: skip
    kinds = ", ".join(
        f"{kind} {v['median_abs_error']:.0%}/{v['p90_abs_error']:.0%}"
        for kind, v in s["kinds"].items()
    )
    gap = s.get("host_gap_ms") or 0.0
    host = f"; {gap * 1e3:.0f} us between steps in base" if gap > 0 else ""
    clock = s.get("cpu_clock") or {}
    if clock.get("core_share") is not None and clock["core_share"] == clock["core_share"]:
        host += (
            f"; the core held {clock['core_share']:.0%} of the time, the CPU clock's fit "
            f"|error| median {clock['median_abs_error']:.0%}"
        )
    return (
        f"{s.get('calibrated', 'engine')} calibration ({s['samples']} steps): "
        + " + ".join(parts)
        + f" (|error| median/p90: {kinds}{host})"
    )  # fmt: skip


def cost_line(s: dict) -> str:
    """An isolated-step fit (stepcost.cost_summary) in one line."""
    return (
        f"step cost fitted to {s['samples']} steps: {significant(s['base_ms'], 3)} ms + "
        f"{significant(s['per_decode_token_ms'], 3)} ms/decode token + "
        f"{significant(s['per_prefill_token_ms'], 3)} ms/prefill token + "
        f"{significant(s['per_context_token_us'], 3)} us/context token "
        f"(median error {s['median_abs_error']:.0%}, largest {s['max_abs_error']:.0%}"
        + (f"; {s['left_out_as_noise']} slowed by noise left out" if s["left_out_as_noise"] else "")
        + ")"
    )


def step_cost_line(s: dict) -> str:
    """Whichever fit s summarizes, in one line: the engine's calibration has standard
    errors, an isolated-step fit does not."""
    return line(s) if "std_errors_s" in s else cost_line(s)
