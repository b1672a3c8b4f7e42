"""What a run against a server says of its bursts and of its own client's lateness: the
lines serve-sweep --endpoint prints for a measured point (endpoint.py) and for a calibration
(predict.py). A request in bursts (core/endpoint_calibration.stalled) is the client's where
its thread waited for a core at least half the stall (read_late): on two cores beside
vLLM-CPU and another process, every such burst was (docs/simulation.md).
"""

from __future__ import annotations

import math
import os

from benchbatch.core.serving import cap_label
from benchbatch.experiments.serve.rates import rate_label

# Over this share of a point spent waiting for a core, the client's stamps are said to be
# late (as is on two cores beside vLLM-CPU: 0.6-2.2%; another process busy: 13-58%).
CLIENT_WAIT_WARN = 0.05
# What a late client can do: each a cure measured in docs/simulation.md
CURE = "run the client at real-time priority (--client-priority realtime: root or CAP_SYS_NICE)"


def refused_line(why: str) -> str:
    """--client-priority auto where real-time priority was refused."""
    return (
        f"the client runs at normal priority: real-time was refused here ({why}); where the "
        "server and other processes keep every core busy it may read chunks late "
        "(serve.csv's client_wait_share says how long it waited for a core); root or "
        "CAP_SYS_NICE allows it"
    )


def point_bursts(row: dict, rate: float) -> str:
    """Why a point's requests came in bursts, as far as the client can tell: those it read
    late (ec.read_late, by its own thread's wait for a core), and the rest."""
    load = _load()
    bursts, late = row["burst_requests"], row.get("client_burst_requests", 0)
    share = row.get("client_wait_share", math.nan)
    waited = f"{share:.0%} of the point" if share >= 0 else "for a time the OS does not say"
    line = (
        f"at {_at(row, rate)} {bursts} of {row['judged_requests']} requests "
        "came in bursts (one stall over half a request's decode, or every token at once; "
        f"requests.csv's in_burst); this client's thread waited for a core {waited} (load "
        f"average {load:.1f} on {os.cpu_count()} cores)"
    )
    if late:
        line += (
            f"; {late} of them while it waited at least half their stall (read_late): the "
            "client read their tokens late, so their TTFT, TPOT and ITL carry its lateness, "
            "not the server's (vLLM-CPU sends each token on time there: docs/simulation.md); "
            f"{CURE}, leave it a core, or measure from another machine"
        )
    if bursts > late:
        line += (
            f"; {bursts - late} held back on the way, not by a late client: their TPOT and "
            "ITL are the delivery, not the server's steps, and no step model predicts them"
        )
    return line


def point_waits(row: dict, rate: float) -> str:
    """A point without bursts whose client still waited for a core over CLIENT_WAIT_WARN."""
    return (
        f"at {_at(row, rate)} this client's thread waited for a core "
        f"{row['client_wait_share']:.0%} of the point: its stamps may be late by as much "
        f"(requests.csv's client_wait_s, per request); {CURE}, leave it a core, or measure "
        "from another machine"
    )


def calibration_bursts(served: int, bursts: int, late: int) -> str:
    """Why a calibration's requests came in bursts: those this client read late (its thread
    waiting for a core, ec.read_late), and the rest."""
    load = _load()
    line = (
        f"{bursts} of {served} calibration requests in bursts (one stall over half a "
        f"request's decode, or every token at once; load average {load:.1f} on "
        f"{os.cpu_count()} cores), so the step costs read from their gaps, and the "
        "prediction, are not the server's"
    )
    if late:
        line += (
            f": {late} of them while this client's thread waited for a core at least half "
            "their stall, read late by the client (vLLM-CPU beside another process on two "
            f"cores sends each token on time: docs/simulation.md); {CURE}, leave it a core, "
            "or calibrate from another machine"
        )
    if bursts > late:
        line += (
            f"{';' if late else ':'} {bursts - late} held back on the way, by the server's "
            "scheduler or front end waiting for a core while its model ran: give the "
            "server's front end a core of its own (vLLM-CPU binds its Worker to cores and "
            "leaves its scheduler and API server to the rest) or calibrate on a quieter "
            "machine"
        )
    return line


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


def _at(row: dict, rate: float) -> str:
    """'2 req/s', or 'max req/s, 4 in flight' for a point at a client cap."""
    return f"{rate_label(rate)} req/s{cap_label(row.get('max_concurrency'))}"
