"""The reproduce experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.optkit import opt
from benchbatch.experiments.fields import engine_field


@dataclass(frozen=True)
class ReproduceOptions:
    engine: str = engine_field(
        "also run static and continuous batching on the model and time them (CUDA: the "
        "simulated workload; CPU: 128 requests, 32 slots, outputs up to 400 tokens).",
        aliases=("--real=real",),
    )
    real_requests: int | None = opt(None, "Requests of the real engine's run.", hidden=True)
    real_slots: int | None = opt(None, "Slots of the real engine's run.", hidden=True)
    real_max_output: int | None = opt(None, "Longest output of the real run.", hidden=True)
