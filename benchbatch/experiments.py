"""Each experiment's own options, as data (no typer, no torch): what phases, sweep,
occupancy, ablation, piggyback, probe, reproduce and compare measure.

A concept shared by several experiments is one field factory here (`decode_batch`,
`context`), so it has one name, type, default and help everywhere. Checks that need the
model's shape take its config (`check(cfg)`); the rest run as the object is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchbatch.errors import UserError
from benchbatch.options import (
    BATCHING,
    WORKLOAD,
    check_count,
    check_number,
    engine_field,
    opt,
    require,
)

PROBE = "Device ceilings"
SLO_PANEL = "SLO mode"


def decode_batch_field():
    return opt((1, 32), "Decode batch sizes (sequences per step), comma-separated.", parse="ints")


def context_field():
    return opt(
        (512,),
        "Tokens already in each sequence's KV cache when it decodes, comma-separated.",
        parse="ints0",
    )


def check_context(cfg, contexts: tuple[int, ...], option: str = "context") -> None:
    """A decode step at context c holds c + 1 tokens: the model must take them."""
    longest = max(contexts)
    require(
        longest + 1 <= cfg.max_context,
        option,
        f"{longest} + 1 new token exceeds --max-context {cfg.max_context}",
    )


def check_lengths(cfg, option: str, lengths: tuple[int, ...]) -> None:
    longest = max(lengths)
    require(
        longest <= cfg.max_context, option, f"{longest} exceeds --max-context {cfg.max_context}"
    )


# --- phases and sweep ------------------------------------------------------------------------


@dataclass(frozen=True)
class PhasesOptions:
    prefill: tuple[int, ...] = opt(
        (512, 2048), "Prompt lengths to prefill (one sequence each), comma-separated.",
        parse="ints",
    )  # fmt: skip
    decode_batch: tuple[int, ...] = decode_batch_field()
    context: tuple[int, ...] = context_field()

    def check(self, cfg) -> None:
        check_context(cfg, self.context)
        check_lengths(cfg, "prefill", self.prefill)


CPU_BATCHES = (1, 8, 32, 64, 128)
CUDA_BATCHES = (1, 8, 32, 128, 256)


@dataclass(frozen=True)
class SweepOptions:
    batch: tuple[int, ...] | None = opt(
        None,
        "Decode batch sizes (sequences per step), comma-separated. Default: 1,8,32,128,256 "
        "(the article's); 1,8,32,64,128 on a CPU.",
        parse="ints",
    )
    context: tuple[int, ...] = context_field()
    knee_threshold: float = opt(
        0.25,
        "The knee is the first batch whose step time exceeds the smallest batch's by more "
        "than this fraction (0.25: 25%).",
    )
    try_oom: bool = opt(
        False,
        "Also run batches over the predicted memory ceiling (out of memory is recorded as oom; "
        "on a CPU the operating system may kill the process instead).",
    )

    def __post_init__(self) -> None:
        check_number("knee_threshold", self.knee_threshold, 0, open_low=True)

    def batches(self, target) -> tuple[int, ...]:
        if self.batch is not None:
            return self.batch
        return CUDA_BATCHES if target.device.type == "cuda" else CPU_BATCHES

    def check(self, cfg) -> None:
        check_context(cfg, self.context)


# --- the batching experiments ----------------------------------------------------------------


@dataclass(frozen=True)
class OccupancyOptions:
    seeds: int = opt(
        1,
        "Simulate this many seeds (--seed, --seed + 1, ...) and report the spread.",
        panel=WORKLOAD,
    )
    engine: str = engine_field(
        "also run both policies on the model and time them (default model: article on CUDA, "
        "cpu-small on CPU; the model options apply only then)."
    )
    stop_at_eos: bool = opt(
        False,
        "With --engine real and --model: end a request at the model's end-of-sequence token "
        "(--max-output is the cap) and write the lengths that came out to trace_POLICY.csv, "
        "for --trace to replay.",
        panel=BATCHING,
    )

    MAX_SEEDS = 10_000

    def __post_init__(self) -> None:
        check_count("seeds", self.seeds, 1, self.MAX_SEEDS)

    def check(self, workload, model) -> None:
        """Options that need others: a fixed trace has no seeds; real prompts and stopping
        at end-of-sequence need the real engine and a checkpoint."""
        if workload.trace is not None and self.seeds > 1:
            raise UserError("seeds", "a --trace is fixed: there is no seed to vary")
        drawn, most = self.seeds * workload.requests, workload.MAX_REQUESTS
        if drawn > most:  # every seed draws and simulates its own workload
            raise UserError(
                "seeds",
                f"{self.seeds:,} seeds of {workload.requests:,} requests simulate {drawn:,} "
                f"requests, more than the {most:,} a run may (fewer --seeds or --requests)",
            )
        for name, given in (("prompts", workload.prompts is not None),
                            ("stop_at_eos", self.stop_at_eos)):  # fmt: skip
            if given and (self.engine != "real" or model.model is None):
                raise UserError(name, "needs --engine real and --model (a checkpoint)")


SCHEMES = ("mixed-only", "chunks-only", "both")
DEFAULT_CHUNK = 128

# The ablation's own workload: a fifth of the prompts long, arrivals keeping the slots busy.
ABLATION_WORKLOAD = dict(
    requests=40, slots=8, median=40.0, max_output=200, arrival_rate=0.25,
    long_prompt_fraction=0.2,
)  # fmt: skip


@dataclass(frozen=True)
class SLO:
    """Latency limits a request must meet: time to first token and time between tokens."""

    ttft_s: float
    tbt_s: float

    def met(self, m) -> bool:
        """A request (its RequestMetrics) meets the SLOs: its TTFT and its own P99 gap."""
        return m.ttft <= self.ttft_s and m.tbt_p99 <= self.tbt_s


@dataclass(frozen=True)
class AblationOptions:
    max_num_batched_tokens: int = opt(
        256,
        "Tokens per step, decodes and prefill chunks together (vLLM's max_num_batched_tokens), "
        "in the chunked schemes. Mixed batching without chunks has no budget: a whole prompt "
        "rides with the decodes, as in the paper.",
        panel=BATCHING,
    )
    chunk_size: int | None = opt(
        None,
        f"Largest prefill chunk in the chunked schemes. Default: {DEFAULT_CHUNK}, or the "
        "token budget if smaller.",
        panel=BATCHING,
    )
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
    step_costs: tuple[Path, ...] | None = opt(
        None,
        "Fit the step-cost model to these CSVs (phases, sweep, piggyback or an ablation's "
        "step_cost.csv; repeatable) instead of timing steps here first.",
    )
    slo_ttft: float | None = opt(
        None,
        "Time-to-first-token limit in seconds (with --slo-tbt): goodput per scheme, and a "
        "search for the largest budgets whose P99s meet both.",
        panel=SLO_PANEL,
    )
    slo_tbt: float | None = opt(
        None, "Time-between-tokens limit in seconds (with --slo-ttft).", panel=SLO_PANEL
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
        if self.chunk_size is not None:
            return self.chunk_size
        return min(DEFAULT_CHUNK, self.max_num_batched_tokens)

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
                f"{workload.requests / rate:.3g} steps (at most {self.MAX_ARRIVAL_SPAN:,}); "
                "raise it",
            )


@dataclass(frozen=True)
class PiggybackOptions:
    decode_batch: tuple[int, ...] = decode_batch_field()
    context: tuple[int, ...] = context_field()
    piggyback_tokens: tuple[int, ...] = opt(
        (16, 32, 64, 128, 256, 512),
        "Prefill tokens (one prompt's chunk) riding on the decode step, comma-separated; the "
        "decode step alone is measured too.",
        parse="ints",
        aliases=("--prefill",),
    )
    threshold: float = opt(
        0.10,
        "A mixed step within this fraction of the decode-only step (0.1: 10%) counts as "
        "carrying its prefill tokens nearly free.",
    )
    chunk_prompt: int = opt(2048, "Prompt tokens prefilled in chunks for the chunk-size sweep.")
    chunks: tuple[int, ...] = opt(
        (128, 256, 512, 2048),
        "Chunk sizes, comma-separated (one prefill of the whole prompt is added).",
        parse="ints",
    )
    tiles: tuple[int, ...] = opt(
        (256, 257), "Prefill step lengths that show tile effects, comma-separated.", parse="ints"
    )

    def __post_init__(self) -> None:
        check_number("threshold", self.threshold)
        check_count("chunk_prompt", self.chunk_prompt, 1)

    def check(self, cfg) -> None:
        check_context(cfg, self.context)
        check_lengths(cfg, "piggyback_tokens", self.piggyback_tokens)
        check_lengths(cfg, "chunk_prompt", (self.chunk_prompt,))
        check_lengths(cfg, "tiles", self.tiles)


# --- the device, the reproduction, the comparison -------------------------------------------


@dataclass(frozen=True)
class ProbeOptions:
    sizes: tuple[int, ...] | None = opt(
        None,
        "Square matmul sizes n of the ceiling probe, comma-separated. Default: 1024,2048 on a "
        "CPU, 2048,4096,8192 on CUDA.",
        panel=PROBE,
        parse="ints",
        aliases=("--probe-sizes",),
    )
    buffer_mb: int | None = opt(
        None,
        "MiB of each copy/read buffer of the ceiling probe; keep it far above the last-level "
        "cache. Default: 256 on a CPU, 1024 on CUDA.",
        panel=PROBE,
        aliases=("--probe-buffer-mb",),
    )

    def __post_init__(self) -> None:
        if self.buffer_mb is not None:
            check_count("buffer_mb", self.buffer_mb, 1, 2**40)


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


@dataclass(frozen=True)
class CompareOptions:
    runs: tuple[Path, ...] = opt(
        (),
        "Result folders of one command (phases, sweep, probe, occupancy or reproduce), e.g. "
        "two GPUs, fp16 and bf16, CUDA graphs on and off.",
        argument=True,
        metavar="RUN_DIR",
    )
    label: str | None = opt(
        None, "Comma-separated names of the runs, one per folder. Default: folder names."
    )
