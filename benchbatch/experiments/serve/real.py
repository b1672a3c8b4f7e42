"""serve-sweep's real engine: the rates that fit --real-time served on the model, each point
beside the simulation of the same requests at the same arrival times (sim-matched), how the
calibration priced the steps the engine took and the core share each point had."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchbatch.core import energy
from benchbatch.core.cpu_clock import at_share
from benchbatch.core.prediction import band_median, with_intervals
from benchbatch.core.units import significant
from benchbatch.errors import UserError
from benchbatch.experiments import common as c
from benchbatch.experiments.serve.options import ServeOptions
from benchbatch.output import render


@dataclass
class Served:
    """The real engine's points: each simulation of the same requests (sim-matched rows by
    policy and spot: (rate, client cap), the cap None without --max-concurrency), the
    requests a point, and each real row with its arrivals' span."""

    matched: dict
    n: int
    points: list = field(default_factory=list)
    spread: dict = field(default_factory=dict)  # by policy and spot: probe.spread_rows'
    at_speed: dict = field(default_factory=dict)  # by policy and spot: at its steps' speed


def spot_of(row: dict) -> tuple[float, int | None]:
    """A serve.csv row's spot: (its rate, its client's cap or None)."""
    return row["rate_rps"], row.get("max_concurrency")


def serve(rec, net, opts: ServeOptions, w, setup, cost, rates, seed: int, cpu_cost=None):
    """The chosen rates (a concurrency sweep's: caps) on the model: real_steps.csv as steps
    end (the engine's events, through the run); per point its serve.csv row beside the
    simulation of the same requests (sim-matched: priced at the point's own core share
    times the speed the point before it ran, `beside`, say_priced) and sim_vs_real.csv
    (beside the band's median, `versus`). Returns the points (Served; None where none fits
    --real-time)."""
    from benchbatch.experiments.serve import probe
    from benchbatch.experiments.step_prices import price_in_place
    from benchbatch.runtime import energy_meter
    from benchbatch.runtime.runs import engine_events

    n = min(opts.real_requests, len(w.requests))
    matched, chosen, n = _matched(rec, opts, w, setup, cost, rates, n)
    if not chosen:
        return None
    served = Served({}, n)
    by_label = {(probe.rate_label(r), cap): (r, cap) for r, cap in chosen}
    requests, _ = w.at(math.inf, n)
    runs = probe.engine_runs(w, chosen, opts.policies, setup, n, matched)
    events = _priced_if_cut(rec, engine_events(net, requests, runs, seed), cost, cpu_cost)
    total = sum(run.sim_steps for run in runs)
    meter = energy_meter.EnergyMeter(net.embed.weight.device)
    meter.start()
    seen, clock = 0, "wall" if cpu_cost is None else "cpu"
    before = 1.0  # the speed the next point is predicted at: the last one's (say_priced)
    for done in rec.engine_rows("real_steps", events, total=total, label="real engine"):
        reading = meter.lap()
        steps, seen = rec.rows("real_steps")[seen:], len(rec.rows("real_steps"))  # the point's
        price_in_place(steps, cost, cpu_cost)
        spot = by_label[(done.run.columns["rate"], done.run.columns.get("max_concurrency"))]
        (rate, cap), key = spot, (done.run.name, spot)
        capped, columns = probe.at_cap(setup, cap), probe.cap_columns(cap)
        point = probe.real_point(done.result, done.run.name, rate, requests, w.at(rate, n)[1])
        row = _real_row(done, point, capped, columns, reading, opts, steps, clock) | {
            "priced_speed": before}  # fmt: skip
        priced = at_share(cost, cpu_cost, row["core_share"])
        model = priced if before == 1.0 else priced.scaled(before)
        sim = beside(matched[key], w, capped, model, cost, n)
        served.spread[key] = probe.spread_rows(w, done.run.name, rate, capped, model, n)
        row |= whole_core(matched[key], w, capped, cost, cpu_cost, n)
        served.at_speed[key] = at_speed(matched[key], w, capped, priced, row["steps_over_price"], n)
        sim_row = probe.point_row(sim, capped) | columns | {
            "step_costs": "wall clock" if priced is cost else "cpu clock / core share",
            "core_share": row["core_share"], "priced_speed": before}  # fmt: skip
        rec.add("serve", sim_row | energy.serve_columns(sim_row, None, opts.price_per_hour))
        for r in probe.request_rows(sim, setup.slo, cap):
            rec.add("requests", r, stream=True)
        served.matched[key] = sim_row
        rec.add("serve", row)
        for pair in versus(row, sim_row, served.spread[key]):
            rec.add("sim_vs_real", pair | columns)
        for r in probe.request_rows(point, setup.slo, cap):
            rec.add("requests", r, stream=True)
        arrivals = w.at(rate, n)[1]
        span = float(arrivals.max() - arrivals.min()) if len(arrivals) else 0.0
        served.points.append((row, span))
        before = row["steps_over_price"] if row["steps_over_price"] > 0 else before  # NaN: kept
    meter.close()
    return served


def _real_row(done, point, setup, columns: dict, reading, opts: ServeOptions, steps,
              clock: str) -> dict:  # fmt: skip
    """serve.csv's row of a real point (`done`: its engine run, `steps`: its real_steps.csv
    rows, priced): its metrics, energy, the share of the core the engine held (core_share)
    and how fast its steps ran against their price (steps_over_price)."""
    from benchbatch.core.cpu_clock import core_share
    from benchbatch.core.pricing import speed
    from benchbatch.experiments.serve import probe

    row = probe.point_row(point, setup) | columns
    row |= energy.serve_columns(row, reading, opts.price_per_hour)
    row["core_share"] = core_share([s.row() for s in done.result.steps])
    return row | {"steps_over_price": speed(steps, clock)}


def versus(row: dict, sim_row: dict, spread) -> list[dict]:
    """sim_vs_real.csv's rows of a real point (serve.csv's real row): each compared metric
    beside its prediction, core/prediction.band_median over its simulation at the price
    (sim_row) and the same requests at the other step-cost factors (spread)."""
    from benchbatch.experiments.serve import probe

    return probe.sim_vs_real(row, band_median(sim_row, spread, probe.COMPARED))


def _priced_if_cut(rec, events, cost, cpu_cost):
    """The engine's events, unchanged; each point's steps are priced after its run (serve's
    loop: pricing between two steps would cost the engine host time its calibration did
    not pay), and if the run is cut short (Ctrl-C, an error) the steps kept of the point
    it stopped in are priced on the way out."""
    from benchbatch.experiments.step_prices import price_in_place

    try:
        yield from events
    finally:
        unpriced = [r for r in rec.rows("real_steps") if "priced_ms" not in r]
        price_in_place(unpriced, cost, cpu_cost)


def beside(point, w, setup, model, cost, n: int):
    """The simulation set beside a real point: its requests at their arrival times on
    `model` (serve's: core/cpu_clock.at_share's, the CPU clock's at the point's share of the
    core, times the speed the point before it ran at); `point` itself (already simulated on
    the wall-clock fit, `cost`) where model is that fit."""
    from benchbatch.experiments.serve import probe

    if model is cost:
        return point
    return probe.simulate_point(w, point.policy, point.rate, setup, model, n, probe.MATCHED)


def at_speed(point, w, setup, model, speed: float, n: int) -> dict | None:
    """The serve.csv row of a real point's requests simulated again on its at_share step
    costs (`model`) times the speed its steps ran at (steps_over_price): known only after
    the run, the error left once the device's speed is known. None without a speed."""
    from benchbatch.experiments.serve import probe

    if not speed == speed:
        return None
    again = model.scaled(speed)
    return probe.point_row(probe.simulate_point(w, point.policy, point.rate, setup, again, n,
                                                probe.MATCHED), setup)  # fmt: skip


def whole_core(point, w, setup, cost, cpu_cost, n: int) -> dict:
    """A real point's requests simulated on the calibration's CPU-clock step costs as they
    are (a core of its own): whether they stay within the SLO there, and their E2E p50.
    What a quiet machine would serve, where other processes took the engine's core (the
    verdict says it beside the measured rates); {} without a CPU clock (a GPU)."""
    from benchbatch.experiments.serve import probe

    if cpu_cost is None:
        return {}
    row = probe.point_row(beside(point, w, setup, at_share(cost, cpu_cost, 1.0), cost, n), setup)
    return {"whole_core_within_slo": row["within_slo"], "whole_core_e2e_p50_s": row["e2e_p50_s"]}


def compare(rec, served: Served) -> None:
    """The real points beside their simulation: prediction.csv/png and its verdict, and
    how the calibration priced the steps the engine took."""
    from benchbatch.experiments.serve import probe
    from benchbatch.experiments.step_prices import say_prices
    from benchbatch.output.plots.prediction import record

    pairs = []
    for row, span in served.points:
        key = (row["policy"], spot_of(row))
        pairs += probe.prediction_pairs(row, served.matched[key], span, served.spread.get(key, ()),
                                        served.at_speed.get(key))  # fmt: skip
    pairs = with_intervals(pairs, probe.point_requests(rec.rows("requests")))
    say_prices(rec, rec.rows("real_steps"))
    say_priced(rec)
    say_speeds(rec)
    say_core_shares(rec)
    record(rec, pairs, f"serve-sweep: the real engine beside its simulation; {c.title(rec)}")


def say_priced(rec) -> None:
    """A note on what each real point after the first was predicted at: its step costs
    times the speed the point served before it ran at (serve.csv's priced_speed, that
    point's steps_over_price), the calibration kept current as the run goes (the device's
    speed drifts over minutes: a run's points ran x1.05-1.12 of their price where its
    calibration, minutes before, had priced them), as --endpoint --predict calibrates again
    before each point. The first point is predicted at the calibration's price."""
    real = [r for r in rec.rows("serve") if r["source"] == "real" and "priced_speed" in r]
    later = [r["priced_speed"] for r in real[1:]]
    if later:
        lo, hi = f"x{min(later):.2f}", f"x{max(later):.2f}"
        span = lo if lo == hi else f"{lo}-{hi}"
        rec.note(f"each real point after the first is predicted at the speed the engine ran "
                 f"the point before it (serve.csv's priced_speed: {span} of the calibration's "
                 "price), the first at the price: the calibration kept current as the run goes")


def say_speeds(rec) -> None:
    """A warning naming the real points whose steps took outside step_prices.SPEED_MOVED of
    the calibration's price (serve.csv's steps_over_price), the farthest first: the
    device's speed moved during the run, and those points' errors are mostly its."""
    from benchbatch.experiments.step_prices import say_speeds as warn

    real = [r for r in rec.rows("serve") if r["source"] == "real"]
    warn(rec, [(f"{r['policy']} @ {r['rate']} req/s{_cap_words(r)}",
                r.get("steps_over_price", math.nan)) for r in real])  # fmt: skip


def say_core_shares(rec) -> None:
    """Each real point's core share (its steps' CPU time over their wall time, serve.csv's
    core_share) beside the calibration's (metadata's real.core_shares). The simulation
    beside a point is priced at its own share (`beside`), so a load that changed since the
    calibration does not shift it; a note says so where some point's share is under
    SHARED_CORE (its latencies are the loaded machine's, the sweep's the device's)."""
    calibrated = (rec.meta.get("step_cost") or {}).get("cpu_clock", {}).get("core_share")
    real = [r for r in rec.rows("serve") if r["source"] == "real" and "core_share" in r]
    if calibrated is None or not calibrated == calibrated or not real:
        return
    shares = {f"{r['policy']} {r['rate']}{_cap_words(r)}": r["core_share"] for r in real}
    rec.meta.setdefault("real", {})["core_shares"] = {"calibration": calibrated, **shares}
    shared = {k: v for k, v in shares.items() if v == v and v < c.SHARED_CORE}
    if shared:
        points = ", ".join(f"{k} req/s {v:.0%}" for k, v in shared.items())
        rec.note(
            f"other processes took turns on the engine's core while it served ({points}; "
            f"{calibrated:.0%} while it calibrated): each point's simulation beside it is "
            "priced at the share it had (the calibration's CPU clock over it), so the "
            "ratios judge the model at the load the point ran under"
        )


def _cap_words(row: dict) -> str:
    from benchbatch.core.serving import cap_label

    return cap_label(row.get("max_concurrency"))


def _dearer(opts: ServeOptions, w, setup, cost, rates, n: int) -> list[dict]:
    """The real engine's n requests simulated at every rate with every step STEP_COST_SPREAD
    dearer (the p50 band's width): where each policy still keeps up though the device runs
    that much slower while serving than while it calibrated."""
    from benchbatch.core.prediction import STEP_COST_SPREAD
    from benchbatch.experiments.serve import probe

    dear = cost.scaled(1 + STEP_COST_SPREAD)
    return [probe.point_row(probe.simulate_point(w, p, r, setup, dear, n, probe.MATCHED), setup)
            for r in rates for p in opts.policies]  # fmt: skip


def _matched(rec, opts: ServeOptions, w, setup, cost, rates, n: int):
    """The simulation of the real engine's n requests at every candidate spot (rate, client
    cap), and the spots to serve: --real-rates, or those that fit --real-time by these
    simulations' durations (a concurrency sweep's: its caps that fit, at its one rate)."""
    from benchbatch.experiments.serve import probe

    candidates = [(r, cap) for r in opts.real_rate_values or rates for cap in opts.caps]
    matched = {
        (p, spot): probe.simulate_point(w, p, spot[0], probe.at_cap(setup, spot[1]), cost, n,
                                        probe.MATCHED)
        for spot in candidates
        for p in opts.policies
    }  # fmt: skip
    cost_s = {s: sum(matched[(p, s)].step_ends[-1] for p in opts.policies) for s in candidates}
    chosen, spent = _choose(opts, w, setup, cost, matched, cost_s, n)
    if opts.real_rates is None:
        fewer = n // 2
        if len(chosen) < min(2, len(candidates)) and fewer >= MIN_REAL_REQUESTS:
            # A slow or loaded device: fewer requests a point rather than no answer.
            what = "cap" if opts.concurrency_sweep else "rate"
            rec.note(
                f"{len(chosen) or 'no'} {what}{'' if len(chosen) == 1 else 's'} of {n} requests "
                f"fit{'s' if len(chosen) == 1 else ''} --real-time {opts.real_time:g} s on "
                f"this device; trying {fewer} requests a point (raise --real-time to serve "
                "more)"
            )
            return _matched(rec, opts, w, setup, cost, rates, fewer)
    rec.meta["real"] = {
        "requests": n,
        "rates_rps": list(dict.fromkeys(probe.rate_label(r) for r, _ in chosen)),
        "estimated_s": spent,
        "budget_s": opts.real_time,
    }
    if opts.concurrency_sweep:
        rec.meta["real"]["max_concurrency"] = [cap for _, cap in chosen]
    if chosen:
        _say_estimate(rec, n, chosen, spent)
    else:
        least = min(cost_s.values(), default=math.nan)
        rec.warning(
            f"no rate fits --real-time {opts.real_time:g} s even with {n} requests a point "
            f"(the cheapest needs about {_seconds(least)}): none served on the model; raise "
            "--real-time, or give --real-rates"
        )
    return matched, chosen, n


def _choose(opts: ServeOptions, w, setup, cost, matched, cost_s, n: int):
    """The spots to serve and the fitted model's seconds for them, from the simulations
    `matched` and each spot's cost_s: a concurrency sweep's caps that fit --real-time, the
    rates that fit it, or --real-rates as given (refused where they do not fit)."""
    from benchbatch.experiments.serve import probe, rate_choice

    candidates = list(cost_s)
    if opts.concurrency_sweep:
        rows = [probe.point_row(v, probe.at_cap(setup, spot[1])) | {"max_concurrency": spot[1]}
                for (_, spot), v in matched.items()]  # fmt: skip
        chosen, spent = rate_choice.choose_real_caps(rows, cost_s, opts.real_time)
    elif opts.real_rates is None:
        rows = [probe.point_row(v, setup) for v in matched.values()]
        dear = _dearer(opts, w, setup, cost, [r for r, _ in candidates], n)
        by_rate = {r: spent for (r, _), spent in cost_s.items()}
        chosen, spent = rate_choice.choose_real_rates(rows, by_rate, opts.real_time, dear)
        chosen = [(r, setup.client_limit) for r in chosen]
    else:
        chosen, spent = list(candidates), sum(cost_s.values())
        if spent > opts.real_time:  # explicit rates: the fitted model's estimate, all points
            raise UserError(
                "real_rates",
                f"{', '.join(probe.rate_label(r) for r, _ in chosen)} req/s: the fitted cost "
                f"model expects about {_seconds(spent)} on the model, more than "
                f"--real-time {opts.real_time:g} s (higher or fewer --real-rates, fewer "
                "--real-requests, or a larger --real-time)",
            )
    return chosen, spent


# The fewest requests a real point is cut to when the default ones do not fit --real-time.
MIN_REAL_REQUESTS = 10


def _seconds(s: float) -> str:
    return render.duration(s) if s >= 10 else f"{significant(s, 2)} s"


def _say_estimate(rec, n: int, chosen, spent: float) -> None:
    if rec.quiet:
        return
    from benchbatch.experiments.serve.rates import rate_label

    rates = ", ".join(dict.fromkeys(rate_label(r) for r, _ in chosen))
    caps = [cap for _, cap in chosen if cap is not None]
    held = f", {', '.join(map(str, caps))} in flight" if caps else ""
    rec.say(
        f"real engine: {n} requests per point at {rates} req/s{held}; the fitted cost model "
        f"expects about {render.duration(spent)}"
    )
