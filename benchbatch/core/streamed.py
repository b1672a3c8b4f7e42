"""Requests streamed from a server over HTTP, as the client saw them, and their metrics.

The client (net/client.py) stamps every streamed chunk on arrival; this module turns those
stamps into core/metrics' RequestMetrics with vLLM's bench serve definitions (the ones
core/serving.py applies to every source):
- TTFT: the first chunk that carried choices, less the time the request was sent;
- ITL: every gap between two consecutive such chunks, pooled over all requests;
- TPOT: (E2E - TTFT) / (output tokens - 1), the output tokens being the server's
  usage.completion_tokens (core/serving.tpot computes it from num_tokens);
- E2E: the last such chunk, less the time the request was sent.

"Sent" is when the POST went out. Under a client concurrency cap a request may wait for a
free slot after its arrival; vLLM's bench serve leaves that wait out of TTFT and E2E and
reports it apart (client_queue_time); so does request_metrics, unless include_queue=True,
which counts from the arrival instead (the in-process serve-sweep's view: queueing counts).

Pure Python; no torch, no aiohttp.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from benchbatch.core.metrics import RequestMetrics, RunMetrics, counts_percentile

# Why a request failed: no connection (refused, DNS); an HTTP status other than 200; the
# whole request over its timeout; a stream that broke (stopped before [DONE], a malformed or
# error chunk, a payload error, no chunk with a token); cancelled by the caller (Ctrl-C).
ERROR_KINDS = ("refused", "http", "timeout", "stream", "cancelled")
ERROR_CHARS = 200  # an error message is cut to this many characters, on one line


@dataclass
class Streamed:
    """One request as the client saw it; times in seconds on the run's clock (0 = the moment
    the first request may be sent)."""

    request_id: int
    prompt_tokens: int  # the workload's prompt length (what was asked)
    max_tokens: int  # output tokens asked for
    sent_s: float  # when the POST went out (vLLM's start_time)
    chunk_s: list[float]  # arrival of each streamed chunk that carried choices
    output_tokens: int | None  # usage.completion_tokens (None: the server sent no usage)
    server_prompt_tokens: int | None  # usage.prompt_tokens
    text: str = ""
    error: str | None = None  # None: served; else one line (status and message, cut)
    error_kind: str | None = None  # one of ERROR_KINDS
    queued_s: float = 0.0  # time waited for a free slot under --max-concurrency, before sent_s
    finish_reason: str | None = None  # the last chunk's (length, stop, ...)
    # How long the client's thread waited for a core (runnable, not running) from sending
    # to the last chunk: stamps that late may be later than the chunks' arrival (NaN where
    # the OS does not say; net/client.py)
    client_wait_s: float = math.nan
    # When the client was done with it: its [DONE] read, or its failure (a timeout when it
    # gave up); NaN where no client said
    ended_s: float = math.nan
    posted: bool = True  # the POST went out (False: cancelled before it was due, or queued)

    def __post_init__(self):
        assert self.error_kind is None or self.error_kind in ERROR_KINDS, self.error_kind
        assert (self.error is None) == (self.error_kind is None), (self.error, self.error_kind)

    @property
    def ok(self) -> bool:
        """Served: a stream that ended with [DONE] after at least one chunk with choices."""
        return self.error_kind is None

    @property
    def arrival_s(self) -> float:
        """When the request arrived (became due), before any wait for a free slot."""
        return self.sent_s - self.queued_s

    @property
    def tokens(self) -> int:
        """Output tokens: the server's usage count, or the chunks when it sent none."""
        return self.output_tokens if self.output_tokens is not None else len(self.chunk_s)


def request_metrics(s: Streamed, include_queue: bool = False) -> RequestMetrics:
    """RequestMetrics in seconds of a served request. num_tokens is the usage count (the
    chunk count when the server sent none), so core/serving.tpot gives vLLM's TPOT; the
    tbt_* are this request's own chunk gaps."""
    assert s.ok and s.chunk_s, f"request {s.request_id} was not served: {s.error}"
    gaps = [b - a for a, b in pairwise(s.chunk_s)]
    own = Counter(gaps)
    return RequestMetrics(
        request_id=s.request_id,
        arrival=s.arrival_s if include_queue else s.sent_s,
        first_token=s.chunk_s[0],
        finish=s.chunk_s[-1],
        num_tokens=s.tokens,
        tbt_p50=counts_percentile(own, 50) if gaps else 0.0,
        tbt_p99=counts_percentile(own, 99) if gaps else 0.0,
        tbt_max=max(gaps, default=0.0),
    )


def span_s(records: Sequence[Streamed]) -> float:
    """A point's duration as vLLM's bench serve divides by (its benchmark_duration): from
    the first request sent to the last one done, failed ones included (a served request done
    at its last token, a failed one when the client gave up on it; without ended_s, at its
    last chunk or its sending). 0 without records. Over the served alone, every failure
    would shorten the point and raise its request and token rates."""
    if not records:
        return 0.0

    def end(s: Streamed) -> float:
        if s.ok:
            return s.chunk_s[-1]
        return s.ended_s if math.isfinite(s.ended_s) else max([s.sent_s, *s.chunk_s])

    return max(end(s) for s in records) - min(s.sent_s for s in records)


def run_metrics(records: Iterable[Streamed], include_queue: bool = False) -> RunMetrics:
    """RunMetrics (unit "s") of the served requests; tbt_counts pools every chunk gap of
    every served request (vLLM's ITL). Failed ones are left out (failure_counts counts them)."""
    run = RunMetrics([], Counter(), "s")
    for s in records:
        if s.ok:
            run.requests.append(request_metrics(s, include_queue))
            run.tbt_counts.update(b - a for a, b in pairwise(s.chunk_s))
    return run


@dataclass(frozen=True)
class Mismatch:
    """A served request whose token counts disagree: the server's usage count, the chunks
    that carried choices, and the output tokens asked for."""

    request_id: int
    usage_tokens: int | None
    chunks: int
    max_tokens: int
    reasons: tuple[str, ...] = field(default=())


def token_mismatches(records: Iterable[Streamed]) -> list[Mismatch]:
    """Served requests whose counts disagree, with why. How they are judged: a chunk with
    choices carries one or more tokens (a server may stream several at once, vLLM with
    --stream-interval > 1 or while its detokenizer holds back a partial character), so
    - no usage: the output length is the chunk count, unchecked ("no usage");
    - usage != chunks: some chunks carried several tokens (usage > chunks), or chunks carried
      none (usage < chunks); either way a chunk gap is not one token's, and ITL is not
      per token ("chunks");
    - usage != max_tokens: the server stopped early (EOS or a stop string: ignore_eos not
      honoured) or went past the limit ("max_tokens")."""
    out = []
    for s in records:
        if not s.ok:
            continue
        reasons = []
        if s.output_tokens is None:
            reasons.append("no usage")
        elif s.output_tokens != len(s.chunk_s):
            reasons.append("chunks")
        if s.tokens != s.max_tokens:
            reasons.append("max_tokens")
        if reasons:
            out.append(
                Mismatch(
                    s.request_id, s.output_tokens, len(s.chunk_s), s.max_tokens, tuple(reasons)
                )
            )
    return out


def failure_counts(records: Iterable[Streamed]) -> dict[str, int]:
    """Failed requests per kind, every kind present (0 where none), in ERROR_KINDS' order."""
    counts = Counter(s.error_kind for s in records if not s.ok)
    return {kind: counts.get(kind, 0) for kind in ERROR_KINDS}


def queue_stats(records: Sequence[Streamed]) -> dict[str, float]:
    """Mean and max time the served requests waited for a free client slot (vLLM's
    client_queue_time): 0 without a concurrency cap, nan with no served request."""
    waits = [s.queued_s for s in records if s.ok]
    if not waits:
        return {"client_queue_mean_s": math.nan, "client_queue_max_s": math.nan}
    return {"client_queue_mean_s": sum(waits) / len(waits), "client_queue_max_s": max(waits)}


def error_line(text: object, limit: int = ERROR_CHARS) -> str:
    """A message on one line (whitespace runs made one space), cut to limit characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
