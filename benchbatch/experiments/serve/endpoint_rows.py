"""The rows of a measured server's point: serve.csv's (point_row, from point's metrics) and
requests.csv's (request_row, one per streamed request, failed ones with their reason), from
the client's records (core/streamed.Streamed). serve/endpoint.py writes them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from benchbatch.core import endpoint_calibration as ec
from benchbatch.core.serving import ServingSLO, tpot
from benchbatch.experiments.serve import probe
from benchbatch.experiments.serve.rates import rate_label

ENDPOINT = probe.ENDPOINT  # the source, and the policy, of a measured server's points
# Not a metric of a server measured from outside: what its slots did.
UNSEEN = ("steps", "mean_batch", "busy_fraction", "slot_occupancy", "slots")


def point(records: Sequence, rate: float, requests, arrivals) -> probe.Point:
    """A measured server's point: the served requests' metrics, its rates over every
    request's span (failed ones too, as vLLM's client); no steps seen."""
    from benchbatch.core.streamed import run_metrics, span_s

    return probe.Point(
        ENDPOINT,
        rate,
        ENDPOINT,
        list(requests),
        np.asarray(arrivals),
        run_metrics(records),
        [],
        [],
        [],
        span_s=span_s(records),
    )


def point_row(records: Sequence, p: probe.Point, setup: probe.Setup, label: str) -> dict:
    """serve.csv's row of an endpoint point: the serving metrics of the requests it served,
    its failures counted apart (failed: refused, HTTP errors, broken streams; timed_out),
    the requests whose usage count disagreed with their stream or their max_tokens, and
    those streamed in bursts (ec.stalled) of those with tokens enough to tell (ec.judged),
    and of those the ones the client read late (ec.read_late). A point with a failed request
    is not within the SLO (that request missed it)."""
    from benchbatch.core.streamed import failure_counts, token_mismatches

    # the prompt tokens the server counted (its usage: a BOS, a chat template's tokens
    # more), else the workload's: vLLM's client takes the server's for its total throughput
    prompts = {r.request_id: r.prompt_tokens if r.server_prompt_tokens is None
               else r.server_prompt_tokens for r in records}  # fmt: skip
    row = probe.point_row(p, setup, prompts)
    row["label"] = label
    for key in UNSEEN:
        row[key] = math.nan
    failures = failure_counts(records)
    timed_out = failures.get("timeout", 0)
    failed = sum(failures.values()) - timed_out
    sent = len(records)
    row["sent"] = sent
    row["failed"] = failed
    row["timed_out"] = timed_out
    row["token_mismatch"] = len(token_mismatches(records))
    row["judged_requests"] = sum(ec.judged(r) for r in records)
    row["burst_requests"] = sum(ec.stalled(r) for r in records)
    row["client_burst_requests"] = sum(ec.read_late(r) for r in records)
    if sent:
        row["slo_met_fraction"] = row.get("slo_met", 0) / sent
    row["within_slo"] = bool(row["within_slo"]) and failed + timed_out == 0 and row["requests"] > 0
    return row


def request_row(s, rate: float, slo: ServingSLO) -> dict:
    """requests.csv's row of one streamed request (failed ones too, with their reason)."""
    from benchbatch.core.streamed import request_metrics

    row = {
        "policy": ENDPOINT,
        "source": ENDPOINT,
        "rate": rate_label(rate),
        "request_id": s.request_id,
        "prompt_tokens": s.prompt_tokens,
        # what the server counted (its usage): a BOS, a chat template's tokens more
        "server_prompt_tokens": s.server_prompt_tokens,
        "output_tokens": s.output_tokens,
        "arrival_s": s.arrival_s,
        "queued_s": s.queued_s,
        "sent_s": s.sent_s,
        "client_wait_s": s.client_wait_s,
        "ended_s": s.ended_s,  # when the client was done with it (the point's span ends there)
    }
    if not s.ok:
        nan = math.nan
        row |= {"ttft_s": nan, "tpot_s": nan, "itl_max_s": nan, "e2e_s": nan}
        return row | {"slo_met": False, "chunks": len(s.chunk_s), "in_burst": False,
                      "read_late": False, "error": s.error}  # fmt: skip
    m = request_metrics(s)
    per = tpot(m)
    return row | {
        "output_tokens": m.num_tokens,
        "ttft_s": m.ttft,
        "tpot_s": math.nan if per is None else per,
        "itl_max_s": m.tbt_max,
        "e2e_s": m.e2e,
        "slo_met": slo.met(m),
        "chunks": len(s.chunk_s),
        "in_burst": ec.stalled(s),
        "read_late": ec.read_late(s),
        "error": "",
        # every gap between its chunks (vLLM's --save-detailed "itls"), space-separated, at
        # full precision: the point's pooled ITL recomputes from requests.csv
        "itls_s": " ".join(repr(b - a) for a, b in pairwise(s.chunk_s)),
    }
