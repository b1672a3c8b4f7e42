"""serve-sweep --endpoint: the serving curve of a running OpenAI-compatible server (vLLM,
SGLang, TGI, `benchbatch serve`), measured with the same requests, arrivals and metrics as
benchbatch's own engine.

Each rate's requests are the first --real-requests of the workload (same lengths, same
seeded arrival times), streamed to /v1/completions (or, to a URL that ends in
/v1/chat/completions, as one user message each there) by benchbatch/net/client.py; every chunk
is stamped as it arrives, and the metrics are core/serving's (vLLM's definitions), with the
server's usage counts as each request's output tokens. A request that fails (refused, an
HTTP error, a stream that stops, a timeout) is counted in its own column and never waited
on. Without --rates the max point runs first and finds the server's capacity; the rates are
then fractions of it that fit --real-time. With --step-costs the same requests are also
simulated (sim-matched), so the prediction stands beside the measurement.

Everything here returns rows or plain results; nothing prints.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from benchbatch.core import endpoint_calibration as ec
from benchbatch.core import energy
from benchbatch.core.prediction import band_median, with_intervals
from benchbatch.core.serving import cap_label
from benchbatch.core.units import figure
from benchbatch.errors import UserError
from benchbatch.experiments.serve import lateness, probe
from benchbatch.experiments.serve.endpoint_rows import ENDPOINT, point, point_row, request_row
from benchbatch.experiments.serve.options import ServeOptions
from benchbatch.output import render

# Default rates after the max point: these fractions of its request throughput, cheapest
# (highest) first, while they fit --real-time.
FRACTIONS = (0.9, 0.7, 0.5, 0.3)
# Token-id prompts when neither a tokenizer nor the server says more: ids below 256, which
# every tokenizer has (a byte-level BPE's first 256 are the bytes).
ID_VOCAB = 256


def connect(opts: ServeOptions):
    """The endpoint and what it says of itself (/v1/models, version headers, and the client's
    priority as --client-priority resolved here: info's client_priority, and where auto was
    refused client_priority_refused): a UserError naming --endpoint or --served-model when
    it cannot be reached or does not serve it, or --client-priority realtime refused, before
    the server is asked anything."""
    from benchbatch.net.discovery import server_info
    from benchbatch.net.endpoint import make_endpoint
    from benchbatch.net.waits import priority

    used, refused = priority(opts.client_priority)
    endpoint = make_endpoint(opts.endpoint, opts.served_model, opts.request_timeout)
    info = server_info(endpoint) | {"client_priority": used, "api": endpoint.route}
    if refused:
        info["client_priority_refused"] = refused
    if endpoint.chat and opts.tokenizer is None and not info.get("tokenize"):
        raise UserError(
            "endpoint",
            f"{endpoint.route} takes each prompt as text, and {endpoint.public} has no "
            "/tokenize to make texts of exact token lengths: give --tokenizer (the served "
            "checkpoint's tokenizer.json), or the base URL (/v1/completions, token-id prompts)",
        )
    return replace(endpoint, model=info["served_model"]), info


def preemptions(endpoint) -> int | None:
    """The server's preemptions so far, by its /metrics (vLLM's counter); None if it has none."""
    from benchbatch.net.discovery import server_metrics

    return server_metrics(endpoint).get("preemptions")


def check_fits(info: dict, requests, prompt_option: str, output_option: str) -> None:
    """Refuse requests longer than the server's max_model_len, when it says it."""
    most = info.get("max_model_len")
    if not most or not requests:
        return
    need = max(r.prompt_tokens + r.output_tokens for r in requests)
    if need > most:
        option = prompt_option if max(r.prompt_tokens for r in requests) >= most else output_option
        raise UserError(
            option,
            f"the longest prompt plus its output is {need:,} tokens, more than the server's "
            f"max_model_len {most:,}",
        )


def prompts(opts: ServeOptions, endpoint, info: dict, requests, seed: int):
    """The requests as the client sends them: prompts of exactly each request's length
    (text through --tokenizer or the server's /tokenize, else token ids) and max_tokens its
    output length. Returns them and how the prompts were made."""
    from benchbatch.net.client import Prompt
    from benchbatch.net.prompts import exact_prompts

    lengths = [r.prompt_tokens for r in requests]
    made = exact_prompts(
        lengths,
        seed,
        tokenizer=opts.tokenizer,
        endpoint=endpoint if info.get("tokenize") else None,
        vocab=info.get("vocab") or ID_VOCAB,
    )
    how = (
        f"text, tokenized by {opts.tokenizer}"
        if opts.tokenizer is not None
        else "text, through the server's /tokenize"
        if info.get("tokenize")
        else f"token ids below {info.get('vocab') or ID_VOCAB} (seeded)"
    )
    out = [
        Prompt(r.id, text, r.prompt_tokens, r.output_tokens)
        for r, text in zip(requests, made, strict=True)
    ]
    return out, how


def stream(endpoint, prompts, arrivals: np.ndarray, opts: ServeOptions,
           cap: int | None = None) -> Iterator:  # fmt: skip
    """The client's records (core/streamed.Streamed) as each request finishes, at most cap
    requests in flight (None: each sent at its arrival)."""
    from benchbatch.net.client import stream_requests

    return stream_requests(endpoint, prompts, arrivals.tolist(), cap,
                           realtime=opts.client_priority == "realtime")  # fmt: skip


def warm_up(endpoint, first, opts: ServeOptions) -> dict:
    """One request like the first, sent and waited for before any point's clock starts (as
    vLLM's bench serve sends its test prompt first): a server's first request pays for its
    own warm-up (allocations, compiled kernels, caches), which no point should. Returns
    what it did, for the metadata; a failure is said there, and the points then count
    their own."""
    records = []
    with stream(endpoint, [first], np.zeros(1), opts) as run:
        records = list(run)
    s = records[0] if records else None
    if s is None or not s.ok:
        return {"requests": 1, "ok": False, "error": None if s is None else s.error}
    return {"requests": 1, "ok": True, "e2e_s": s.chunk_s[-1] - s.sent_s if s.chunk_s else None}


# --- the rates ------------------------------------------------------------------------------


def default_rates(capacity_rps: float, n: int, budget_s: float) -> tuple[list[float], float]:
    """After the max point: FRACTIONS of its request throughput (two significant digits),
    cheapest first, while their arrivals (n requests, the last at about n / rate) fit
    budget_s seconds. Returns the rates, ascending, and their estimated seconds."""
    chosen, spent = [], 0.0
    if not (capacity_rps > 0 and math.isfinite(capacity_rps)):
        return [], 0.0
    for f in FRACTIONS:
        rate = float(f"{f * capacity_rps:.2g}")
        cost = n / rate
        if rate > 0 and rate not in chosen and spent + cost <= budget_s:
            chosen.append(rate)
            spent += cost
    return sorted(chosen), spent


# --- the run ----------------------------------------------------------------------------------


def serve(rec, opts: ServeOptions, w, setup: probe.Setup, cost, predicted: bool) -> None:
    """Each rate's first --real-requests streamed to the server at their arrival times:
    requests.csv as each finishes, serve.csv's row per rate; without --rates the max point
    first, then fractions of its throughput that fit --real-time. Several
    --max-concurrency caps (a concurrency sweep): a point per cap, ascending, at the one
    rate (max without --rates), the client keeping that many in flight. With --predict the server
    is calibrated before the first point and after each (serve/predict.py), and each point
    predicted from the two calibrations around it, so a server whose speed drifts during
    the run is predicted as it ran then. With a cost model (predicted: an endpoint's
    calibration, simulated as --server-scheduler; else every --policies, a what-if) each
    point's requests are simulated beside (sim-matched) once all are measured, with
    sim_vs_real.csv, and for a prediction prediction.csv/png and its verdict."""
    from benchbatch.experiments.serve import predict

    target, info = rec.inputs
    opts = replace(opts, client_priority=info["client_priority"])  # auto: as resolved
    n = min(opts.real_requests, len(w.requests))
    requests = w.requests[:n]
    seed = rec.meta["options"]["seed"]

    def prompts_at(index: int):  # each point's own prompts (index 0: the warm-up's)
        return prompts(opts, target, info, requests, seed + 104729 * index)

    if opts.predict or predicted:  # the server's own KV pool and chunks, checked before a request
        setup = predict.server_setup(rec, opts, info, setup, requests)
    sent, how = prompts_at(0)
    rec.meta["endpoint"]["prompts"] = how + "; each point's drawn afresh (seeded)"
    rec.meta["endpoint"]["warmup"] = warm_up(target, sent[0], opts)
    calibrations = _Calibrations(rec, opts, w, setup, target, info)
    calibrate = calibrations.take
    label = f"{info.get('served_model', 'server')} at {info.get('url', opts.endpoint)}"
    rates = list(opts.rate_values or (math.inf,))
    if opts.predict:
        calibrate(rates[0])
        predicted = True
    rec.meta["rates_rps"] = [probe.rate_label(r) for r in rates]
    if opts.concurrency_sweep:
        rec.meta["max_concurrency"] = list(opts.caps)
    measured: list[tuple[float, int | None, dict]] = []
    todo = [(rate, cap) for rate in rates for cap in opts.caps]
    while todo:
        rate, cap = todo.pop(0)
        if any((rate, cap) == (r, c) for r, c, _ in measured):
            continue
        sent_now = prompts_at(len(measured) + 1)[0]
        row = _point(rec, opts, w, setup, sent_now, rate, cap, n, label)
        measured.append((rate, cap, row))
        if opts.rates is None and math.isinf(rate) and not opts.concurrency_sweep:
            todo = [(r, cap) for r in _after_max(rec, opts, row, n)]
        if opts.predict:  # before the next point (idle as its arrivals), or after the last
            calibrate(todo[0][0] if todo else rate)
    if opts.predict:
        if calibrations.preempted:
            rec.warning(predict.preempted_line(calibrations.preempted, len(calibrations.done),
                                               setup.kv))  # fmt: skip
        cost = predict.save(rec, calibrations.done)
    if cost is not None:
        _beside(rec, opts, w, setup, measured, n, label, cost, predicted, calibrations.done)


class _Calibrations:
    """The run's calibrations of the server (serve/predict.py), in order, and the requests
    the server preempted during them (by its /metrics counter, where it has one)."""

    def __init__(self, rec, opts: ServeOptions, w, setup: probe.Setup, target, info: dict):
        self.run = (rec, opts, w, setup, target, info)
        self.done: list[dict] = []
        self.counted = "preemptions" in (info.get("metrics") or {})
        self.preempted = 0

    def take(self, rate: float | None) -> None:
        """One more, idle before each episode as the coming point's arrivals would be."""
        from benchbatch.experiments.serve import predict

        rec, opts, w, setup, target, info = self.run
        before = preemptions(target) if self.counted else None
        index, pause = len(self.done), ec.idle_pause(rate)
        self.done.append(predict.calibrate(rec, opts, w, setup, target, info, index,
                                           (prompts, stream), pause))  # fmt: skip
        after = preemptions(target) if before is not None else None
        if after is not None:
            self.preempted += max(0, after - before)


def _after_max(rec, opts: ServeOptions, row: dict, n: int) -> list[float]:
    """The rates after the max point: fractions of the throughput it served."""
    more, spent = default_rates(row["request_throughput_rps"], n, opts.real_time)
    rec.meta["rates_rps"] += [probe.rate_label(r) for r in more]
    rec.meta["real"] = {"requests": n, "estimated_s": spent, "budget_s": opts.real_time}
    if not more:
        rec.warning(
            f"the server served {figure(row['request_throughput_rps'])} req/s with every "
            f"request queued, so no rate below it fits --real-time {opts.real_time:g} s "
            f"with {n} requests: raise --real-time or lower --real-requests"
        )
    else:
        rec.say(
            f"endpoint: {n} requests per point at "
            f"{', '.join(probe.rate_label(r) for r in more)} req/s (fractions of the "
            f"{figure(row['request_throughput_rps'])} req/s it served at max), about "
            f"{render.duration(spent)}"
        )
    return more


def _beside(rec, opts, w, setup, measured, n, label, cost, predicted, calibrations) -> None:
    """Each measured point's requests simulated: serve.csv's sim-matched rows and
    sim_vs_real.csv; for a prediction (one policy: --server-scheduler) prediction.csv/png.
    Point k of a run that calibrated is priced by the calibrations before and after it."""
    from benchbatch.experiments.serve import predict
    from benchbatch.output.plots.prediction import record

    policies = (opts.server_scheduler,) if predicted else opts.policies
    pairs: list[dict] = []
    for k, (rate, cap, row) in enumerate(measured):
        model, source = predict.bracket(calibrations, k, cost) if calibrations else (cost, "")
        if source == predict.POOLED:
            rec.warning(f"the point at {probe.rate_label(rate)} req/s{cap_label(cap)} is "
                        f"predicted by {source}: read its prediction as the run's average "
                        "server, not the server as it was around that point")  # fmt: skip
        capped = replace(setup, client_limit=cap)  # the client's cap at this point
        for policy in policies:
            twin = probe.simulate_point(w, policy, rate, capped, model, n, probe.MATCHED)
            twin_row = probe.point_row(twin, capped) | {"max_concurrency": cap}
            rec.add("serve", twin_row)
            # a prediction's band: sim_vs_real and prediction.csv beside its median
            spread = probe.spread_rows(w, policy, rate, capped, model, n) if predicted else []
            for versus in probe.sim_vs_real(row, band_median(twin_row, spread, probe.COMPARED)):
                rec.add("sim_vs_real", versus | {"simulated_policy": policy,
                                                 "max_concurrency": cap})  # fmt: skip
            if predicted:
                arrivals = w.at(rate, n)[1]
                span = float(arrivals.max() - arrivals.min()) if len(arrivals) else 0.0
                mine = probe.prediction_pairs(row | {"policy": policy}, twin_row, span, spread)
                pairs += with_intervals(mine, _requests(rec, mine, rate, cap, twin, capped))
    if predicted:
        record(rec, pairs, f"serve-sweep --endpoint: {label} beside its prediction "
                           f"({opts.server_scheduler}, {setup.slots} sequences, "
                           f"{setup.budget} tokens a step)")  # fmt: skip


def _requests(rec, pairs: list[dict], rate: float, cap: int | None, twin,
              setup: probe.Setup) -> dict:  # fmt: skip
    """A point's requests for its pairs' intervals (core/prediction.with_intervals): the
    server's, as requests.csv has them, beside its twin's simulated ones."""
    if not pairs:
        return {}
    label = probe.rate_label(rate)
    served = {r["request_id"]: r for r in rec.rows("requests") if r["source"] == ENDPOINT
              and r["rate"] == label and r["max_concurrency"] == cap}  # fmt: skip
    simulated = {r["request_id"]: r for r in probe.request_rows(twin, setup.slo)}
    point = pairs[0]["point"]
    return {(point, "measured"): served, (point, "simulated"): simulated}


def _point(rec, opts, w, setup, sent, rate: float, cap: int | None, n: int, label: str) -> dict:
    """One rate's requests streamed, at most cap in flight (requests.csv as each ends); its
    serve.csv row."""
    requests, arrivals = w.at(rate, n)
    records: list = []
    waited = {"share": math.nan}

    def rows():
        with stream(rec.inputs[0], sent, arrivals, opts, cap) as run:
            try:
                for s in run:
                    records.append(s)
                    yield request_row(s, rate, setup.slo) | {"max_concurrency": cap}
            except KeyboardInterrupt:  # the requests out at Ctrl-C kept, as cancelled
                run.close()
                for s in sorted(run.cancelled, key=lambda s: s.request_id):
                    if s.posted:
                        yield request_row(s, rate, setup.slo) | {"max_concurrency": cap}
                raise
            rec.meta["endpoint"]["length_fields"] = list(run.length_fields or ())
            rec.meta["endpoint"]["dropped_fields"] = list(run.dropped_fields or ())
            span = getattr(run, "client_span_s", math.nan)  # a client that measures it
            if span > 0:
                waited["share"] = run.client_wait_s / span

    what = f"endpoint at {probe.rate_label(rate)} req/s{cap_label(cap)}"
    counted = "preemptions" in (rec.inputs[1].get("metrics") or {})
    before = preemptions(rec.inputs[0]) if counted else None
    rec.record("requests", rows(), total=n, label=what, timed=False, stream=True)
    after = preemptions(rec.inputs[0]) if before is not None else None
    p = point(records, rate, requests, arrivals)
    if before is not None and after is not None:
        p.preemptions = after - before  # the server's counter over the point
    row = point_row(records, p, setup, label) | {"max_concurrency": cap}
    # the share of the point the client's thread waited for a core (NaN: the OS does not say)
    row["client_wait_share"] = waited["share"]
    row |= energy.serve_columns(row, None, opts.price_per_hour, why=f"served by {label}")
    if row["burst_requests"] > ec.BURSTS_WARN * max(1, row["judged_requests"]):
        rec.warning(lateness.point_bursts(row, rate))
    elif row["client_wait_share"] > lateness.CLIENT_WAIT_WARN:
        rec.warning(lateness.point_waits(row, rate))
    rec.add("serve", row)
    _still_there(rec, records, rate, cap)
    return row


def _still_there(rec, records: list, rate: float, cap: int | None) -> None:
    """After a point whose requests could not connect: the server asked again (GET
    /v1/models); gone, the sweep stops in one line, the points measured so far kept (each
    later point would only count its requests failed, and read as the server missing its
    SLO)."""
    from benchbatch.net.discovery import server_info

    refused = sum(r.error_kind == "refused" for r in records)
    if not refused:
        return
    try:
        server_info(rec.inputs[0], probe_fields=False)
    except UserError as e:
        raise UserError(
            "endpoint",
            f"the server stopped answering during the point at {probe.rate_label(rate)} "
            f"req/s{cap_label(cap)} ({refused:,} of {len(records):,} requests could not "
            f"connect; {e.message}): the points measured so far are in {rec.folder}",
        ) from None
