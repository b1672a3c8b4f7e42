"""Other benchmarks' results, read and recomputed with benchbatch's metric code.

Two formats are read:
- vLLM's `vllm bench serve --save-result --save-detailed` JSON (one object per file, or one
  per line with --append-result): per request `start_times` (perf_counter seconds at send),
  `ttfts`, `itls` (every gap between two streamed chunks), `latencies`, `input_lens`,
  `output_lens` (the server's usage counts) and `errors` ('' when it succeeded), and its own
  aggregates (`mean_ttft_ms`, `median_ttft_ms`, `p99_ttft_ms`, ... for ttft, tpot, itl,
  e2el; `request_throughput`, `output_throughput`, `total_token_throughput` over
  `duration`; `completed`, `failed`, `total_input_tokens`, `total_output_tokens`).
- GuideLLM's JSON report (`guidellm benchmark ... --outputs report.json`): `benchmarks[]`,
  each with `requests.successful[]` (per request `info.timings.request_start`,
  `first_token_iteration`, `last_token_iteration`, `request_end`; `prompt_tokens` and
  `output_tokens`, or `input_metrics/output_metrics.total_tokens`) and its aggregates under
  `metrics.<name>.successful` (`mean`, `median`, `percentiles.p50/p90/p99`).

Each run's requests become benchbatch's RunMetrics (seconds from the first request sent), and
every aggregate the peer saved is recomputed: `ours` by benchbatch's definition
(core/serving.py's latency_columns and throughput_columns), and `ours_their_way` by the
peer's definition where it differs, still from the same per-request times and with
benchbatch's statistics where the peer's are the same. `agrees` compares `ours_their_way`
with theirs to the precision they saved (both save full floats: a relative 1e-9).

Where definitions differ, the row's note says how:
- vLLM's are benchbatch's (serving.py takes them from vLLM) except throughput: vLLM divides
  by the benchmark's wall time (from before the first request is sent to after the last
  answer), benchbatch by first send to last token.
- GuideLLM: its ITL is a per-request mean ((last token - first token) / (output tokens -
  1), which is vLLM's TPOT per request), its TPOT includes the first token ((last token -
  request start) / output tokens), and its percentiles are the first value whose cumulative
  probability reaches q (no interpolation), where benchbatch interpolates (numpy's default).
- AIPerf (not read here): its "inter token latency" is vLLM's TPOT.
vLLM's `std_*` and goodput (the SLO is not saved) are not recomputed.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchbatch.core.metrics import (
    RequestMetrics,
    RunMetrics,
    counts_percentile,
    percentile,
    summarize,
)
from benchbatch.core.serving import latency_columns, throughput_columns, tpot
from benchbatch.errors import UserError

VLLM = "vllm-bench-serve"
GUIDELLM = "guidellm"
REL_TOL = 1e-9  # both peers save full float64s; 1e-9 leaves room for summation order only
METRICS = ("ttft", "tpot", "itl", "e2e")  # benchbatch's names; vLLM says e2el
NOTES = {
    "vllm_throughput": "vLLM divides by its benchmark's wall time (duration, from before the "
    "first request is sent to after the last answer); benchbatch by first send to last token",
    "guidellm_itl": "GuideLLM's ITL is a per-request mean, (last - first token) / (output "
    "tokens - 1), i.e. vLLM's TPOT per request; benchbatch's pools every gap",
    "guidellm_tpot": "GuideLLM's TPOT includes the first token: (last token - request start) "
    "/ output tokens; benchbatch's (and vLLM's) excludes it",
    "guidellm_pct": "GuideLLM's percentile is the first value whose cumulative probability "
    "reaches q; benchbatch interpolates between closest ranks",
    "guidellm_throughput": "GuideLLM divides by its benchmark's duration (start to end of the "
    "measured phase); benchbatch by first request start to last token",
    "guidellm_e2e": "GuideLLM's request latency ends with the response (request_end, after "
    "the last token and the usage chunk); benchbatch's E2E at the last token",
    "guidellm_itl_times": "GuideLLM keeps first and last token times only: benchbatch's "
    "pooled ITL is not computable, the per-request mean stands in",
}


@dataclass
class PeerRun:
    """One run of another benchmark: its requests as benchbatch's metrics (seconds from its
    first request) and what it computed itself."""

    tool: str
    label: str
    run: RunMetrics
    prompt_tokens: dict[int, int]
    failed: int
    rate_rps: float  # the offered rate; inf for all at once
    doc: dict = field(repr=False)  # the peer's own record of this run
    starts_known: bool = True  # False: a vLLM file without start_times (arrivals all 0)
    ends: dict[int, float] | None = None  # GuideLLM: each response's end (after the last token)


# --- reading ---------------------------------------------------------------------------------


def read(path: str | Path, option: str = "RUN_DIR") -> list[PeerRun]:
    """Every run in a vLLM bench serve result file or a GuideLLM report, by its shape."""
    path = Path(path)
    docs = _json_docs(path, option)
    try:
        if all("benchmarks" in d for d in docs):
            return [run for d in docs for run in read_guidellm(d, path.stem, option)]
        if all("ttfts" in d for d in docs):
            return [read_vllm(d, _label(path, i, len(docs)), option) for i, d in enumerate(docs)]
    except UserError as e:  # the run's label said; the file named
        raise UserError(option, f"{path}: {e.message}") from None
    raise UserError(
        option,
        f"{path}: neither a vLLM bench serve result saved with --save-detailed (no 'ttfts') "
        "nor a GuideLLM report (no 'benchmarks')",
    )


def _label(path: Path, i: int, n: int) -> str:
    return path.stem if n == 1 else f"{path.stem}#{i}"


def _json_docs(path: Path, option: str) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(option, f"{path}: cannot be read ({e})") from None
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:  # --append-result: one object per line
        try:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise UserError(option, f"{path}: not JSON ({e})") from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise UserError(option, f"{path}: not a JSON object")
    return docs


def read_vllm(doc: Mapping, label: str = VLLM, option: str = "RUN_DIR") -> PeerRun:
    """A vLLM bench serve result (one JSON object) as a PeerRun; failed requests (a non-empty
    error) are counted, not measured, as vLLM does."""
    need = ("ttfts", "itls", "latencies", "output_lens", "input_lens")
    missing = [k for k in need if not isinstance(doc.get(k), list)]
    if missing:
        raise UserError(
            option,
            f"{label}: vLLM result without {', '.join(missing)} "
            "(save it with --save-result --save-detailed)",
        )
    n = len(doc["ttfts"])
    starts = doc.get("start_times")
    errors = doc.get("errors") or [""] * n
    if any(len(doc[k]) != n for k in need) or len(errors) != n or (starts and len(starts) != n):
        raise UserError(option, f"{label}: per-request lists of different lengths")
    try:
        return _vllm_run(doc, label, n, starts, errors)
    except (TypeError, ValueError) as e:  # a string or null where a number belongs
        raise UserError(option, f"{label}: a per-request value is not a number ({e})") from None


def _vllm_run(doc: Mapping, label: str, n: int, starts, errors) -> PeerRun:
    t0 = min(starts) if starts else 0.0
    run, prompts, failed = RunMetrics([], Counter(), "s"), {}, 0
    for i in range(n):
        if errors[i]:
            failed += 1
            continue
        arrival = (starts[i] - t0) if starts else 0.0
        _add(
            run,
            i,
            arrival,
            arrival + float(doc["ttfts"][i]),
            arrival + float(doc["latencies"][i]),
            int(doc["output_lens"][i]),
            [float(g) for g in doc["itls"][i]],
        )
        prompts[i] = int(doc["input_lens"][i])
    rate = doc.get("request_rate", math.inf)
    rate = math.inf if rate in ("inf", None) else float(rate)
    return PeerRun(VLLM, label, run, prompts, failed, rate, dict(doc), bool(starts))


def _add(run: RunMetrics, rid, arrival, first, finish, tokens: int, gaps: list[float]) -> None:
    run.tbt_counts.update(gaps)
    own = Counter(gaps)
    run.requests.append(
        RequestMetrics(
            request_id=rid,
            arrival=arrival,
            first_token=first,
            finish=finish,
            num_tokens=tokens,
            tbt_p50=counts_percentile(own, 50) if gaps else 0.0,
            tbt_p99=counts_percentile(own, 99) if gaps else 0.0,
            tbt_max=max(gaps, default=0.0),
        )
    )


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
        _add(run, i, start - t0, first - t0, last - t0, n_out, [step] * (n_out - 1))
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


def recompute(peer: PeerRun) -> list[dict]:
    """One row per aggregate the peer saved: theirs, ours (benchbatch's definition), ours
    their way (their definition, from the same per-request times) and whether that agrees."""
    rows = _vllm_rows(peer) if peer.tool == VLLM else _guidellm_rows(peer)
    for row in rows:
        row["agrees"] = agrees(row["theirs"], row["ours_their_way"])
    return rows


def agrees(theirs: float, ours: float, rel_tol: float = REL_TOL) -> bool:
    """Equal to the precision the peer saved (nan agrees with nan; 0 within 1e-12)."""
    if math.isnan(theirs) or math.isnan(ours):
        return math.isnan(theirs) and math.isnan(ours)
    return math.isclose(theirs, ours, rel_tol=rel_tol, abs_tol=1e-12)


def _row(peer, metric, key, theirs, ours, their_way=None, note="") -> dict:
    return {
        "tool": peer.tool,
        "run": peer.label,
        "metric": metric,
        "their_key": key,
        "theirs": float(theirs) if theirs is not None else math.nan,
        "ours": float(ours),
        "ours_their_way": float(ours if their_way is None else their_way),
        "same_definition": their_way is None,
        "note": note,
    }


def _values(peer: PeerRun) -> dict[str, list[float]]:
    """Per-request values in seconds; itl pooled, as the columns are."""
    ms = peer.run.requests
    return {
        "ttft": [m.ttft for m in ms],
        "tpot": [t for t in (tpot(m) for m in ms) if t is not None],
        "itl": sorted(peer.run.tbt_counts.elements()),
        "e2e": [m.e2e for m in ms],
    }


def _vllm_rows(peer: PeerRun) -> list[dict]:
    doc, ours, values = peer.doc, latency_columns(peer.run), _values(peer)
    rows = []
    for name in METRICS:
        theirs_name = "e2el" if name == "e2e" else name
        for stat, key in _vllm_stats(doc, theirs_name):
            column = f"{name}_{stat}_s"
            value = ours[column] if column in ours else _percentile_of(name, stat, peer, values)
            rows.append(_row(peer, f"{name}_{stat}_ms", key, doc[key], 1000 * value))
    return rows + _vllm_counts(peer) + _vllm_throughput(peer)


def _vllm_stats(doc: Mapping, name: str) -> list[tuple[str, str]]:
    """(benchbatch's stat, their key) for every statistic of one metric in the file."""
    found = [("mean", f"mean_{name}_ms")] if f"mean_{name}_ms" in doc else []
    if f"median_{name}_ms" in doc:
        found.append(("p50", f"median_{name}_ms"))
    pattern = re.compile(rf"^p(\d+(?:\.\d+)?)_{name}_ms$")
    for key in sorted(doc):
        m = pattern.match(key)
        if m:
            found.append((f"p{m.group(1)}", key))
    return found


def _percentile_of(name: str, stat: str, peer: PeerRun, values) -> float:
    q = float(stat[1:])
    if name == "itl":
        return counts_percentile(peer.run.tbt_counts, q)
    return percentile(values[name], q)


def _vllm_counts(peer: PeerRun) -> list[dict]:
    ms, doc = peer.run.requests, peer.doc
    counts = {
        "completed": len(ms),
        "failed": peer.failed,
        "total_input_tokens": sum(peer.prompt_tokens.values()),
        "total_output_tokens": sum(m.num_tokens for m in ms),
    }
    return [_row(peer, k, k, doc[k], v) for k, v in counts.items() if k in doc]


def _vllm_throughput(peer: PeerRun) -> list[dict]:
    doc = peer.doc
    ours = throughput_columns(peer.run, peer.prompt_tokens, None)
    if not peer.starts_known:
        ours = dict.fromkeys(ours, math.nan)
    their_duration = float(doc.get("duration", math.nan))
    note = NOTES["vllm_throughput"]
    pairs = (
        ("duration_s", "duration", ours["duration_s"], their_duration),
        (
            "request_throughput_rps",
            "request_throughput",
            ours["request_throughput_rps"],
            ours["requests"] / their_duration,
        ),
        (
            "output_throughput_tps",
            "output_throughput",
            ours["output_throughput_tps"],
            ours["output_tokens"] / their_duration,
        ),
        (
            "total_token_throughput_tps",
            "total_token_throughput",
            ours["total_token_throughput_tps"],
            (ours["output_tokens"] + sum(peer.prompt_tokens.values())) / their_duration,
        ),
    )
    return [
        _row(peer, metric, key, doc[key], o, w, note) for metric, key, o, w in pairs if key in doc
    ]


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


def _guidellm_rows(peer: PeerRun) -> list[dict]:
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
                _row(
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
            rows.append(_row(peer, metric, key, theirs, mine))
    if isinstance(peer.doc.get("duration"), int | float):
        rows.append(
            _row(
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
                _row(
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


# --- serving rows ----------------------------------------------------------------------------


def serve_row(peer: PeerRun) -> dict:
    """The run as a row of serve.csv's shape (benchbatch's definitions), so a peer's curve can
    be drawn beside benchbatch's: source is the tool, policy 'peer'."""
    rate = peer.rate_rps
    return {
        "policy": "peer",
        "source": peer.tool,
        "run": peer.label,
        "rate": "max" if math.isinf(rate) else f"{rate:g}",
        "rate_rps": rate,
        "failed": peer.failed,
        **latency_columns(peer.run),
        **throughput_columns(peer.run, peer.prompt_tokens, None),
    }


def read_all(paths: Sequence[str | Path], option: str = "RUN_DIR") -> tuple[list[dict], list[dict]]:
    """(serve rows, recomputed rows) of every run in these files: what `compare` shows."""
    runs = [run for p in paths for run in read(p, option)]
    return [serve_row(r) for r in runs], [row for r in runs for row in recompute(r)]


def disagreements(rows: Sequence[dict], keep: Callable[[dict], bool] = lambda r: True) -> list:
    """The recomputed rows that do not agree with the peer's own numbers."""
    return [r for r in rows if keep(r) and not r["agrees"]]
