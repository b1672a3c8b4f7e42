"""Options as data: the model, the run and the workload, each one dataclass.

No typer and no torch here. A command's options objects are what its run's metadata records
(`asdict`), what `reproduce` builds from its own sizes, and what the command line is made
from: benchbatch/app/params.py turns each field into an option, with the help text, help
panel, flag and hidden aliases written in the field's metadata below. So an option is
declared once, with one name, type, default and help group for every command.

Values are checked here, where they enter, with the same rules on every path; a bad value is
a UserError naming the field (the command line names the flag); how a field is declared
and checked is core/optkit.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchbatch.core import checkpoint_config
from benchbatch.core.noise import DEFAULT_CV_THRESHOLD
from benchbatch.core.optkit import (
    BATCHING,
    MODEL,
    OUTPUT,
    RUN,
    WORKLOAD,
    check_count,
    check_number,
    opt,
    require,
)
from benchbatch.core.units import figure
from benchbatch.errors import UserError

# --- the model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelOptions:
    """Which model: a local checkpoint with its weights, or a preset or config.json with
    random weights and any size overridden."""

    model: Path | None = opt(
        None,
        "A local Hugging Face checkpoint folder (config.json and .safetensors weights; Llama, "
        "Mistral, Qwen2, Qwen3): the model you serve, with its weights. Nothing is downloaded.",
        panel=MODEL,
    )
    preset: str | None = opt(
        None,
        "Named model shape (article, cpu-small, tiny, qwen3-0.6b, llama3.2-1b, llama2-7b, "
        "llama3-8b, llama3-70b); other model options override it.",
        panel=MODEL,
    )
    config: Path | None = opt(
        None,
        "A Hugging Face config.json to take the shapes from (no weights are read).",
        panel=MODEL,
    )
    hidden: int | None = opt(None, "Hidden size (model width).", panel=MODEL)
    layers: int | None = opt(None, "Transformer layers.", panel=MODEL)
    heads: int | None = opt(None, "Attention (query) heads.", panel=MODEL)
    kv_heads: int | None = opt(
        None,
        "Key/value heads (grouped-query attention); must divide --heads. Default: --heads.",
        panel=MODEL,
    )
    intermediate: int | None = opt(
        None, "SwiGLU MLP width. Default: 8/3 x hidden rounded up to a multiple of 256.",
        panel=MODEL,
    )  # fmt: skip
    vocab: int | None = opt(None, "Vocabulary size (LM head width).", panel=MODEL)
    max_context: int | None = opt(
        None, "Longest sequence the model accepts (rotary table size).", panel=MODEL
    )

    SIZES = ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab", "max_context")

    def __post_init__(self) -> None:
        for name, value in self.overrides().items():  # also where they would be ignored
            check_count(name, value, 1)
        require(
            self.preset is None or self.config is None,
            "config",
            "give either --preset or --config, not both",
        )
        if self.model is not None:
            checkpoint_config.folder(self.model)  # a missing folder first, not the options
            given = [f"--{k.replace('_', '-')}" for k in self.overrides() if k != "max_context"]
            given += [f"--{k}" for k in ("preset", "config") if getattr(self, k) is not None]
            require(
                not given,
                "model",
                f"a checkpoint is its own shape: {', '.join(given)} cannot change it "
                "(only a smaller --max-context)",
            )

    def overrides(self) -> dict:
        return {k: getattr(self, k) for k in self.SIZES if getattr(self, k) is not None}

    def chosen(self) -> bool:
        """Did the user say which model (rather than leave it to the command's default)?"""
        return any(x is not None for x in (self.model, self.preset, self.config))

    def source(self) -> str:
        """The option(s) that made the model's shape, for errors about its size."""
        if self.model is not None:
            return "--model"
        given = [f"--{k.replace('_', '-')}" for k in self.overrides()]
        return ", ".join(given) or ("--config" if self.config is not None else "--preset")

    def shape(self, default_preset: str = "article"):
        """The ModelConfig: a preset (or the command's default) or a config.json, then sizes."""
        from benchbatch.core import config as configs
        from benchbatch.core import hfconfig

        if self.model is not None:
            return self._checkpoint_shape()
        base = (
            hfconfig.from_hf_config(self.config)
            if self.config
            else configs.preset(self.preset or default_preset)
        )
        changes = self.overrides()
        heads = changes.get("heads")
        mha = base.kv_heads == base.heads  # its KV heads follow the new --heads
        require(
            heads is None or "kv_heads" in changes or mha or heads % base.kv_heads == 0,
            "heads",
            f"{heads} query heads cannot share the {base.name} shape's {base.kv_heads} KV "
            "heads evenly: give --kv-heads too (a divisor of --heads)",
        )
        return base.replace(**changes) if changes else base

    def _checkpoint_shape(self):
        from benchbatch.core import checkpoint_config as checkpoint

        cfg = checkpoint.read_config(self.model)
        if self.max_context is None or self.max_context == cfg.max_context:
            return cfg
        require(
            self.max_context < cfg.max_context,
            "max_context",
            f"{self.max_context:,} is more than the checkpoint's {cfg.max_context:,} positions"
            + (" (its sliding_window: benchbatch runs windowed attention only within it)"
               if cfg.windowed() else ""),
        )
        return cfg.replace(max_context=self.max_context)


@dataclass(frozen=True)
class TimingOptions:
    min_repeats: int = 5
    min_time_s: float = 0.2
    warmup: int = 2
    warmup_s: float = 0.05
    max_repeats: int = 1000
    l2_flush: bool = True
    cv_threshold: float = DEFAULT_CV_THRESHOLD
    retry_noisy: int = 0  # measure a noisy step (or group) again this many times


# --- the run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """Where and how steps are timed, and where the results go."""

    device: str = opt("auto", "auto (CUDA when present), cpu, cuda or cuda:N.", panel=RUN)
    dtype: str | None = opt(
        None,
        "Default fp16 on CUDA, fp32 on CPU (CPUs run fp16 matmuls hundreds of times slower).",
        panel=RUN,
        choices=("fp16", "bf16", "fp32"),
    )
    seed: int = opt(0, "Seed of the random weights, inputs and workload.", panel=RUN)
    repeats: int = opt(
        5, "Minimum timed repeats of each step (more if --min-time is not reached).", panel=RUN
    )
    min_time: float = opt(0.2, "Seconds of timed repeats per step to aim for: this over the "
                          "warm-up's step time is the repeat count (at least --repeats).",
                          panel=RUN)  # fmt: skip
    warmup: int = opt(2, "Untimed calls of each step before its repeats.", panel=RUN)
    threads: int | None = opt(
        None,
        "CPU compute threads (default on a CPU: 1 on a machine of at most 2 cores or whose "
        "load average says the cores are busy, else one per physical core the load leaves "
        "free; the compute thread is pinned and the choice said).",
        panel=RUN,
    )
    tp: int | None = opt(
        None,
        "Tensor-parallel ranks that shard the model (launch with `torchrun --nproc-per-node "
        "N -m benchbatch ...`; default: every rank torchrun started; fewer makes replicas).",
        panel=RUN,
    )
    cuda_graphs: bool = opt(
        True,
        "Replay timed steps from CUDA graphs (CUDA only): launch overhead must not hide the "
        "GPU work.",
        panel=RUN,
        flag="--cuda-graphs/--no-cuda-graphs",
    )
    compile: bool = opt(
        False,
        "Run model steps through torch.compile (inductor; on CUDA with CUDA graphs). Compile "
        "time is reported apart from step time (compile_s); a failure falls back to eager "
        "and says so.",
        panel=RUN,
        flag="--compile/--no-compile",
    )
    roofline: bool = opt(
        True,
        "Measure the device's matmul and memory ceilings first (seconds) and add mfu, mbu and "
        "bound to every row, with roofline.png.",
        panel=RUN,
        flag="--roofline/--no-roofline",
    )
    ceilings: Path | None = opt(
        None,
        "A probe.csv (from `benchbatch probe` or `reproduce`) to place rows on the roofline, "
        "instead of measuring the device's ceilings first.",
        panel=RUN,
    )
    reprobe: bool = opt(
        False,
        "Measure the device's ceilings now, even when a probe of this device and dtype from "
        "the last 24 hours is cached (reused otherwise: the day's commands of as many "
        "threads, one clock and one load level, quiet, busy or saturated, share its roofs).",
        panel=RUN,
    )
    out: Path | None = opt(
        None,
        "Folder for the CSV, plots and metadata. Default: a new results/TIME-COMMAND folder (UTC).",
        panel=OUTPUT,
    )
    force: bool = opt(False, "Allow writing into a non-empty --out folder.", panel=OUTPUT)
    json_out: bool = opt(
        False,
        "Print one JSON document with every row at the end (for scripts).",
        panel=OUTPUT,
        flag="--json",
    )

    MAX_REPEATS = 1000

    def __post_init__(self) -> None:
        check_count("seed", self.seed, 0)
        check_count("repeats", self.repeats, 1, self.MAX_REPEATS)
        check_number("min_time", self.min_time)
        require(self.min_time <= 3600, "min_time", f"must be at most 3600 s, got {self.min_time}")
        check_count("warmup", self.warmup, 0, self.MAX_REPEATS)
        if self.reprobe:  # it would do nothing, unsaid
            require(self.roofline, "reprobe", "measures the roofline's ceilings: it does "
                    "nothing with --no-roofline")  # fmt: skip
            require(self.ceilings is None, "reprobe", "does nothing with --ceilings (the "
                    "ceilings come from that file)")  # fmt: skip
        if self.ceilings is not None:  # the file would win over --no-roofline, unsaid
            require(self.roofline, "ceilings", "places the rows on a roofline: it does "
                    "nothing with --no-roofline")  # fmt: skip
        if self.threads is not None:
            check_count("threads", self.threads, 1, 4096)
        if self.tp is not None:
            check_count("tp", self.tp, 1, 4096)
            from benchbatch.core.ranks import resolve_tp

            resolve_tp(self.tp)  # --tp without torchrun, or beyond its ranks: every rank alike

    def timing(self):
        return TimingOptions(
            min_repeats=self.repeats,
            min_time_s=self.min_time,
            warmup=self.warmup,
            max_repeats=max(self.MAX_REPEATS, self.repeats),
        )

    def graphs(self, target) -> bool:
        """CUDA graphs as they apply: never on a CPU, whatever the flag says."""
        return self.cuda_graphs and target.device.type == "cuda"


# --- the workload ------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadOptions:
    """The requests to serve: lognormal output lengths (the article's), or a trace."""

    requests: int = opt(600, "Requests in the generated workload (vLLM's --num-prompts, "
                        "taken too).", panel=WORKLOAD, aliases=("--num-prompts",))  # fmt: skip
    slots: int = opt(
        32,
        "Sequences served at once (KV-cache slots; vLLM's --max-num-seqs, taken too).",
        panel=BATCHING,
        aliases=("--max-num-seqs",),
    )
    median: float = opt(
        70.0, "Median output length (tokens).", panel=WORKLOAD, flag="--output-median",
        aliases=("--median",),
    )  # fmt: skip
    sigma: float = opt(
        0.9, "Lognormal sigma of the output lengths.", panel=WORKLOAD, flag="--output-sigma",
        aliases=("--sigma",),
    )  # fmt: skip
    max_output: int = opt(2000, "Output lengths are clipped to this (tokens).", panel=WORKLOAD)
    prompt_len: int = opt(
        64,
        "Prompt tokens of a request (with --trace: where prompt_tokens is missing).",
        panel=WORKLOAD,
    )
    long_prompt_fraction: float = opt(
        0.0,
        "Fraction of requests with a long prompt (their prefill makes the stalls).",
        panel=WORKLOAD,
    )
    long_prompt_len: int = opt(1024, "Tokens of a long prompt.", panel=WORKLOAD)
    # Named for its unit: a rate per scheduler step, not serve-sweep's --rates per second
    # (--arrival-rate, the old name, hidden).
    arrival_rate: float | None = opt(
        None,
        "Poisson arrivals, requests per scheduler step (serve-sweep takes --rates in requests "
        "per second instead). Default: every request waits at step 0.",
        panel=WORKLOAD,
        flag="--arrivals-per-step",
        aliases=("--arrival-rate",),
    )
    trace: Path | None = opt(
        None,
        "Replay a CSV trace instead: column output_tokens, optional prompt_tokens and "
        "arrival_step (replaces --requests, --output-median, --output-sigma, --max-output, "
        "--arrivals-per-step, --long-prompt-fraction, --long-prompt-len).",
        panel=WORKLOAD,
    )
    prompts: Path | None = opt(
        None,
        "Real prompts for --engine real with --model: a JSONL file (a prompt or text field) "
        "or one prompt per line, tokenized with the checkpoint's tokenizer.json; request i "
        "gets prompt i (cycling).",
        panel=WORKLOAD,
    )

    # Beyond these a run says nothing new and runs out of memory or time first.
    MAX_REQUESTS = 10_000_000
    MAX_SLOTS = 1_000_000
    MAX_TOKENS = 10_000_000  # one prompt or one output
    MAX_ARRIVAL_SPAN = 10_000_000  # steps over which arrivals may spread

    def __post_init__(self) -> None:
        check_count("requests", self.requests, 1, self.MAX_REQUESTS)
        check_count("slots", self.slots, 1, self.MAX_SLOTS)
        check_number("median", self.median, 0, open_low=True)
        check_number("sigma", self.sigma)
        check_count("max_output", self.max_output, 1, self.MAX_TOKENS)
        check_count("prompt_len", self.prompt_len, 1, self.MAX_TOKENS)
        check_number("long_prompt_fraction", self.long_prompt_fraction)
        require(
            self.long_prompt_fraction <= 1,
            "long_prompt_fraction",
            f"must be at most 1, got {self.long_prompt_fraction:g}",
        )
        check_count("long_prompt_len", self.long_prompt_len, 1, self.MAX_TOKENS)
        if self.arrival_rate is not None:
            self._check_rate(self.arrival_rate)

    def _check_rate(self, rate: float) -> None:
        check_number("arrival_rate", rate, 0, open_low=True)
        span = self.requests / rate
        if self.trace is None and span > self.MAX_ARRIVAL_SPAN:
            raise UserError(
                "arrival_rate",
                f"{rate:g} spreads {self.requests:,} arrivals over about "
                f"{figure(span) if span < 1e12 else f'{span:.0e}'} steps "
                f"(at most {self.MAX_ARRIVAL_SPAN:,}); raise it",
            )

    def draw(self, seed: int = 0):
        """The requests of one run (a Workload: columns that read as a list of Requests):
        the trace when given, else the seeded generator."""
        from benchbatch.core.trace import read_trace_columns, within_limits
        from benchbatch.core.workload import lognormal_columns

        if self.trace is not None:
            requests = read_trace_columns(self.trace, self.prompt_len)
            return within_limits(requests, str(self.trace), self.MAX_REQUESTS, self.MAX_TOKENS,
                                 self.MAX_ARRIVAL_SPAN)  # fmt: skip
        return lognormal_columns(
            self.requests,
            median=self.median,
            sigma=self.sigma,
            max_output=self.max_output,
            prompt_len=self.prompt_len,
            arrival_rate=self.arrival_rate,
            seed=seed,
            long_prompt_fraction=self.long_prompt_fraction,
            long_prompt_len=self.long_prompt_len,
        )
