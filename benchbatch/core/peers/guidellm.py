"""GuideLLM's JSON report (`guidellm benchmark ... --outputs report.json`), read and
recomputed."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from benchbatch.core.metrics import RunMetrics, summarize
from benchbatch.core.peers.base import GUIDELLM, NOTES, PeerRun, add_request, row
from benchbatch.core.serving import latency_columns, throughput_columns
from benchbatch.errors import UserError


def read_guidellm(doc: Mapping, label: str = GUIDELLM, option: str = "RUN_DIR") -> list[PeerRun]:
    """Each benchmark of a GuideLLM report as a PeerRun. GuideLLM saves a request's first and
    last token times, not each token's: its gaps are spread evenly between them (as
    GuideLLM itself does for its token timings), so benchbatch's ITL is that mean."""
    benchmarks = doc.get("benchmarks")
    if not isinstance(benchmarks, list) or not benchmarks:
        raise UserError(option, f"{label}: GuideLLM report without benchmarks")
    return [_guidellm_run(b, f"{label}#{i}", option) for i, b in enumerate(benchmarks)]


def _guidellm_run(bench: Mapping, label: str, option: str) -> PeerRun:
    requests = bench.get("requests") or {}
    ok = requests.get("successful")
    if not isinstance(ok, list):
        raise UserError(option, f"{label}: GuideLLM benchmark without requests.successful")
    times = [_guidellm_times(r, label, option) for r in ok]
    t0 = min((t[0] for t in times), default=0.0)
    run, prompts, ends = RunMetrics([], Counter(), "s"), {}, {}
    for i, (start, first, last, end, n_in, n_out) in enumerate(times):
        step = (last - first) / (n_out - 1) if n_out > 1 else 0.0
        add_request(run, i, start - t0, first - t0, last - t0, n_out, [step] * (n_out - 1))
        prompts[i], ends[i] = n_in, end - t0
    failed = sum(len(requests.get(k) or []) for k in ("errored", "incomplete"))
    rate = _guidellm_rate(bench)
    return PeerRun(GUIDELLM, label, run, prompts, failed, rate, dict(bench), True, ends)


def _guidellm_times(r: Mapping, label: str, option: str) -> tuple:
    """(request start, first token, last token, request end, prompt and output tokens)."""
    timings = (r.get("info") or {}).get("timings") or {}
    start, end = timings.get("request_start"), timings.get("request_end")
    first, last = timings.get("first_token_iteration"), timings.get("last_token_iteration")
    n_in = _tokens(r, "prompt_tokens", "input_metrics")
    n_out = _tokens(r, "output_tokens", "output_metrics")
    if None in (start, first, last, n_in, n_out):
        raise UserError(
            option,
            f"{label}: a successful GuideLLM request without "
            "request_start, first/last token times or token counts",
        )
    end = last if end is None else end
    return float(start), float(first), float(last), float(end), int(n_in), int(n_out)


def _tokens(r: Mapping, name: str, usage: str):
    value = r.get(name)
    return value if value is not None else (r.get(usage) or {}).get("total_tokens")


def _guidellm_rate(bench: Mapping) -> float:
    strategy = (bench.get("config") or {}).get("strategy") or {}
    rate = strategy.get("rate")
    if isinstance(rate, int | float):
        return float(rate)
    return math.inf if strategy.get("type_") == "throughput" else math.nan


# --- recomputing -----------------------------------------------------------------------------


# GuideLLM's metric names, and how each of its per-request values is made from the times.
GUIDELLM_METRICS: dict[str, tuple[str, str, str]] = {
    # their name: (benchbatch's metric, note key or '', their per-request definition)
    "time_to_first_token_ms": ("ttft", "", "ttft"),
    "time_per_output_token_ms": ("tpot", "guidellm_tpot", "tpot_with_first"),
    "inter_token_latency_ms": ("itl", "guidellm_itl", "itl_mean"),
    "request_latency": ("e2e", "guidellm_e2e", "e2e_s"),
}
GUIDELLM_STATS = ("mean", "median", "p50", "p90", "p99")


def _guidellm_per_request(peer: PeerRun) -> dict[str, list[float]]:
    """GuideLLM's own per-request values (in its units: ms, and seconds for latency)."""
    ms = peer.run.requests
    return {
        "ttft": [1000 * m.ttft for m in ms],
        "tpot_with_first": [1000 * m.e2e / m.num_tokens for m in ms if m.num_tokens > 0],
        "itl_mean": [1000 * (m.e2e - m.ttft) / (m.num_tokens - 1) for m in ms if m.num_tokens > 1],
        "e2e_s": [peer.ends[m.request_id] - m.arrival for m in ms],
    }


def guidellm_rows(peer: PeerRun) -> list[dict]:
    metrics = peer.doc.get("metrics") or {}
    ours, theirs_values = latency_columns(peer.run), _guidellm_per_request(peer)
    rows = []
    for their_name, (name, note_key, their_def) in GUIDELLM_METRICS.items():
        summary = (metrics.get(their_name) or {}).get("successful")
        if not summary:
            continue
        scale = 1.0 if their_def == "e2e_s" else 1000.0
        values = theirs_values[their_def]
        for stat in GUIDELLM_STATS:
            theirs = _guidellm_stat(summary, stat)
            if theirs is None:
                continue
            q = "p50" if stat == "median" else stat
            mine = scale * ours[f"{name}_{q}_s"]
            if stat != "mean":
                way = _first_reaching(values, stat)
            else:  # the same mean, unless the per-request values differ
                way = summarize(values)["mean"] if note_key else None
            notes = [NOTES[note_key]] if note_key else []
            if name == "itl":
                notes.append(NOTES["guidellm_itl_times"])
            if stat != "mean":
                notes.append(NOTES["guidellm_pct"])
            unit = "s" if scale == 1.0 else "ms"
            rows.append(
                row(
                    peer,
                    f"{name}_{q}_{unit}",
                    f"{their_name}.{stat}",
                    theirs,
                    mine,
                    way,
                    "; ".join(notes),
                )
            )
    return rows + _guidellm_throughput(peer, metrics)


def _total_sum(metric) -> float | None:
    return ((metric or {}).get("successful") or {}).get("total_sum")


def _guidellm_stat(summary: Mapping, stat: str) -> float | None:
    if stat in ("mean", "median"):
        return summary.get(stat)
    return (summary.get("percentiles") or {}).get(stat)


def _first_reaching(values: Sequence[float], stat: str) -> float:
    """GuideLLM's percentile: the first distinct value whose cumulative probability reaches
    q, the probabilities cumulated in float64 as GuideLLM cumulates them."""
    if not values:
        return 0.0  # GuideLLM's empty distribution
    q = 0.5 if stat == "median" else float(stat[1:]) / 100
    distinct, counts = np.unique(np.asarray(values, dtype=np.float64), return_counts=True)
    cdf = np.cumsum(counts / counts.sum())
    return float(distinct[min(int(np.searchsorted(cdf, q, side="left")), distinct.size - 1)])


def _guidellm_throughput(peer: PeerRun, metrics: Mapping) -> list[dict]:
    """Counts, the duration and the throughputs: GuideLLM's run from the first request's
    start to the last response's end."""
    ours = throughput_columns(peer.run, peer.prompt_tokens, None)
    ms, note = peer.run.requests, NOTES["guidellm_throughput"]
    duration = max(peer.ends.values()) - min(m.arrival for m in ms) if ms else math.nan
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    totals = metrics.get("request_totals") or {}
    counts = (
        ("completed", "successful", ours["requests"]),
        ("failed", "errored", peer.failed),
        ("total_output_tokens", "output_token_count", ours["output_tokens"]),
        ("total_input_tokens", "prompt_token_count", sum(peer.prompt_tokens.values())),
    )
    rows = []
    for metric, key, mine in counts:
        theirs = totals.get(key) if key in totals else _total_sum(metrics.get(key))
        if theirs is not None:
            rows.append(row(peer, metric, key, theirs, mine))
    if isinstance(peer.doc.get("duration"), int | float):
        rows.append(
            row(
                peer,
                "duration_s",
                "duration",
                peer.doc["duration"],
                ours["duration_s"],
                duration,
                note,
            )
        )
    for their_name, column, count in (
        ("requests_per_second", "request_throughput_rps", ours["requests"]),
        ("output_tokens_per_second", "output_throughput_tps", ours["output_tokens"]),
    ):
        theirs = (metrics.get(their_name) or {}).get("successful") or {}
        if "mean" in theirs:
            rows.append(
                row(
                    peer,
                    column,
                    f"{their_name}.mean",
                    theirs["mean"],
                    ours[column],
                    per_s(count),
                    note,
                )
            )
    return rows
