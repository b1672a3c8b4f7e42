"""vLLM's `vllm bench serve --save-result --save-detailed` JSON, read and recomputed."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping

from benchbatch.core.metrics import RunMetrics, counts_percentile, percentile
from benchbatch.core.peers.base import (
    METRICS,
    NOTES,
    VLLM,
    PeerRun,
    add_request,
    per_request_values,
    row,
)
from benchbatch.core.serving import latency_columns, throughput_columns
from benchbatch.errors import UserError


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
        add_request(
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


def vllm_rows(peer: PeerRun) -> list[dict]:
    doc, ours, values = peer.doc, latency_columns(peer.run), per_request_values(peer)
    rows = []
    for name in METRICS:
        theirs_name = "e2el" if name == "e2e" else name
        for stat, key in _vllm_stats(doc, theirs_name):
            column = f"{name}_{stat}_s"
            value = ours[column] if column in ours else _percentile_of(name, stat, peer, values)
            rows.append(row(peer, f"{name}_{stat}_ms", key, doc[key], 1000 * value))
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
    return [row(peer, k, k, doc[k], v) for k, v in counts.items() if k in doc]


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
        row(peer, metric, key, doc[key], o, w, note) for metric, key, o, w in pairs if key in doc
    ]
