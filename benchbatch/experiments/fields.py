"""Option fields and checks that several experiments share: one name, type, default and
help wherever a concept appears (`decode_batch`, `context`, the token budget, the SLOs,
--engine, --kv-layout and --block-size)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import (
    BATCHING,
    KV,
    check_count,
    check_number,
    flag_of,
    opt,
    require,
)

LENGTH_KINDS = ("fixed", "uniform", "lognormal")  # core/lengths.py's KINDS (no numpy here)


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
        f"{longest} + 1 new token exceeds {cfg.context_limit()}",
    )


def check_lengths(cfg, option: str, lengths: tuple[int, ...]) -> None:
    longest = max(lengths)
    require(
        longest <= cfg.max_context, option, f"{longest} exceeds {cfg.context_limit()}"
    )


DEFAULT_CHUNK = 128


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


def price_per_hour_field():
    """--price-per-hour: the device's hourly price, for the cost per million tokens."""
    return opt(
        None,
        "What the device costs, in USD per hour (a cloud GPU's hourly rate): adds the cost per "
        "million output tokens (price / 3600 x seconds / tokens x 1e6) to the CSV and a line "
        "of them under the table. Default: none (no cost column).",
    )


def check_price_per_hour(price: float | None) -> None:
    if price is not None:
        check_number("price_per_hour", price, 0, open_low=True)


def engine_field(help_real: str, aliases: tuple[str, ...] = (), default: str = "sim") -> Any:
    """--engine, declared alike wherever a command can also run its plan on the model."""
    return opt(
        default,
        f"sim: simulate (fast, no model); real: {help_real}",
        panel=BATCHING,
        choices=("sim", "real"),
        aliases=aliases,
    )


KV_LAYOUTS = ("contiguous", "paged")
MAX_BLOCK_SIZE = 1 << 20


def kv_layout_field(what: str) -> Any:
    """--kv-layout, declared alike wherever the model's KV cache is built."""
    return opt(
        "contiguous",
        f"KV cache of {what}: contiguous (one row per sequence) or paged (blocks of "
        "--block-size tokens in a shared pool, read through a block table per sequence, as "
        "PagedAttention; same tokens, the table read costs a gather per layer).",
        panel=KV,
        choices=KV_LAYOUTS,
    )


def block_size_field() -> Any:
    """--block-size: the KV block in tokens (vLLM's default 16)."""
    return opt(16, "Tokens per KV-cache block (vLLM's default: 16).", panel=KV)


def check_block_size(value: int) -> None:
    check_count("block_size", value, 1, MAX_BLOCK_SIZE)


def check_block_fits(cfg, kv_layout: str, block_size: int) -> None:
    """A paged cache's block no longer than the model's context: a longer one is a pool of
    tokens no sequence reaches, read whole by every gather."""
    require(
        kv_layout != "paged" or block_size <= cfg.max_context,
        "block_size",
        f"{block_size:,} tokens a block is more than --max-context {cfg.max_context:,}",
    )


def ignored_options(model: ModelOptions, run: RunOptions, why: str) -> str | None:
    """The model's and the device's options given to a run that builds no model (a
    simulation on --step-costs, a server measured from outside), in one line: they change
    nothing it does, and metadata.json's options still hold them as typed."""
    given = [f"--{k.replace('_', '-')}" for k in model.overrides()]
    given += [f"--{k}" for k in ("model", "preset", "config") if getattr(model, k) is not None]
    given += ["--dtype"] if run.dtype is not None else []
    given += ["--threads"] if run.threads is not None else []
    given += ["--compile"] if run.compile else []
    given += ["--tp"] if run.tp is not None else []
    if not given:
        return None
    verb = "do not apply" if why.startswith("with --endpoint") else "only apply"
    return f"{', '.join(given)} {verb} {why}; ignored"


# What a --trace replaces: its rows are the requests, their lengths and arrivals.
TRACE_REPLACES = ("requests", "median", "sigma", "max_output", "arrival_rate",
                  "long_prompt_fraction", "long_prompt_len")  # fmt: skip


def ignored_by_trace(workload: WorkloadOptions) -> str | None:
    """The options a --trace replaces that were set off their defaults, in one line (they
    were dropped unsaid)."""
    if workload.trace is None:
        return None
    defaults = {f.name: f.default for f in dataclasses.fields(workload)}
    given = [flag_of(f) for f in dataclasses.fields(workload)
             if f.name in TRACE_REPLACES and getattr(workload, f.name) != defaults[f.name]]
    if not given:
        return None
    return f"{', '.join(given)} ignored: --trace gives the requests, their lengths and arrivals"
