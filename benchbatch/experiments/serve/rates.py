"""Request rates as serve-sweep's --rates and --real-rates take them, the client's caps as
--max-concurrency does, and a server's KV pool as --server-kv (no typer, no torch)."""

from __future__ import annotations

import math
import re

from benchbatch.core.optkit import require, strict_float
from benchbatch.errors import UserError

MAX_RATE = "max"  # every request queued at once
MAX_RATES = 64
MAX_RATE_RPS = 1e9
MIN_RATE_RPS = 1e-6  # one request in about 12 days


def parse_rates(words: tuple[str, ...], option: str) -> tuple[float, ...]:
    """'0.5', '2', 'max' -> (0.5, 2.0, inf), sorted, duplicates dropped: requests per second,
    each finite and positive; 'max' queues every request at once."""
    require(bool(words), option, "give at least one rate (requests per second, or max)")
    rates = {_rate(word, option) for word in words}
    most = MAX_RATES
    require(len(rates) <= most, option, f"{len(rates)} rates; at most {most}")
    return tuple(sorted(rates))


def _rate(word: str, option: str) -> float:
    if word.lower() == MAX_RATE:
        return math.inf
    shown = word if len(word) <= 40 else word[:40] + "..."
    try:
        rate = strict_float(word)
    except ValueError:
        raise UserError(option, f"{shown!r} is not a rate (requests per second, or max)") from None
    if rate == math.inf:  # vLLM's --request-rate inf is benchbatch's max
        raise UserError(option, f"{shown} is no rate here: write max (every request queued at "
                        "once, vLLM's --request-rate inf)")  # fmt: skip
    require(
        math.isfinite(rate) and rate > 0,
        option,
        f"a rate must be a positive number of requests per second, got {shown}",
    )
    least = MIN_RATE_RPS
    require(
        rate >= least,
        option,
        f"{shown} requests per second is less than the least rate, {least:g} (one request "
        "in about 12 days): arrivals further apart mean nothing to a server",
    )
    most = MAX_RATE_RPS
    require(
        rate <= most,
        option,
        f"{shown} is more than {most:,.0f} requests per second; use max for everything "
        "queued at once",
    )
    return rate


def rate_label(rate: float) -> str:
    return MAX_RATE if math.isinf(rate) else f"{rate:g}"


def parse_caps(words: tuple[str, ...], option: str, most: int) -> tuple[int, ...]:
    """'1', '4', '16' -> (1, 4, 16), sorted, duplicates dropped: requests in flight, each a
    whole number from 1 to most."""
    require(bool(words), option, "give at least one number of requests in flight")
    caps = set()
    for word in words:
        shown = word if len(word) <= 40 else word[:40] + "..."
        require(
            re.fullmatch("[0-9]{1,12}", word) is not None and 1 <= int(word) <= most,
            option,
            f"{shown!r} is not a number of requests in flight: give whole numbers from 1 to "
            f"{most:,}",
        )
        caps.add(int(word))
    require(len(caps) <= MAX_RATES, option, f"{len(caps)} caps; at most {MAX_RATES}")
    return tuple(sorted(caps))



def parse_server_kv(text: str, most: int) -> tuple[int, int | None]:
    """--server-kv's 'BLOCKS' or 'BLOCKSxTOKENS' -> (blocks, block size or None)."""
    words = text.strip().lower().split("x")
    ok = len(words) in (1, 2) and all(w.strip().isdigit() for w in words)
    values = [int(w) for w in words] if ok else []
    require(
        ok and all(0 < v <= most for v in values),
        "server_kv",
        f"{text!r}: give BLOCKS or BLOCKSxTOKENS, whole numbers above 0 "
        "(512x128: 512 blocks of 128 tokens)",
    )
    return values[0], values[1] if len(values) == 2 else None
