"""A step-cost fit in one line, as the views and scripts print it: the engine's calibration
(step_cost.json's fit, calibration.summary: `line`) or an isolated-step fit
(stepcost.cost_summary: `cost_line`); `step_cost_line` says whichever it is given."""

from __future__ import annotations

import math

from benchbatch.core.units import significant


def line(s: dict, clock: str = "wall") -> str:
    """The calibration in one line, with each term's standard error and the kinds' errors.
    clock "cpu": its fit on the compute thread's CPU clock (s["cpu_clock"], what
    serve-sweep simulates its sweep on), the wall clock's error beside; "wall" where it
    has none."""
    on_cpu = clock == "cpu" and bool((s.get("cpu_clock") or {}).get("coefficients_s"))
    wall = s
    if on_cpu:
        fitted = ("coefficients_s", "std_errors_s", "kinds", "host_gap_ms", "row_block",
                  "wake_ms", "wake_power", "wake")  # fmt: skip
        s = s | {k: s["cpu_clock"][k] for k in fitted if k in s["cpu_clock"]}
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
    parts += _wake_part(s)
    kinds = ", ".join(
        f"{kind} {v['median_abs_error']:.0%}/{v['p90_abs_error']:.0%}"
        for kind, v in s["kinds"].items()
    )
    gap = s.get("host_gap_ms") or 0.0
    host = f"; {gap * 1e3:.0f} us between steps in base" if gap > 0 else ""
    held = s.get("cpu_clock") or {}
    share = held.get("core_share")
    if on_cpu:
        host += (f"; the core held {share:.0%} of the time" if share == share else "") + (
            f"; the wall clock's fit |error| median {wall['median_abs_error']:.0%}")  # fmt: skip
    elif share is not None and share == share:
        host += (
            f"; the core held {share:.0%} of the time, the CPU clock's fit "
            f"|error| median {held['median_abs_error']:.0%}"
        )
    where = " on the CPU clock" if on_cpu else ""
    return (
        f"{s.get('calibrated', 'engine')} calibration{where} ({s['samples']} steps): "
        + " + ".join(parts)
        + f" (|error| median/p90: {kinds}{host})"
    )  # fmt: skip


def _wake_part(s: dict) -> list[str]:
    """The core's wake (core/wake.py) with its standard error, where the fit has one."""
    if not (s.get("wake_ms") or 0) > 0:
        return []
    error = ((s.get("wake") or {}).get("wake_std_error_s") or math.nan) * 1e3
    return [f"{significant(s['wake_ms'], 3)}±{significant(error, 2)} ms x (idle s)^"
            f"{s.get('wake_power', 0.5):g} after an idle wait"]  # fmt: skip


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


def step_cost_line(s: dict, clock: str = "wall") -> str:
    """Whichever fit s summarizes, in one line: the engine's calibration has standard
    errors (clock: which of its fits, line's), an isolated-step fit does not."""
    said = line(s, clock) if "std_errors_s" in s else cost_line(s)
    reused = s.get("reused_from")
    return said if not reused else f"{said}; reused from {', '.join(map(str, reused))}"
