"""The report's sections beyond the article's three tables: the simulation beside the real
engine, the serving curve, the memory limit and the roofline's ceilings."""

from __future__ import annotations

import math

from benchbatch.core.units import flop_unit
from benchbatch.output.render import fmt
from benchbatch.output.report.cells import number, percent, times
from benchbatch.output.report.shapes import Section

MEMORY_TITLE = "Memory, not compute, limits the batch"


PREDICTION_TITLE = "The simulation beside the real engine"


def section_prediction(rows: list[dict], verdict: str | None, image: str | None,
                       at_speed: str | None = None) -> Section:  # fmt: skip
    """prediction.csv: each policy's run on the model beside its simulation of the same
    requests (the engine's calibration pricing the scheduler's steps), metric by metric;
    where the runs' steps were priced after them (ratio_at_speed), the ratio at each run's
    own speed beside it, and its line (at_speed) under the verdict."""
    from benchbatch.core.prediction import NAMES

    speed = any(number(r, "ratio_at_speed") is not None for r in rows)
    headers = ["policy", "metric", "simulated s", "measured s", "measured / simulated",
               "target", "within"]  # fmt: skip
    if speed:
        headers.append("at its run's speed")
    body = []
    for r in rows:
        lo, hi = number(r, "target_low"), number(r, "target_high")
        within = str(r.get("within"))
        cells = [
            str(r["point"]),
            NAMES.get(str(r["metric"]), str(r["metric"])),
            fmt(number(r, "simulated")),
            fmt(number(r, "measured")),
            times(number(r, "ratio")),
            "-" if lo is None or hi is None else f"x{lo:g}-x{hi:g}",
            {"True": "yes", "False": "no"}.get(within, "-"),
        ]  # fmt: skip
        if speed:
            again = number(r, "ratio_at_speed")
            cells.append("-" if again is None else times(again))
        body.append(cells)
    intro = [
        "The same requests simulated with the engine's own calibration (its timed steps "
        "after the runs, fitted per term; step_cost.json) and scheduled as the engine "
        "scheduled them: the error of the simulation that occupancy, ablation and "
        "serve-sweep put beside their measurements, on this device.",
    ]
    return Section(PREDICTION_TITLE, intro, headers, body, image,
                   [line for line in (verdict, at_speed) if line])  # fmt: skip


# --- the serving curve -------------------------------------------------------------------------

SERVE_TITLE = "Serving curve: request rate against latency (simulated)"
SERVE_POLICIES = ("static", "continuous", "chunked")


def section_serve(rows: list[dict], slo: list[dict], meta: dict, image: str | None) -> Section:
    """p99 TTFT and p99 TPOT of each policy at each rate, and where each leaves the SLO."""
    rates = list(dict.fromkeys(str(r["rate"]) for r in rows))
    by = {(r["policy"], str(r["rate"])): r for r in rows}
    headers = ["policy", *(f"{rate} req/s" for rate in rates), "leaves the SLO at"]
    leaves = {r["policy"]: r for r in slo if r.get("source") == "sim"}
    body = []
    for policy in (p for p in SERVE_POLICIES if any(k[0] == p for k in by)):
        cells = [_serve_cell(by.get((policy, rate))) for rate in rates]
        body.append([policy, *cells, _leaves(leaves.get(policy))])
    limits = meta.get("slo") or {}
    intro = [
        "Poisson arrivals at three request rates (fractions of the simulated capacity), "
        "simulated with a step-cost model fitted to this run's phases and sweep steps; "
        f"{meta.get('workload', '')}. Cells: p99 TTFT / p99 TPOT, and whether both "
        f"are within the SLO (TTFT {limits.get('ttft_s', '-')} s, TPOT "
        f"{1e3 * limits.get('tpot_s', math.nan):g} ms). `benchbatch serve-sweep` draws the "
        "whole curve and serves it on the model.",
    ]
    return Section(SERVE_TITLE, intro, headers, body, image, serve_lines(slo))


def _serve_cell(r: dict | None) -> str:
    if r is None:
        return "-"
    ok = "within" if r.get("within_slo") in (True, "True") else "outside"
    ttft, tpot = number(r, "ttft_p99_s"), number(r, "tpot_p99_s")
    return (f"{fmt(ttft)} s / {fmt(1e3 * tpot) if tpot is not None else '-'} ms, "
            f"{ok}")  # fmt: skip


def _leaves(r: dict | None) -> str:
    if r is None:
        return "-"
    left = r.get("leaves_slo_at")
    if left not in (None, "") and left == left:
        return f"{left} req/s"
    knee = _knee_below(r)
    return f"past {fmt(knee)} req/s (its knee)" if knee is not None else "stays within"


def _knee_below(r: dict) -> float | None:
    """A knee (bisected) below the largest rate the sweep saw within the SLO: the rates past
    it were within only because a run that short ends before its queue grows."""
    knee, kept = number(r, "knee_rps"), number(r, "sustained_rps")
    if knee is None or kept is None or not math.isfinite(knee) or knee >= 0.999 * kept:
        return None
    return knee


def serve_lines(slo: list[dict]) -> list[str]:
    """Where each policy leaves the SLO, in words."""
    lines = []
    for r in slo:
        if r.get("source") != "sim":
            continue
        left, kept = r.get("leaves_slo_at"), r.get("sustained_rate")
        knee = _knee_below(r)
        if (left in (None, "") or left != left) and knee is not None:
            lines.append(
                f"{r['policy']} is within the SLO at every rate swept (up to {kept} req/s), "
                f"but past its knee, {fmt(knee)} req/s, only because a run this short ends "
                "before its queue grows: it serves no more than its capacity."
            )
        elif left in (None, "") or left != left:
            lines.append(f"{r['policy']} stays within the SLO at every rate (up to {kept} req/s).")
        elif kept in (None, "") or kept != kept:
            lines.append(f"{r['policy']} is outside the SLO already at {left} req/s.")
        else:
            lines.append(f"{r['policy']} leaves the SLO at {left} req/s (within up to {kept}).")
    return lines


def section_memory(ceilings: list[dict], memory_rows: list[dict] | None, image) -> Section:
    headers = ["memory", "GiB", "reserved: tokens each", "reserved: sequences",
               "paged: mean tokens", "paged: sequences", "paging gain"]  # fmt: skip
    body = [
        [
            str(c["where"]),
            fmt(c["memory_bytes"] / 2**30),
            fmt(int(c["reserved_tokens"])),
            fmt(int(c["reserved_sequences"])),
            fmt(float(c["paged_mean_tokens"])),
            fmt(int(c["paged_sequences"])),
            times(number(c, "paging_gain")),
        ]
        for c in ceilings
    ]
    intro = [
        "How many sequences of the occupancy workload fit beside the weights (a tenth of the "
        "memory held back): reserving the longest prompt plus the maximum output each (a "
        "contiguous cache row), against paged blocks at the lengths they reach.",
    ]
    notes = []
    for r in memory_rows or []:
        notes.append(
            f"{r['policy']} (simulated on one budget): peak {int(r['peak_running']):,} "
            f"running, mean {fmt(number(r, 'mean_running'))}, "
            f"{percent(number(r, 'fragmentation'))} of the reserved memory never written, "
            f"{int(r['preemptions']):,} preemptions, {fmt(int(r['total_steps']))} steps."
        )
    return Section(MEMORY_TITLE, intro, headers, body, image, notes)


def section_roofline(s: dict, image: str | None, raised: list[dict] | None = None) -> Section:
    m, d = s["measured"], s.get("datasheet")
    unit = flop_unit([m["peak_tflops"]])
    headers = ["ceiling", "measured", "measured by", f"datasheet ({s.get('datasheet_name', '-')})"]
    body = []
    for name, key, source, scale in (
        (f"matmul {unit.name}", "peak_tflops", m.get("tflops_source", ""), unit.per_tflops),
        ("memory GB/s", "peak_gbps", m.get("gbps_source", ""), 1),
        ("ridge FLOP/byte", "ridge", "", 1),
    ):
        sheet = fmt(d[key] * scale) if d else "unknown"
        body.append([name, fmt(m[key] * scale), source, sheet])
    intro = [
        f"This device's ceilings in {m['dtype']}, measured by the probe; every phases and "
        "sweep step is placed under them (solid roof: measured; dashed: datasheet, when known).",
    ]
    notes = [
        f"The {r['ceiling']} ceiling was raised from {fmt(r['from'])} to {fmt(r['to'])} "
        f"{r['unit']}: {r['by']} reached it, so the probe had measured it low (another "
        "process during the probe, or sizes it did not try). Every MFU and MBU is against "
        "the raised ceiling."
        for r in raised or []
    ]
    return Section("Roofline: the measured ceilings", intro, headers, body, image, notes)
