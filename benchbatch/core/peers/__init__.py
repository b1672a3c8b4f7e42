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
from collections.abc import Callable, Sequence
from pathlib import Path

from benchbatch.core.peers.base import GUIDELLM, NOTES, REL_TOL, VLLM, PeerRun, agrees
from benchbatch.core.peers.guidellm import guidellm_rows, read_guidellm
from benchbatch.core.peers.vllm import read_vllm, vllm_rows
from benchbatch.core.serving import latency_columns, throughput_columns
from benchbatch.errors import UserError

__all__ = [
    "GUIDELLM",
    "NOTES",
    "REL_TOL",
    "VLLM",
    "PeerRun",
    "agrees",
    "disagreements",
    "read",
    "read_all",
    "read_guidellm",
    "read_vllm",
    "recompute",
    "serve_row",
]

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


def recompute(peer: PeerRun) -> list[dict]:
    """One row per aggregate the peer saved: theirs, ours (benchbatch's definition), ours
    their way (their definition, from the same per-request times) and whether that agrees."""
    rows = vllm_rows(peer) if peer.tool == VLLM else guidellm_rows(peer)
    for row in rows:
        row["agrees"] = agrees(row["theirs"], row["ours_their_way"])
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
