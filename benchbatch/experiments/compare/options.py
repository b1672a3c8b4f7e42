"""The compare experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.optkit import opt


@dataclass(frozen=True)
class CompareOptions:
    runs: tuple[Path, ...] = opt(
        (),
        "Result folders of one command (phases, sweep, probe, occupancy, serve-sweep or "
        "reproduce), e.g. two GPUs, fp16 and bf16, CUDA graphs on and off; beside "
        "serve-sweep folders also vLLM bench serve's --save-result JSON or GuideLLM's JSON "
        "report, every metric recomputed from their per-request times.",
        argument=True,
        metavar="RUN_DIR",
    )
    label: str | None = opt(
        None, "Comma-separated names of the runs, one per folder. Default: folder names."
    )
