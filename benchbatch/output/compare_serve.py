"""serve-sweep's folders side by side: their points matched by absolute rate, and their
simulated knees with the ranges the step costs allow (pure pandas; compare.py loads and
merges the tables)."""

from __future__ import annotations

import math

import pandas as pd

from benchbatch.output.compare import ratio

# --- serve-sweep points, matched by absolute rate ------------------------------------------

# Two rates closer than this (relative) are one rate: what rounding leaves of a rate given
# the same on two machines (2 and 2.0000001 req/s), far below two rates a sweep would pick.
RATE_TOLERANCE = 1e-3
MATCHED_RATE = "matched_rate"  # the column the comparison pivots serve rows on


def rate_text(rps: float) -> str:
    return "max" if math.isinf(rps) else f"{rps:.6g}"


def rate_groups(rates: dict[str, list[float]], tolerance: float = RATE_TOLERANCE) -> dict:
    """Each run's rates (req/s; inf: the max point) to one shared value per group of rates
    within `tolerance` of the group's smallest: {run: {rate: shared}}. Two rates of one run
    are never one group (a run's own points stay apart)."""
    values = sorted({(v, run) for run, vs in rates.items() for v in vs})
    shared: dict[str, dict[float, float]] = {run: {} for run in rates}
    first, members = None, set()
    for v, run in values:
        near = first is not None and (v == first or v <= first * (1 + tolerance))
        if not near or run in members:
            first, members = v, set()
        members.add(run)
        shared[run][v] = first
    return shared


def check_like(serve: pd.DataFrame, runs: list[str]) -> None:
    """Concurrency sweeps (several --max-concurrency caps at one rate) are compared with
    concurrency sweeps only, point by cap: a UserError naming the runs where they are mixed
    with rate sweeps."""
    from benchbatch.core.serving import concurrency_sweep
    from benchbatch.output.compare import fail

    if "max_concurrency" not in serve:
        return
    caps = [r for r in runs if concurrency_sweep(serve[serve["run"] == r].to_dict("records"))]
    rates = [r for r in runs if r not in caps]
    if caps and rates:
        raise fail(
            f"{', '.join(caps)}: several --max-concurrency caps (a concurrency sweep), and "
            f"{', '.join(rates)}: request rates; compare concurrency sweeps with each other"
        )


def match_rates(serve: pd.DataFrame, runs: list[str]) -> tuple[pd.DataFrame, dict]:
    """The serve rows with MATCHED_RATE (the text of the rate they share with other runs'
    points, within RATE_TOLERANCE: points are matched by absolute rate_rps, not by their
    labels), and which rates every run has and which only some runs have."""
    rates = {r: serve.loc[serve["run"] == r, "rate_rps"].dropna().unique().tolist() for r in runs}
    shared = rate_groups(rates)
    keys = [rate_text(shared[run][rps]) if rps == rps else "" for run, rps in
            zip(serve["run"], serve["rate_rps"], strict=True)]  # fmt: skip
    swept = concurrency_sweeps(serve, runs)
    if swept:  # each point its rate and cap: "max, 4 in flight"
        keys = [f"{k}, {int(cap)} in flight" if cap == cap else k
                for k, cap in zip(keys, serve["max_concurrency"], strict=True)]  # fmt: skip
    out = serve.assign(**{MATCHED_RATE: keys})
    having: dict[tuple, list[str]] = {}
    for run in runs:
        mine = out[out["run"] == run]
        for key in sorted(set(zip(_order_value(mine), mine[MATCHED_RATE], strict=True))):
            having.setdefault(key, []).append(run)
    order = sorted(having)
    summary = {
        "tolerance": RATE_TOLERANCE,
        "matched": [k for v, k in order if len(having[(v, k)]) == len(runs)],
        "not_in_every_run": [
            {"rate": k, "runs": having[(v, k)]} for v, k in order if len(having[(v, k)]) < len(runs)
        ],
    }
    return out, summary | ({"caps": True} if swept else {})


def concurrency_sweeps(serve: pd.DataFrame, runs: list[str]) -> bool:
    """Every run is a concurrency sweep (check_like refuses a mix): points by cap."""
    from benchbatch.core.serving import concurrency_sweep

    return "max_concurrency" in serve and all(
        concurrency_sweep(serve[serve["run"] == r].to_dict("records")) for r in runs)  # fmt: skip


def _order_value(serve: pd.DataFrame) -> list:
    """Each row's place in the table's order: its matched rate (max last), then its cap."""
    value = pd.to_numeric(serve[MATCHED_RATE].str.split(",").str[0].replace("max", "inf"),
                          errors="coerce").fillna(math.inf)  # fmt: skip
    caps = (serve["max_concurrency"] if "max_concurrency" in serve
            else pd.Series(math.nan, index=serve.index)).fillna(0)  # fmt: skip
    return list(zip(value.tolist(), caps.tolist(), strict=True))


def rate_order(serve: pd.DataFrame) -> pd.DataFrame:
    """Rows by policy and source as first seen, then by rate (the matched one's value)."""
    rank = {k: i for i, k in enumerate(dict.fromkeys(zip(serve["policy"], serve["source"],
                                                         strict=True)))}  # fmt: skip
    keys = [rank[k] for k in zip(serve["policy"], serve["source"], strict=True)]
    return serve.assign(_group=keys, _value=_order_value(serve)).sort_values(
        ["_group", "_value"], kind="stable").drop(columns=["_group", "_value"])  # fmt: skip


# --- serve-sweep's simulated knees, with their ranges ---------------------------------------

KNEE_COLUMNS = ("knee_rps", "knee_rps_slow", "knee_rps_fast")


def knees(slo: pd.DataFrame, runs: list[str]) -> list[dict]:
    """Per policy whose simulated knee some run bisected (slo.csv's knee columns): each run's
    knee and its range with every step 10% slower and faster ({run: (knee, slow, fast)}),
    and, for every later run, its knee over the first run's and whether the two ranges
    overlap (agree within the noise the runs report) or not."""
    if not set(KNEE_COLUMNS) <= set(slo.columns):
        return []
    sim = slo[(slo["source"] == "sim") & slo["knee_rps"].notna()]
    out = []
    for policy, mine in sim.groupby("policy", sort=False):
        by = {r["run"]: tuple(float(r[c]) for c in KNEE_COLUMNS) for _, r in mine.iterrows()}
        out.append({"policy": policy, **side_by_side(by, runs)})
    return out


def side_by_side(by: dict[str, tuple[float, float, float]], runs: list[str]) -> dict:
    """One number from several runs, each (value, low, high) with the range its run reports:
    {"runs": the runs that have it, in order; "versus_first": for every later run, its value
    over the first run's and whether their ranges overlap (agree within the noise) or not}."""
    by = {run: by[run] for run in runs if run in by}
    first = by.get(runs[0]) if runs else None
    versus = {}
    for run, (value, low, high) in by.items():
        if first is None or run == runs[0]:
            continue
        versus[run] = {"ratio": ratio(first[0], value),
                       "overlap": ranges_overlap(first[1:], (low, high))}  # fmt: skip
    return {"runs": by, "versus_first": versus}


def ranges_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool | None:
    """Two closed ranges (either end order) share a point; None where an end is missing."""
    ends = [*a, *b]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               for v in ends):  # fmt: skip  (a whole-number end, 8 from JSON, is an end)
        return None
    return max(min(a), min(b)) <= min(max(a), max(b))
