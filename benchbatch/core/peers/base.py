"""What every peer's reading shares: the run as benchbatch's metrics, the recomputed row's
shape, and the notes on where definitions differ (the package's docstring says which)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from benchbatch.core.metrics import RequestMetrics, RunMetrics, counts_percentile
from benchbatch.core.serving import tpot

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


def add_request(
    run: RunMetrics, rid, arrival, first, finish, tokens: int, gaps: list[float]
) -> None:
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


def agrees(theirs: float, ours: float, rel_tol: float = REL_TOL) -> bool:
    """Equal to the precision the peer saved (nan agrees with nan; 0 within 1e-12)."""
    if math.isnan(theirs) or math.isnan(ours):
        return math.isnan(theirs) and math.isnan(ours)
    return math.isclose(theirs, ours, rel_tol=rel_tol, abs_tol=1e-12)


def row(peer, metric, key, theirs, ours, their_way=None, note="") -> dict:
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


def per_request_values(peer: PeerRun) -> dict[str, list[float]]:
    """Per-request values in seconds; itl pooled, as the columns are."""
    ms = peer.run.requests
    return {
        "ttft": [m.ttft for m in ms],
        "tpot": [t for t in (tpot(m) for m in ms) if t is not None],
        "itl": sorted(peer.run.tbt_counts.elements()),
        "e2e": [m.e2e for m in ms],
    }
