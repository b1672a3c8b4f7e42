"""The paper's ordering of the three schemes (Sarathi-Serve's ablation table): whether a
source's rows order as the paper's, which of them tie, and how much chunking cut the
longest stall. Rows in, a verdict out; nothing prints."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from benchbatch.experiments.ablation.probe import SCHEMES, ratio


def ordering(rows: Sequence[dict], source: str) -> dict | None:
    """Whether a source's rows order as the paper's table: P99 TBT both < chunks-only <
    mixed-only, and P50 TTFT mixed-only < both < chunks-only. None without all three."""
    by = {r["scheme"]: r for r in rows if r["source"] == source}
    if set(by) != set(SCHEMES):
        return None
    m, c, b = by["mixed-only"], by["chunks-only"], by["both"]
    tbt_values = (b["tbt_p99_s"], c["tbt_p99_s"], m["tbt_p99_s"])
    ttft_values = (m["ttft_p50_s"], b["ttft_p50_s"], c["ttft_p50_s"])
    tbt, ttft = _ordered(tbt_values), _ordered(ttft_values)
    return {
        "tbt_p99_order": tbt,
        "ttft_p50_order": ttft,
        "as_paper": None if tbt is None or ttft is None else tbt and ttft,
        "stall_shrink": ratio(m["tbt_max_s"], b["tbt_max_s"]),
        # two schemes within TIE of each other: an order their noise does not settle
        "ties": [name for name, values in (("P99 TBT", tbt_values), ("P50 TTFT", ttft_values))
                 if _tied(values)],  # fmt: skip
    }


TIE = 0.01  # two values within 1% of each other: their order is not the schemes'


def _ordered(values: Sequence[float]) -> bool | None:
    """Strictly ascending; None where a value is missing (no request had a second token:
    no gap, so no TBT to order)."""
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return None
    return all(a < b for a, b in itertools.pairwise(values))


def _tied(values: Sequence[float]) -> bool:
    """Any two of the schemes within TIE of each other (not only neighbours: the first and
    the last tied said nothing)."""
    return any(abs(a - b) <= TIE * max(abs(a), abs(b))
               for a, b in itertools.combinations(values, 2))  # fmt: skip
