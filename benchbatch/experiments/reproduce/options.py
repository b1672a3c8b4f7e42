"""The reproduce experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from benchbatch.core.optkit import check_count, opt
from benchbatch.experiments.fields import INT_MAX_TOKENS, engine_field

# The real engine's workload on a CPU (--engine real): 128 requests on 32 slots, outputs up
# to 400 tokens, about two minutes on 2 cores with cpu-small (and the calibration after).
CPU_REAL = dict(requests=128, slots=32, max_output=400)


@dataclass(frozen=True)
class ReproduceOptions:
    engine: str = engine_field(
        "also run static and continuous batching on the model and time them (CUDA: the "
        "simulated workload; CPU: 128 requests, 32 slots, outputs up to 400 tokens).",
        aliases=("--real=real",),
    )
    real_requests: int | None = opt(
        None, "Requests of --engine real's run (default: the simulated workload's on CUDA, "
        f"{CPU_REAL['requests']} on a CPU).",
    )  # fmt: skip
    real_slots: int | None = opt(
        None, "Slots of --engine real's run (default: --slots on CUDA, "
        f"{CPU_REAL['slots']} on a CPU).",
    )  # fmt: skip
    real_max_output: int | None = opt(
        None, "Longest output of --engine real's run, tokens (default: --max-output on CUDA, "
        f"{CPU_REAL['max_output']} on a CPU).",
    )  # fmt: skip

    def __post_init__(self) -> None:
        # checked wherever given, --engine real or not (as the model's options are)
        for name in ("real_requests", "real_slots", "real_max_output"):
            if getattr(self, name) is not None:
                check_count(name, getattr(self, name), 1, INT_MAX_TOKENS)
