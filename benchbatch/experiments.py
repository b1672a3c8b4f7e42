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

from benchbatch.engines.kvblocks import blocks_for
from benchbatch.errors import UserError
from benchbatch.options import (
    BATCHING,
    KV,
    WORKLOAD,
    WorkloadOptions,
    block_size_field,
    check_block_size,
    check_count,
    check_number,
    engine_field,
    kv_layout_field,
    opt,
    require,
    strict_float,
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


def step_costs_field(tail: str):
    """--step-costs: measured steps to fit a step-cost model to, for simulated time."""
    return opt(
        None,
        "Fit the step-cost model to these CSVs (phases, sweep, piggyback or an ablation's "
        f"step_cost.csv; repeatable) {tail}",
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
    kv_layout: str = kv_layout_field("the timed steps")
    block_size: int = block_size_field()

    def __post_init__(self) -> None:
        check_block_size(self.block_size)

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
    kv_layout: str = kv_layout_field("the timed steps")
    block_size: int = block_size_field()
    gpu: str | None = opt(
        None,
        "Also give the memory ceiling of the workload's lengths on this GPU's datasheet "
        "memory (h100, a100, l4, rtx 4090, ...): sequences that fit reserved at the maximum "
        "length against paged at the lengths they reach.",
        panel=KV,
    )

    def __post_init__(self) -> None:
        check_number("knee_threshold", self.knee_threshold, 0, open_low=True)
        check_block_size(self.block_size)
        if self.gpu is not None:
            self.datasheet()

    def datasheet(self):
        """The named GPU's datasheet entry (a UserError if unknown or its memory is)."""
        from benchbatch import peaks

        peak = peaks.lookup(self.gpu or "")
        known = [n for n in peaks.names() if peaks.lookup(n).memory_gib]
        require(
            peak is not None and peak.memory_gib is not None,
            "gpu",
            f"no datasheet memory for {self.gpu!r}; known: {', '.join(known)}",
        )
        return peak

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
    kv_memory: float | None = opt(
        None,
        "KV-cache memory in GiB shared by the memory policies (static-reserve and "
        "continuous-reserve: each sequence reserves its prompt + --max-output; "
        "continuous-paged: blocks as sequences grow, preempting when short). Default, "
        "simulated: the slot count's worth (--slots sequences of the longest prompt + "
        "--max-output, so reservation runs --slots at once); with --engine real: what the "
        "device has free beside the weights. Given with --engine real, the memory policies "
        "also run on the model, in a paged cache of this size. A token's KV bytes come from "
        "the model options (simulated: the article's model in --dtype, default fp16).",
        panel=KV,
    )
    block_size: int = block_size_field()
    kv_layout: str = kv_layout_field("the real engine's static and continuous runs")
    step_costs: tuple[Path, ...] | None = step_costs_field(
        "to price the memory policies' steps in seconds (a step of many sequences costs "
        "more than one of few). Default: time in steps."
    )

    MAX_SEEDS = 10_000

    def __post_init__(self) -> None:
        check_count("seeds", self.seeds, 1, self.MAX_SEEDS)
        check_block_size(self.block_size)
        if self.kv_memory is not None:
            check_number("kv_memory", self.kv_memory, 0, open_low=True)

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
        if self.kv_layout != "contiguous" and self.engine != "real":
            raise UserError("kv_layout", "is the real engine's cache: needs --engine real")


def check_kv_budget(gib: float, blocks: int, block_size: int, prompt: int, output: int) -> None:
    """A KV budget must hold one request's prompt, and one whole reservation (the reserving
    policies admit a request only with its maximum output reserved)."""
    held = f"{gib:.4g} GiB holds {blocks:,} blocks of {block_size} tokens"
    need = blocks_for(prompt, block_size)
    require(
        blocks >= need,
        "kv_memory",
        f"{held}, less than one {prompt:,}-token prompt ({need:,} blocks)",
    )
    need = blocks_for(prompt + output, block_size)
    require(
        blocks >= need,
        "kv_memory",
        f"{held}, less than one request reserves: a {prompt:,}-token prompt and {output:,} "
        f"output tokens ({need:,} blocks)",
    )


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
    step_costs: tuple[Path, ...] | None = step_costs_field("instead of timing steps here first.")
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


PROJECTION = "Machine"
DEFAULT_LATENCY_US = 20.0  # per all-reduce: what gpt-fast's A100 numbers imply (16-26 us)


@dataclass(frozen=True)
class ProjectOptions:
    gpu: str = opt(
        "H100 SXM",
        "The GPU to project for, by datasheet name (H200, H100 SXM, H100 NVL, A100 80GB SXM, "
        "L40S, ...: `benchbatch probe` lists them).",
        panel=PROJECTION,
    )
    tp: tuple[int, ...] = opt(
        (1, 2, 4, 8), "Tensor-parallel GPU counts, comma-separated.", parse="ints",
        panel=PROJECTION,
    )  # fmt: skip
    decode_batch: tuple[int, ...] = decode_batch_field()
    context: tuple[int, ...] = context_field()
    dtype: str = opt("bf16", "Weights and KV cache dtype.", choices=("fp16", "bf16", "fp32"))
    nvlink_gbps: float | None = opt(
        None,
        "GPU-to-GPU bandwidth per GPU, both directions together, GB/s (datasheet NVLink: 900 "
        "on H100/H200 SXM, 600 on A100 SXM). Default: the GPU's. The all-reduce's bus "
        "bandwidth is taken as half of it (one direction).",
        panel=PROJECTION,
    )
    busbw: float | None = opt(
        None,
        "All-reduce bus bandwidth in GB/s as nccl-tests (or `torchrun ... benchbatch probe`) "
        "measure it, instead of half of --nvlink-gbps.",
        panel=PROJECTION,
    )
    allreduce_latency_us: float | None = opt(
        None,
        f"Fixed cost of one all-reduce in microseconds (default {DEFAULT_LATENCY_US:g}: what "
        "gpt-fast's published A100 tokens/s at 2-8 GPUs imply; a --ceilings probe.csv from "
        "torchrun gives a measured one).",
        panel=PROJECTION,
    )
    efficiency: float = opt(
        1.0,
        "Fraction of the roofline a decode step reaches (1: the roof itself; gpt-fast's "
        "Llama-2-7B at batch 1 on an A100 reached about 0.69 of its memory bandwidth).",
        panel=PROJECTION,
    )
    ceilings: Path | None = opt(
        None,
        "A probe.csv measured on the GPU in question: its matmul and memory ceilings (and, "
        "measured under torchrun, its all-reduce) replace the datasheet's.",
        panel=PROJECTION,
    )
    memory_gib: float | None = opt(
        None, "Memory per GPU in GiB (default: the datasheet's).", panel=PROJECTION
    )

    def __post_init__(self) -> None:
        check_number("efficiency", self.efficiency, 0, open_low=True)
        require(self.efficiency <= 1, "efficiency", f"must be at most 1, got {self.efficiency}")
        for name in ("nvlink_gbps", "busbw", "memory_gib"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), 0, open_low=True)
        if self.allreduce_latency_us is not None:
            check_number("allreduce_latency_us", self.allreduce_latency_us)
        require(max(self.tp) <= 4096, "tp", f"at most 4,096 GPUs, got {max(self.tp):,}")

    def machine(self):
        """The GPU and its link as the projection prices them, each number's source kept."""
        from benchbatch import peaks
        from benchbatch.projection import Machine

        peak = peaks.lookup(self.gpu)
        if peak is None:
            known = ", ".join(dict.fromkeys(p.name for _, p in peaks.KNOWN))
            raise UserError("gpu", f"unknown GPU {self.gpu!r} (known: {known})")
        require(self.dtype in peak.tflops, "dtype", f"{peak.name} has no {self.dtype} rate")
        sheet = f"datasheet {peak.name}"
        tflops, gbps = peak.tflops[self.dtype], peak.gbps
        sources = {"tflops": sheet, "gbps": sheet}
        link = None
        if self.ceilings is not None:
            tflops, gbps, link = self._measured(sources)
        busbw, latency = self._link(peak, link, sources)
        memory = self.memory_gib or peak.memory_gib
        sources["memory"] = "given" if self.memory_gib else sheet
        return Machine(peak.name, tflops, gbps, memory * 2**30 if memory else None, busbw,
                       latency, self.efficiency, tuple(sources.items()))  # fmt: skip

    def _measured(self, sources: dict):
        from benchbatch.projection import interconnect_from_csv
        from benchbatch.roofline import ceilings_from_csv

        c = ceilings_from_csv(self.ceilings, option="ceilings")
        require(
            c.dtype == self.dtype,
            "ceilings",
            f"{self.ceilings} was measured in {c.dtype}, the projection is {self.dtype}",
        )
        sources["tflops"] = f"measured ({self.ceilings}: {c.tflops_source})"
        sources["gbps"] = f"measured ({self.ceilings}: {c.gbps_source})"
        return c.peak_tflops, c.peak_gbps, interconnect_from_csv(self.ceilings)

    def _link(self, peak, link, sources: dict) -> tuple[float, float]:
        """Bus bandwidth and latency: given, measured (probe.csv), or the datasheet's."""
        latency = self.allreduce_latency_us
        sources["latency"] = "given"
        if latency is None and link is not None:
            latency, sources["latency"] = link.latency_us, link.source
        if latency is None:
            latency, sources["latency"] = DEFAULT_LATENCY_US, "assumed (gpt-fast's A100s)"
        if self.busbw is not None:
            sources["busbw"] = "given"
            return self.busbw, latency
        if link is not None:
            sources["busbw"] = link.source
            return link.busbw_gbps, latency
        nvlink = self.nvlink_gbps or peak.nvlink_gbps
        if nvlink is None:
            raise UserError(
                "nvlink_gbps",
                f"{peak.name} has no NVLink figure in benchbatch's table (PCIe?); give "
                "--nvlink-gbps or --busbw",
            )
        where = "given" if self.nvlink_gbps else f"datasheet {peak.name}"
        sources["busbw"] = f"half of {nvlink:g} GB/s NVLink per GPU, both ways ({where})"
        return nvlink / 2, latency


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
        rate = strict_float(word)
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
        "instead of timing steps on the model first (with --engine sim, no model is built)."
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
