"""occupancy --engine real: static and continuous batching on the model (engine.csv,
engine.png), the simulation beside them (prediction.csv and its verdict), the memory
policies in a paged cache of the budget's blocks, and, under tensor parallelism, the decode
step's all-reduces. Imported by occupancy's run and by reproduce (experiment C on the
model)."""

from __future__ import annotations

import math

from benchbatch.core.noise import NOISY_P90_OVER_MEDIAN
from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.core.prediction import pairs_of, ratio
from benchbatch.core.units import duration, figure
from benchbatch.runtime.runs import EngineRun, engine_events

CPU_HINT = "--engine real --requests 64 --slots 8 --max-output 200"


def run_real(rec, model: ModelOptions, run: RunOptions, requests, slots: int, sims, stop,
             layout: dict | None = None):  # fmt: skip
    """Static and continuous batching on the model (engine.csv, engine.png); the model."""
    from benchbatch.experiments import common as c
    from benchbatch.experiments.occupancy import probe
    from benchbatch.output.plots.occupancy import engine_figure

    net, cfg = c.build_model(rec, model, run)
    estimate = probe.estimate(net, rec.target.dtype_name, requests, slots, sims)
    if not stop and rec.inputs.given is None:  # prediction_part calibrates the engine after
        estimate |= calibration_estimate(net, requests, slots, estimate)
    rec.meta.update(estimate=estimate, sim_time_basis=probe.SIM_TIME_BASIS)
    if not run.json_out:
        _say_estimate(estimate, sims, rec, slots)
    if rec.target.tp > 1:
        _collectives(rec, net, estimate["decode_context"], slots, run)
    engine_runs(rec, net, requests, slots, sims, run.seed, stop, layout)
    if not stop:  # with stop tokens each run is set beside its own lengths' simulation
        prediction_part(rec, net, requests, slots, run, rec.inputs.given, layout)
    rows = rec.rows("engine")
    rec.meta["engine_summary"] = probe.engine_summary(rows)
    wide = probe.noisy(rows)
    if wide:
        rec.warning(f"step times of {', '.join(wide)} spread wide (p90 over "
                    f"{NOISY_P90_OVER_MEDIAN:g}x the median): something else may have used "
                    "the device meanwhile, which stretches the wall time against the steps' "
                    "median (the prediction, on the CPU clock at each run's own share of the "
                    "core, is held apart from it where there is one); see engine_steps.csv",
                    later=True)  # fmt: skip
    title = c.title(rec, f"{slots} slots: real engine", noise=c.engine_noise(rows))
    engine_figure(rec.rows("engine_steps"), rows, rec.folder / "engine.png", title)
    return net


PREDICTED = ("wall_s", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s")


def prediction_part(rec, net, requests, slots: int, run: RunOptions, given=None,
                    layout: dict | None = None) -> None:  # fmt: skip
    """Each policy simulated in seconds with the engine's calibration (or --step-costs) and
    set beside its real run (engine.csv): prediction.csv, prediction.png and the verdict
    (occupancy and reproduce). layout: the runs' kv_layout and block_size, which the
    calibration runs in too. Each run's steps priced by the calibration (as serve-sweep's
    points are): how far it priced them per step kind (metadata's real.step_prices), and
    each policy simulated again at the speed its steps ran (prediction.csv's
    steps_over_price, simulated_at_speed, ratio_at_speed: known only after the run; not for
    the wall time, whose steps' time over their price is that speed, so x1 at it)."""
    from benchbatch.core.cpu_clock import at_share, core_share
    from benchbatch.core.pricing import speed
    from benchbatch.experiments.ablation.run import cost_model
    from benchbatch.experiments.step_prices import priced, say_prices, say_speeds
    from benchbatch.output.plots.prediction import record

    budgets = calibration_budgets(requests, slots)
    cost, cpu_cost = cost_model(rec, net, budgets, requests, given, run, cpu_clock=True,
                                layout=layout)  # fmt: skip
    clock = "wall" if cpu_cost is None else "cpu"
    pairs, shares, speeds, all_steps = [], {}, {}, []
    for real in rec.rows("engine"):
        policy = real["policy"]
        # on the CPU clock, each policy at the share of the core its own run held (the
        # calibration's wall clock priced both at the calibration's: x0.6 at 75% against 50%)
        steps = list(priced((s for s in rec.rows("engine_steps") if s.get("policy") == policy),
                            cost, cpu_cost))  # fmt: skip
        all_steps += steps
        shares[policy] = core_share(steps) if cpu_cost is not None else math.nan
        speeds[policy] = speed(steps, clock)
        model = at_share(cost, cpu_cost, shares[policy])
        row = _simulated(requests, policy, slots, model)
        again = _simulated(requests, policy, slots, model.scaled(speeds[policy])) \
            if speeds[policy] == speeds[policy] else None  # fmt: skip
        these = pairs_of(policy, row, real, PREDICTED, policy=policy)
        for pair in these if again is not None else ():
            if pair["metric"] == "wall_s":  # the speed's own definition: x1 at it, unsaid
                continue
            pair |= {"steps_over_price": speeds[policy],
                     "simulated_at_speed": again[pair["metric"]],
                     "ratio_at_speed": ratio(again[pair["metric"]], pair["measured"])}  # fmt: skip
        pairs += these
    if cpu_cost is not None:
        _say_shares(rec, shares)
    say_prices(rec, all_steps)
    rec.meta.setdefault("real", {})["steps_over_price"] = speeds
    say_speeds(rec, list(speeds.items()), unit="runs")
    record(rec, pairs, f"occupancy: the real engine beside its simulation; {slots} slots")


def _simulated(requests, policy: str, slots: int, model) -> dict:
    """One policy's simulation of the requests on `model`: its wall time and latencies
    (engine.csv's names), in seconds."""
    from benchbatch.core.scheduler import make_scheduler
    from benchbatch.core.simulate import simulate

    sim = simulate(requests, make_scheduler(policy, slots), model, fast=False)
    return {"wall_s": sim.total_time, **{f"{k}_s": v for k, v in sim.metrics.summary().items()}}


def _say_shares(rec, shares: dict) -> None:
    """Each policy's share of the core beside the calibration's: metadata's
    real.core_shares, and a note when one ran under another load than the calibration."""
    calibrated = (rec.meta.get("step_cost") or {}).get("cpu_clock", {}).get("core_share")
    rec.meta.setdefault("real", {})["core_shares"] = {"calibration": calibrated, **shares}
    said = ", ".join(f"{p} {s:.0%}" for p, s in shares.items() if s == s)
    if said:
        base = f" (the calibration's {calibrated:.0%})" if isinstance(calibrated, float) else ""
        rec.note(f"each policy simulated on the calibration's CPU clock at the share of the "
                 f"core its run held: {said}{base}")  # fmt: skip


def calibration_budgets(requests, slots: int):
    """The budgets the engine is calibrated at for the simulation beside its runs: the
    slots, and chunks as long as the longest prompt (16-256 tokens)."""
    from benchbatch.experiments.ablation.probe import Budgets

    chunk = max(16, min(256, max(r.prompt_tokens for r in requests)))
    return Budgets(slots, chunk + slots, chunk)


def calibration_estimate(net, requests, slots: int, e: dict) -> dict:
    """The calibration that follows the runs (prediction_part's): its steps, counted from
    its plan, each priced as the estimate's average engine step."""
    from benchbatch.experiments.ablation.run import calibration_runs
    from benchbatch.runtime import calibrate as cb

    steps = cb.total_steps(calibration_runs(net, calibration_budgets(requests, slots), requests))
    per_step = e["estimated_s"] / max(1, e["simulated_steps"])
    return {"calibration_steps": steps, "calibration_s": steps * per_step}


def _collectives(rec, net, context: int, slots: int, run: RunOptions) -> None:
    """Under tensor parallelism: the engine's typical decode step (every slot at the
    estimate's context) timed with its all-reduces on their own, per rank: collectives.csv."""
    from benchbatch.runtime import steps

    step = steps.decode(slots, context)
    row = steps.run_step(net, rec.target.dtype_name, step, run.timing(), run.graphs(rec.target))
    rec.record("collectives", [row], total=1, label="the decode step's all-reduces")
    from benchbatch.experiments import common as c

    c.say_allreduce_over_step(rec, [row], lambda r: f"the decode step of {slots} sequences")
    keys = ("step_ms", "allreduce_ms", "allreduce_share", "batch", "context", "tp")
    rec.meta["collectives"] = {k: row.get(k) for k in keys}


def memory_engine(rec, net, requests, setup, sims, seed: int) -> None:
    """The memory policies on the model, each in a paged cache of the budget's blocks:
    memory_engine_steps.csv as the steps end, memory_engine.csv a row per policy."""
    from benchbatch.experiments.occupancy import memory as mprobe

    runs = mprobe.engine_runs(setup, len(requests), sims)
    events = engine_events(net, requests, runs, seed)
    total = sum(r.sim_steps for r in runs)
    label = "memory policies, real engine"
    for done in rec.engine_rows("memory_engine_steps", events, total=total, label=label):
        rec.add("memory_engine", mprobe.engine_row(done.run.name, done.result, setup, requests))


def engine_runs(
    rec, net, requests, slots: int, sims, seed: int, stop=frozenset(), layout=None
) -> None:
    """Static, then continuous batching on the model: engine_steps.csv as the steps end,
    engine.csv a row per policy (occupancy and reproduce). With stop tokens the lengths that
    came out go to trace_POLICY.csv, and the run is set beside their own simulation.
    layout: the engine's kv_layout and block_size (default: contiguous)."""
    from benchbatch.experiments.occupancy import probe

    runs = [
        EngineRun(p, slots, p, dict(layout or {}), sims[p].total_steps, stop_tokens=stop)
        for p in probe.POLICIES
    ]
    walls: dict[str, float] = {}
    events = engine_events(net, requests, runs, seed)
    total = sum(r.sim_steps for r in runs)
    for done in rec.engine_rows("engine_steps", events, total=total, label="real engine"):
        name, result = done.run.name, done.result
        walls[name] = result.wall_s
        sim = sims[name] if not stop else _observed_sim(rec, requests, result, name)
        rec.add("engine", probe.engine_row(result, sim, walls.get("static")))


def _observed_sim(rec, requests, result, policy: str):
    """The lengths a run stopping at end-of-sequence produced: trace_POLICY.csv, and the
    simulation of exactly those requests (the one the run is compared with)."""
    from benchbatch.experiments.occupancy import probe
    from benchbatch.output.results import write_trace
    from benchbatch.runtime.records import observed_requests

    observed = observed_requests(requests, result)
    write_trace(rec.folder / f"trace_{policy}.csv", observed)
    rec.meta.setdefault("traces", []).append(f"trace_{policy}.csv")
    return probe.simulate(observed, result.slots)[policy]


def _say_estimate(e: dict, sims: dict, rec, slots: int) -> None:
    """The run's size and estimated duration; over common's LONG_RUN_S on a CPU, a smaller
    run to try (one rule for every command's long run)."""
    from benchbatch.experiments import common as c

    cfg, target = rec.cfg, rec.target
    steps = " + ".join(f"{p} {s.total_steps:,}" for p, s in sims.items())
    calibrating = ""
    if e.get("calibration_steps"):
        calibrating = f", then {e['calibration_steps']:,} to calibrate its simulation"
    rec.say(
        f"real engine: {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers) "
        f"{target.dtype_name} on {target.device}, KV cache {e['kv_cache_bytes'] / 2**20:,.0f} "
        f"MiB; {e['simulated_steps']:,} steps to run ({steps}){calibrating}. Estimated "
        f"duration: about {duration(e['estimated_s'] + e.get('calibration_s', 0.0))} (a "
        f"decode step of {slots} sequences at context "
        f"{e['decode_context']:,} took {figure(e['decode_step_ms'])} ms here, a "
        f"{e['prefill_tokens']}-token prefill {figure(e['prefill_ms'])} ms)."
    )
    if e["estimated_s"] > c.LONG_RUN_S and target.device.type == "cpu":
        rec.note(f"that is long; for a quick look on a CPU try `benchbatch occupancy {CPU_HINT}`")
