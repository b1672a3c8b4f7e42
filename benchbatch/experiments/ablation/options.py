"""The ablation experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.optkit import BATCHING, check_count, opt, require
from benchbatch.core.units import figure
from benchbatch.errors import UserError
from benchbatch.experiments.fields import (
    SLO,
    SLO_PANEL,
    chunk_of,
    chunk_size_field,
    engine_field,
    step_costs_field,
    token_budget_field,
)

SCHEMES = ("mixed-only", "chunks-only", "both")


# The ablation's own workload: a fifth of the prompts long, arrivals keeping the slots busy.
ABLATION_WORKLOAD = dict(
    requests=40, slots=8, median=40.0, max_output=200, arrival_rate=0.25,
    long_prompt_fraction=0.2,
)  # fmt: skip


@dataclass(frozen=True)
class AblationOptions:
    max_num_batched_tokens: int = token_budget_field(
        "in the chunked schemes. Mixed batching without chunks has no budget: a whole prompt "
        "rides with the decodes, as in the paper."
    )
    chunk_size: int | None = chunk_size_field("in the chunked schemes")
    schemes: tuple[str, ...] = opt(
        SCHEMES,
        "Schemes to run, comma-separated: mixed-only (mixed batching, no chunks), chunks-only "
        "(chunked prefill, prefill and decode steps take turns), both (Sarathi-Serve).",
        panel=BATCHING,
        parse="words",
    )
    engine: str = engine_field(
        "also run every scheme on the model and compare (default model: article on CUDA, "
        "cpu-small on CPU)."
    )
    step_costs: tuple[Path, ...] | None = step_costs_field("instead of timing steps here first.")
    # Held in seconds; typed as serve-sweep's SLOs are (2s, 200ms, or a bare number of
    # milliseconds), the old spelling in seconds kept as the hidden --slo-ttft-s, --slo-tbt-s.
    slo_ttft: float | None = opt(
        None,
        "Time-to-first-token limit: 2s, 500ms, or a bare number of milliseconds (with "
        "--slo-tbt): goodput per scheme, and a search for the largest budgets whose P99s meet "
        "both.",
        panel=SLO_PANEL,
        parse="time_s",
        aliases=("--slo-ttft-s:s",),
    )
    slo_tbt: float | None = opt(
        None,
        "Time-between-tokens limit (with --slo-ttft), same units: every gap between two "
        "tokens of a request (its P99, Sarathi-Serve's TBT), not serve-sweep's --slo-tpot (a "
        "request's mean time per output token).",
        panel=SLO_PANEL,
        parse="time_s",
        aliases=("--slo-tbt-s:s",),
    )

    # Every request's every token gap is a row of tbt.csv, per scheme: 5,000 requests take
    # about 15 s and 1 GiB, so beyond this the ablation runs for hours and out of memory.
    MAX_REQUESTS = 100_000
    MAX_ARRIVAL_SPAN = 1_000_000  # steps: every scheme simulates each one, idle or not

    def __post_init__(self) -> None:
        bad = [s for s in self.schemes if s not in SCHEMES]
        require(
            bool(self.schemes) and not bad,
            "schemes",
            f"unknown scheme {bad[0][:40] if bad else ''!r}; choose from {', '.join(SCHEMES)}",
        )
        object.__setattr__(self, "schemes", tuple(s for s in SCHEMES if s in self.schemes))
        check_count("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.chunk_size is not None:
            check_count("chunk_size", self.chunk_size, 1)
        self._check_slo()

    def _check_slo(self) -> None:
        if self.slo_ttft is None and self.slo_tbt is None:
            return
        missing = "slo_ttft" if self.slo_ttft is None else "slo_tbt"
        require(
            self.slo_ttft is not None and self.slo_tbt is not None,
            missing,
            "SLO mode needs both --slo-ttft and --slo-tbt",
        )
        for name in ("slo_ttft", "slo_tbt"):
            value = getattr(self, name)
            require(value > 0, name, f"must be a positive number of seconds, got {value}")

    @property
    def slo(self) -> SLO | None:
        return None if self.slo_ttft is None else SLO(self.slo_ttft, self.slo_tbt)

    @property
    def chunk(self) -> int:
        """The chunk: --chunk-size, else 128 tokens or the whole budget if that is smaller."""
        return chunk_of(self.chunk_size, self.max_num_batched_tokens)

    def check(self, workload) -> None:
        """The ablation keeps every token gap: its own, smaller bounds on the workload."""
        check_count("requests", workload.requests, 1, self.MAX_REQUESTS)
        rate = workload.arrival_rate
        if (
            workload.trace is None
            and rate is not None
            and workload.requests / rate > (self.MAX_ARRIVAL_SPAN)
        ):
            raise UserError(
                "arrival_rate",
                f"{rate:g} spreads {workload.requests:,} arrivals over about "
                f"{figure(workload.requests / rate)} steps (at most {self.MAX_ARRIVAL_SPAN:,}); "
                "raise it",
            )
