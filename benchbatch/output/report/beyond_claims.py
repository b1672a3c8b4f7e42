"""The claims the report judges beyond the article's tables: S (the serving curve's knees,
serve-sweep's view of claim C) and P (the simulation beside the real engine's runs of the
same requests). Verdicts and Claim as claims.py's."""

from __future__ import annotations

import math

from benchbatch.output.render import fmt
from benchbatch.output.report.cells import number
from benchbatch.output.report.claims import FAILS, HOLDS, PARTLY, UNMEASURED, Claim


def _sustained(row: dict) -> float | None:
    """The largest rate a policy kept within the SLO: a number, infinite for the max point
    (every request at once, serve-sweep's `max`), else None."""
    value = row.get("sustained_rps")
    if value == "max" or (isinstance(value, str | float) and str(value).lower() == "inf"):
        return math.inf
    return number(row, "sustained_rps")


def _rate(rate: float) -> str:
    return "max (every request at once)" if math.isinf(rate) else f"{fmt(rate)} req/s"


def serve_claim(slo: list[dict]) -> Claim:
    """Claim S on the simulated rows. With both knees bisected (and their ranges with every
    step 10% slower and faster): holds when continuous's whole range lies above static's,
    partly when its knee is higher but the ranges overlap (within the step costs' noise),
    fails otherwise. Without them, on the swept rates each sustains."""
    by = {r["policy"]: r for r in slo if r.get("source") == "sim"}
    measured, verdict = "not measured", UNMEASURED
    if "static" in by and "continuous" in by:
        s, cont = by["static"], by["continuous"]
        knees = [[number(r, k) for k in ("knee_rps", "knee_rps_slow", "knee_rps_fast")]
                 for r in (s, cont)]  # fmt: skip
        if all(v is not None for k in knees for v in k):  # number(): finite or None
            (sk, s_slow, s_fast), (ck, c_slow, c_fast) = knees
            measured = (
                f"continuous's knee {fmt(ck)} req/s ({fmt(c_slow)}-{fmt(c_fast)}), static's "
                f"{fmt(sk)} ({fmt(s_slow)}-{fmt(s_fast)}) (simulated; in parentheses every "
                "step 10% slower-faster)"
            )
            verdict = HOLDS if c_slow > s_fast else (PARTLY if ck > sk else FAILS)
        elif all(v is not None for v in knees[0]) and knees[1][0] is None and (
                _sustained(cont) is not None):  # fmt: skip
            # static saturated within the sweep, continuous never did: it kept up (and
            # within the SLO) to its largest rate, which is what it sustains at least
            (sk, s_slow, s_fast), cr = knees[0], _sustained(cont)
            measured = (
                f"continuous within the SLO up to {_rate(cr)} with no knee below it, "
                f"static's knee {fmt(sk)} req/s ({fmt(s_slow)}-{fmt(s_fast)}) (simulated; in "
                "parentheses every step 10% slower-faster)"
            )
            verdict = HOLDS if cr > s_fast else (PARTLY if cr > sk else FAILS)
        else:
            sr, cr = (_sustained(r) or 0.0 for r in (s, cont))
            measured = f"continuous within up to {_rate(cr)}, static up to {_rate(sr)} (simulated)"
            verdict = HOLDS if cr > sr else (PARTLY if cr == sr else FAILS)
    return Claim(
        "S",
        "continuous batching sustains a higher request rate than static within the same SLO",
        "(a serving benchmark's view of claim C)",
        measured,
        verdict,
        "holds when continuous's knee, every step 10% slower, is above static's every step 10% "
        "faster (where continuous never saturates on the swept rates, its largest rate within "
        "the SLO stands for its knee); partly when its knee is higher but the ranges overlap "
        "(on the swept rates where no knee was bisected: higher, or the same)",
    )


PREDICTION_RULE_TEXT = (
    "holds when measured over simulated falls within its target band (0.9-1.1 for p50s and "
    "wall time, 0.8-1.25 for p99s) for every metric of every policy; partly when for at "
    "least half of them; does not hold otherwise"
)


def prediction_claim(rows: list[dict]) -> Claim:
    """Claim P on prediction.csv's rows (the real engine's runs beside their simulation of
    the same requests, core/prediction.py): how many judged pairs fall within their band."""
    judged = [r for r in rows if _within(r) is not None]
    measured, verdict = "not measured", UNMEASURED
    if judged:
        hit = sum(bool(_within(r)) for r in judged)
        ratios = [number(r, "ratio") for r in judged]
        measured = (
            f"{hit} of {len(judged)} within target (measured over simulated "
            f"x{min(ratios):.2f}-x{max(ratios):.2f})"
        )
        verdict = HOLDS if hit == len(judged) else (PARTLY if 2 * hit >= len(judged) else FAILS)
    return Claim(
        "P",
        "the simulator predicts the real engine's runs of the same requests",
        "(not in the article: benchbatch's simulation, calibrated on the engine's own steps)",
        measured,
        verdict,
        PREDICTION_RULE_TEXT,
    )


def _within(row: dict) -> bool | None:
    """prediction.csv's within cell as a bool (None: not judged); CSVs hold text."""
    value = row.get("within")
    if value in (True, "True", "true"):
        return True
    if value in (False, "False", "false"):
        return False
    return None
