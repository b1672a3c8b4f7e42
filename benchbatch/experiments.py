"""Each experiment's own options, as data (no typer, no torch): what phases, sweep,
occupancy, ablation, piggyback, probe, reproduce and compare measure.

A concept shared by several experiments is one field factory here (`decode_batch`,
`context`), so it has one name, type, default and help everywhere. Checks that need the
model's shape take its config (`check(cfg)`); the rest run as the object is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from benchbatch.errors import UserError
from benchbatch.options import (
    BATCHING,
    WORKLOAD,
    WorkloadOptions,
    check_count,
    check_number,
    engine_field,
    opt,
    require,
)

PROBE = "Device ceilings"
LENGTH_KINDS = ("fixed", "uniform", "lognormal")  # engines/lengths.py's KINDS (no numpy here)
INT_MAX_TOKENS = WorkloadOptions.MAX_TOKENS
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


def token_budget_field(where: str):
    """--max-num-batched-tokens: where says which of the command's schemes it limits."""
    return opt(
        256,
        "Tokens per step, decodes and prefill chunks together (vLLM's max_num_batched_tokens), "
        + where,
        panel=BATCHING,
    )


def chunk_size_field(where: str):
    return opt(
        None,
        f"Largest prefill chunk {where}. Default: {DEFAULT_CHUNK}, or the token budget if smaller.",
        panel=BATCHING,
    )


def step_costs_field(instead: str):
    return opt(
        None,
        "Fit the step-cost model to these CSVs (phases, sweep, piggyback or an ablation's "
        f"step_cost.csv; repeatable) instead of {instead}.",
    )


def chunk_of(chunk_size: int | None, budget: int) -> int:
    """The chunk: --chunk-size, else 128 tokens or the whole budget if that is smaller."""
    return chunk_size if chunk_size is not None else min(DEFAULT_CHUNK, budget)


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
    step_costs: tuple[Path, ...] | None = step_costs_field("timing steps here first")
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
            f"unknown scheme {bad[0] if bad else ''!r}; choose from {', '.join(SCHEMES)}",
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
        "Result folders of one command (phases, sweep, probe, occupancy, serve-sweep or "
        "reproduce), e.g. two GPUs, fp16 and bf16, CUDA graphs on and off.",
        argument=True,
        metavar="RUN_DIR",
    )
    label: str | None = opt(
        None, "Comma-separated names of the runs, one per folder. Default: folder names."
    )


# --- the serving curve -------------------------------------------------------------------------

SERVE_PANEL = "Serving curve"
SERVE_POLICIES = ("static", "continuous", "chunked")
MAX_RATE = "max"
# The serving curve's workload on a 2-core CPU with cpu-small (a decode step of 8 sequences
# about 30 ms): 8 slots, short outputs (median 16 tokens, at most 64) so a static group lasts
# about a second and a half, prompts lognormal around 128 tokens (up to 1,024: the long ones
# are what chunked prefill is for).
SERVE_WORKLOAD = dict(requests=500, slots=8, median=16.0, max_output=64, prompt_len=128)
# MLPerf's Llama-2-70B server limits (conversational): TTFT 2 s, TPOT 200 ms. A CPU's TPOT
# sits well under them, so queueing (TTFT) decides where a policy leaves the SLO.
SERVE_SLO = (2.0, 0.2)


def parse_rates(words: tuple[str, ...], option: str) -> tuple[float, ...]:
    """'0.5', '2', 'max' -> (0.5, 2.0, inf), sorted, duplicates dropped: requests per second,
    each finite and positive; 'max' queues every request at once."""
    require(bool(words), option, "give at least one rate (requests per second, or max)")
    rates = {_rate(word, option) for word in words}
    most = ServeOptions.MAX_RATES
    require(len(rates) <= most, option, f"{len(rates)} rates; at most {most}")
    return tuple(sorted(rates))


def _rate(word: str, option: str) -> float:
    if word.lower() == MAX_RATE:
        return math.inf
    shown = word if len(word) <= 40 else word[:40] + "..."
    try:
        rate = float(word)
    except ValueError:
        raise UserError(option, f"{shown!r} is not a rate (requests per second, or max)") from None
    require(
        math.isfinite(rate) and rate > 0,
        option,
        f"a rate must be a positive number of requests per second, got {shown}",
    )
    most = ServeOptions.MAX_RATE_RPS
    require(
        rate <= most,
        option,
        f"{shown} is more than {most:,.0f} requests per second; use max for everything "
        "queued at once",
    )
    return rate


def rate_label(rate: float) -> str:
    return MAX_RATE if math.isinf(rate) else f"{rate:g}"


@dataclass(frozen=True)
class ServeOptions:
    rates: tuple[str, ...] | None = opt(
        None,
        "Request rates in requests per second (Poisson arrivals, seeded), comma-separated; "
        "'max' queues every request at once. Default: the simulated capacity (the best "
        "policy's request throughput at max) times 0.1, 0.2, ... 1.1, and max, so the knee "
        "shows on any device.",
        panel=SERVE_PANEL,
        parse="words",
    )
    policies: tuple[str, ...] = opt(
        SERVE_POLICIES,
        "Policies, comma-separated: static (groups of --slots run to their longest), "
        "continuous (free slots refilled every step, whole prompts), chunked (continuous "
        "with chunked prefill under --max-num-batched-tokens, Sarathi-Serve).",
        panel=BATCHING,
        parse="words",
    )
    engine: str = engine_field(
        "also serve the rates that fit --real-time on the model, arrivals on the wall clock "
        "(default model: article on CUDA, cpu-small on CPU), each beside its simulation.",
        default="real",
    )
    real_rates: tuple[str, ...] | None = opt(
        None,
        "Rates to serve on the real engine. Default: chosen to fit --real-time: first, per "
        "policy, the last rate the simulation keeps within the SLO and the first it does not "
        "(where the real engine must confirm the knee), then the cheapest others.",
        panel=SERVE_PANEL,
        parse="words",
    )
    real_requests: int = opt(
        40,
        "Requests per real-engine point (the first of the simulated workload, same lengths "
        "and arrival times). A point lasts at least this over its rate, so on a CPU they "
        "are few, and their p99s say they are uncertain.",
        panel=SERVE_PANEL,
    )
    real_time: float = opt(
        150.0,
        "Seconds the real engine may take, by the simulation's estimate of each point "
        "(default rates only).",
        panel=SERVE_PANEL,
    )
    slo_ttft: float = opt(
        SERVE_SLO[0],
        "Time-to-first-token limit (s). Default: MLPerf's Llama-2-70B server limit "
        "(conversational).",
        panel=SLO_PANEL,
    )
    slo_tpot: float = opt(
        SERVE_SLO[1],
        "Time-per-output-token limit (s). Goodput counts requests meeting both limits; a "
        "point is within the SLO when its p99 TTFT and p99 TPOT are (MLPerf's server rule).",
        panel=SLO_PANEL,
    )
    step_costs: tuple[Path, ...] | None = step_costs_field(
        "timing steps on the model first (with --engine sim, no model is built)"
    )
    max_num_batched_tokens: int = token_budget_field("in the chunked policy.")
    chunk_size: int | None = chunk_size_field("in the chunked policy")
    output_dist: str = opt(
        "lognormal",
        "Output lengths: fixed (--median each), uniform (integers from --min-output to "
        "--max-output), lognormal (median --median, sigma --sigma, clipped to "
        "[--min-output, --max-output]).",
        panel=WORKLOAD,
        choices=LENGTH_KINDS,
    )
    min_output: int = opt(1, "Shortest output (tokens).", panel=WORKLOAD)
    prompt_dist: str = opt(
        "lognormal",
        "Prompt lengths: fixed (--prompt-len each), uniform (integers from --min-prompt to "
        "--max-prompt), lognormal (median --prompt-len, sigma --prompt-sigma, clipped to "
        "[--min-prompt, --max-prompt]).",
        panel=WORKLOAD,
        choices=LENGTH_KINDS,
    )
    prompt_sigma: float = opt(0.6, "Lognormal sigma of the prompt lengths.", panel=WORKLOAD)
    min_prompt: int = opt(1, "Shortest prompt (tokens).", panel=WORKLOAD)
    max_prompt: int = opt(1024, "Longest prompt (tokens).", panel=WORKLOAD)

    MAX_RATES = 64
    MAX_RATE_RPS = 1e9
    MAX_REAL_REQUESTS = 100_000

    def __post_init__(self) -> None:
        bad = [p for p in self.policies if p not in SERVE_POLICIES]
        require(
            bool(self.policies) and not bad,
            "policies",
            f"unknown policy {bad[0] if bad else ''!r}; choose from {', '.join(SERVE_POLICIES)}",
        )
        object.__setattr__(self, "policies", tuple(p for p in SERVE_POLICIES if p in self.policies))
        for name in ("rates", "real_rates"):
            if getattr(self, name) is not None:
                parse_rates(getattr(self, name), name)
        check_count("real_requests", self.real_requests, 1, self.MAX_REAL_REQUESTS)
        check_number("real_time", self.real_time, 0, open_low=True)
        for name in ("slo_ttft", "slo_tpot"):
            value = getattr(self, name)
            check_number(name, value, 0, open_low=True)
        check_count("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.chunk_size is not None:
            check_count("chunk_size", self.chunk_size, 1)
        check_number("prompt_sigma", self.prompt_sigma)
        for name in ("min_output", "min_prompt", "max_prompt"):
            check_count(name, getattr(self, name), 1, INT_MAX_TOKENS)

    @property
    def rate_values(self) -> tuple[float, ...] | None:
        return None if self.rates is None else parse_rates(self.rates, "rates")

    @property
    def real_rate_values(self) -> tuple[float, ...] | None:
        return None if self.real_rates is None else parse_rates(self.real_rates, "real_rates")

    @property
    def chunk(self) -> int:
        return chunk_of(self.chunk_size, self.max_num_batched_tokens)

    def lengths(self, workload):
        """The prompt and output length distributions, checked against each other."""
        from benchbatch.engines.lengths import LengthDist

        prompt = LengthDist(self.prompt_dist, workload.prompt_len, self.prompt_sigma,
                            self.min_prompt, self.max_prompt, "prompt")  # fmt: skip
        output = LengthDist(self.output_dist, workload.median, workload.sigma,
                            self.min_output, workload.max_output, "output")  # fmt: skip
        prompt.check({"center": "prompt_len", "low": "min_prompt", "high": "max_prompt"})
        output.check({"center": "median", "low": "min_output", "high": "max_output"})
        return prompt, output

    def check(self, workload) -> None:
        """Options that need the workload's: the lengths, and the real engine's requests."""
        self.lengths(workload)
        if self.chunk_size is not None and "chunked" not in self.policies:
            raise UserError("chunk_size", "only applies with the chunked policy")
        if self.engine == "real" and self.real_requests > workload.requests and not workload.trace:
            raise UserError(
                "real_requests",
                f"{self.real_requests:,} is more than the {workload.requests:,} --requests "
                "(the real engine serves the first of them)",
            )
