"""serve-sweep in the terminal: each source's latency and throughput tables, the real
engine over its simulation, and the largest rate each policy sustains within the SLO."""

from __future__ import annotations

from benchbatch.core.units import figure
from benchbatch.output import render

LATENCY_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "p99",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p99_ms": "p99",
    "itl_p99_ms": "ITL p99 ms",
    "e2e_p50_s": "E2E p50",
    "slo": "SLO",
}
LOAD_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "request_throughput_rps": "req/s",
    "output_throughput_tps": "tok/s",
    "goodput_rps": "goodput",
    "occupancy_pct": "occupancy %",
    "mean_batch": "batch",
    "duration_s": "duration s",
}
SERVER_COLUMNS = {
    "rate": "rate",
    "sent": "sent",
    "request_throughput_rps": "req/s",
    "output_throughput_tps": "tok/s",
    "goodput_rps": "goodput",
    "failed": "failed",
    "timed_out": "timed out",
    "token_mismatch": "usage != stream",
    "burst_requests": "in bursts",
    "duration_s": "duration s",
}
VERSUS_COLUMNS = {
    "policy": "policy",
    "rate": "rate",
    "duration_s": "duration",
    "output_throughput_tps": "tok/s",
    "ttft_p50_s": "TTFT p50",
    "ttft_p99_s": "TTFT p99",
    "tpot_p50_s": "TPOT p50",
    "tpot_p99_s": "TPOT p99",
}
SLO_COLUMNS = {
    "policy": "policy",
    "source": "source",
    "sustained_rate": "sustains (req/s)",
    "goodput_rps": "goodput there",
    "leaves_slo_at": "leaves the SLO at",
    "knee": "knee",
    "knee_range": "steps ±10%",
}
# A concurrency sweep's (several --max-concurrency caps at one rate): the caps, not the rates.
SLO_CONCURRENCY = {
    "policy": "policy",
    "source": "source",
    "sustained_concurrency": "sustains (in flight)",
    "goodput_rps": "goodput there",
    "leaves_slo_at_concurrency": "leaves the SLO at",
}


def document(rec) -> dict:
    return {
        "endpoint": rec.meta.get("endpoint"),
        "step_cost": rec.meta.get("step_cost"),
        "real": rec.meta.get("real"),
        "rows": rec.rows("serve"),
        "slo": rec.rows("slo"),
        "sim_vs_real": rec.rows("sim_vs_real"),
        "prediction": rec.meta.get("prediction"),
    }


def show(rec) -> None:
    from benchbatch.core.calibration_text import step_cost_line

    rows, slo, versus = rec.rows("serve"), rec.rows("slo"), rec.rows("sim_vs_real")
    if rec.meta.get("step_cost"):  # the fit the sweep was simulated on
        clock = "cpu" if rec.meta.get("sweep_step_costs") == "cpu clock" else "wall"
        render.out_console.print(step_cost_line(rec.meta["step_cost"], clock), highlight=False)
    for source, name in (("sim", "simulated"), ("real", "real engine")):
        mine = [_shown(r) for r in rows if r["source"] == source]
        if mine:
            n = f"{mine[0]['requests']:,} requests a point{_held(mine)}"
            render.table(mine, _capped(LATENCY_COLUMNS, mine),
                         f"{name}, {n}: latency (s unless ms)")  # fmt: skip
            render.table(mine, _capped(LOAD_COLUMNS, mine),
                         f"{name}: throughput, and what the slots did")  # fmt: skip
    served = [_shown(r) for r in rows if r["source"] == "endpoint"]
    if served:
        name = f"{served[0]['label']}, {served[0]['sent']:,} requests a point{_held(served)}"
        render.table(served, _capped(LATENCY_COLUMNS, served), f"{name}: latency (s unless ms)")
        render.table(served, _capped(SERVER_COLUMNS, served),
                     "the server: throughput and failed requests")  # fmt: skip
    if versus:
        what = "the server" if served else "real engine"
        title = f"{what} over its simulation (the same requests at the same times)"
        if any("simulated_at_price" in r for r in rec.rows("prediction")):
            from benchbatch.core.prediction import STEP_COST_SPREAD  # numpy: not at start-up

            title = (f"{title[:-1]}; the median of its simulations with every step up to "
                     f"{STEP_COST_SPREAD:.0%} slower or faster)")  # core/prediction.band_median
        shown = _versus(versus)
        render.table(shown, _capped(VERSUS_COLUMNS, shown), title)
    if (rec.meta.get("prediction") or {}).get("verdict"):
        render.out_console.print(rec.meta["prediction"]["verdict"], highlight=False)
    caps = any("sustained_concurrency" in r for r in slo)
    render.table([r | _knee_cells(r) for r in slo], SLO_CONCURRENCY if caps else SLO_COLUMNS,
                 "the most requests in flight each sustains within the SLO" if caps
                 else "the largest rate each policy sustains within the SLO")  # fmt: skip
    limits = rec.meta["options"]
    for line in verdict_lines(slo) + shared_core(rows) + what_moves_it(slo, rows, limits):
        render.out_console.print(line, highlight=False)
    _energy(rows)
    render.results_line(rec)


def _capped(columns: dict[str, str], rows: list[dict]) -> dict[str, str]:
    """columns for rows at client caps (--max-concurrency): a concurrency sweep's caps in
    place of its one rate (_held names it in the title); otherwise as they are (one cap:
    _held names it)."""
    caps = {r.get("max_concurrency") for r in rows}
    rates = {r["rate"] for r in rows}
    if len(caps) < 2 or len(rates) > 1:
        return columns
    return {("max_concurrency" if k == "rate" else k): ("in flight" if k == "rate" else v)
            for k, v in columns.items()}  # fmt: skip


def _held(rows: list[dict]) -> str:
    """The title's words for what every row shares: ', 4 in flight' (one cap), ', at max
    req/s' (a concurrency sweep's one rate), or ''."""
    caps = {r.get("max_concurrency") for r in rows}
    rates = {r["rate"] for r in rows}
    if len(caps) == 1:
        return _cap(rows[0])
    return f", at {rows[0]['rate']} req/s" if len(rates) == 1 else ""


def _cap(r: dict) -> str:
    """', 4 in flight' for a row at a client cap (core/serving.cap_label); '' without."""
    from benchbatch.core.serving import cap_label  # numpy: not on --help's path

    return cap_label(r.get("max_concurrency"))


def _shown(r: dict) -> dict:
    ms = {f"{k}_ms": 1e3 * r[f"{k}_s"] for k in ("tpot_p50", "tpot_p99", "itl_p99")}
    return {
        **ms,
        **r,
        "occupancy_pct": 100 * r["slot_occupancy"],
        "slo": "yes" if r["within_slo"] else "no",
    }


def _versus(rows: list[dict]) -> list[dict]:
    """sim_vs_real's ratios, one row per real point."""
    out: dict = {}
    for r in rows:
        cap = r.get("max_concurrency")
        key = (r["policy"], r["rate"], cap)
        out.setdefault(key, {"policy": r["policy"], "rate": r["rate"], "max_concurrency": cap})
        out[key][r["metric"]] = f"x{r['measured_over_simulated']:.2f}"
    return list(out.values())


def verdict_lines(slo: list[dict]) -> list[str]:
    """Per source: the rate each policy sustains, continuous over static."""
    names = {
        "sim": "simulated",
        "real": "real engine",
        "sim-matched": "simulated, real workload",
        "endpoint": "the server",
    }
    lines = []
    for source, name in names.items():
        by = {r["policy"]: r for r in slo if r["source"] == source}
        if not by:
            continue
        parts = [f"{p} {_sustains(r)}" for p, r in by.items()]
        lines.append(f"{name}: within the SLO up to " + ", ".join(parts))
        knees = [f"{p} {_knee(r)} req/s" for p, r in by.items() if _knee(r)]
        if knees:
            lines.append(
                f"{name}: the knees, bisected to 2% (in parentheses: with every step 10% slower "
                "and faster): " + ", ".join(knees)
            )
    return lines


SHARED_CORE = 0.9  # a real point whose engine held its core less than this was served loaded


def shared_core(rows: list[dict]) -> list[str]:
    """The real engine's verdict names the load it was served under: where other processes
    held its core (serve.csv's core_share below 90% at some point), its rates are the loaded
    machine's, wall clock and all, and a quiet run serves more; the simulated knees price
    the device's own steps (the CPU clock), so they, not the real rates, compare across
    machines and loads."""
    shares = [r["core_share"] for r in rows if r["source"] == "real" and r.get("core_share")]
    shares = [v for v in shares if v == v]
    if not shares or min(shares) >= SHARED_CORE:
        return []
    low, high = min(shares), max(shares)
    held = f"{low:.0%}" if high - low < 0.005 else f"{low:.0%}-{high:.0%}"
    caps = any("max_concurrency" in r for r in rows) and _concurrency_sweep(rows)
    what = ("its throughput at each cap is", "points") if caps else ("its rates are", "knees")
    return [
        f"real engine: served on a shared core (the engine held it {held} of the time, "
        f"serve.csv's core_share; other processes took the rest): {what[0]} this loaded "
        f"machine's, and a quiet run serves more; the simulated {what[1]} price the device's "
        "own steps and are the ones to compare across runs",
        *_whole_core(rows),
    ]


def _concurrency_sweep(rows: list[dict]) -> bool:
    from benchbatch.core.serving import concurrency_sweep  # numpy: not on --help's path

    return concurrency_sweep(rows)


def _whole_core(rows: list[dict]) -> list[str]:
    """The real points' requests on a core of their own (serve.csv's whole_core_within_slo:
    simulated on the calibration's CPU-clock step costs): the rates a quiet run of the same
    requests would keep within the SLO."""
    from benchbatch.experiments.serve import probe

    real = [r for r in rows if r["source"] == "real" and "whole_core_within_slo" in r]
    real = [r for r in real if r["whole_core_within_slo"] == r["whole_core_within_slo"]]
    parts = []
    for policy in dict.fromkeys(r["policy"] for r in real):
        mine = sorted((r | {"within_slo": bool(r["whole_core_within_slo"])} for r in real
                       if r["policy"] == policy),
                      key=lambda r: (r["rate_rps"], r.get("max_concurrency") or 0))  # fmt: skip
        parts.append(f"{policy} {_sustains(probe.sustained_row(policy, 'real', mine))}")
    if not parts:
        return []
    return [
        "real engine, the same requests on a core of their own (simulated on the CPU time "
        "its steps take): within the SLO up to " + ", ".join(parts)
    ]


def _knee(r: dict) -> str:
    """A simulated row's bisected knee and its range with every step 10% slower and faster
    (slo.csv's knee_rps, knee_rps_slow, knee_rps_fast); "" where it has none."""
    cells = _knee_cells(r)
    return f"{cells['knee']} ({cells['knee_range']})" if cells["knee"] else ""


def _knee_cells(r: dict) -> dict:
    knee = r.get("knee_rps")
    if knee is None or not knee == knee:
        return {"knee": "", "knee_range": ""}
    ends = [r.get(f"knee_rps_{k}") for k in ("slow", "fast")]
    shown = [figure(v) if v is not None and v == v else "?" for v in ends]
    return {"knee": figure(knee), "knee_range": f"{shown[0]}-{shown[1]}"}


def what_moves_it(slo: list[dict], rows: list[dict], limits: dict) -> list[str]:
    """For a policy that sustains no rate: what broke at its lowest rate (p99 TTFT or p99
    TPOT over its limit, or failed requests) and which option moves it."""
    lines = []
    for r in slo:
        if r["sustained_rate"] is not None:
            continue
        mine = [x for x in rows if x["policy"] == r["policy"] and x["source"] == r["source"]]
        if not mine:
            continue
        low = min(mine, key=lambda x: (x["rate_rps"], x.get("max_concurrency") or 0))
        broke = []
        if low["ttft_p99_s"] > limits.get("slo_ttft", float("inf")):
            broke.append(f"p99 TTFT {render.fmt(low['ttft_p99_s'])} s over --slo-ttft")
        if low["tpot_p99_s"] > limits.get("slo_tpot", float("inf")):
            broke.append(f"p99 TPOT {render.fmt(1e3 * low['tpot_p99_s'])} ms over --slo-tpot")
        lost = (low.get("failed") or 0) + (low.get("timed_out") or 0)
        at = f"{low['rate']} req/s{_cap(low)}"
        if lost and not broke:  # the latencies were within: the server's answers were not
            lines.append(
                f"{r['policy']} ({r['source']}) misses the SLO at {at}: {lost:,} of "
                f"{low.get('sent') or lost:,} requests failed (requests.csv's error says why)"
            )
            continue
        if lost:
            broke.append("failed requests")
        why = " and ".join(broke) or "outside the SLO"
        lower = "--max-concurrency" if "sustained_concurrency" in r else "--rates"
        lines.append(
            f"{r['policy']} ({r['source']}) misses the SLO even at {at} ({why}): sweep "
            f"lower {lower}, loosen that limit, or use a smaller model (--preset, --layers) "
            "or a faster device"
        )
    return lines


def _sustains(r: dict) -> str:
    if "sustained_concurrency" in r:  # a concurrency sweep: its caps
        last, left = r["sustained_concurrency"], r["leaves_slo_at_concurrency"]
        if last is None:
            return f"no cap (leaves at {left} in flight)"
        if left is None:
            return f"every cap ({last} in flight included)"
        return f"{last} in flight"
    if r["sustained_rate"] is None:
        return f"no rate (leaves at {r['leaves_slo_at']})"
    if r["leaves_slo_at"] is None:
        return f"every rate ({r['sustained_rate']} included)"
    return f"{r['sustained_rate']} req/s"


def _energy(rows: list[dict]) -> None:
    """Energy and cost per output token of the measured points (else the max points)."""
    from benchbatch.core import energy

    shown = energy.measured_points(rows)
    lines = energy.summary_lines(
        shown,
        per_token="joules_per_output_token",
        cost="usd_per_million_output_tokens",
        name=lambda r: f"{r['policy']} at {r['rate']}{_cap(r)}",
    )
    for line in lines:
        render.line(line)
