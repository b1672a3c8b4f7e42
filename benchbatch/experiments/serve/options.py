"""The serve experiment's own options, as data (no typer, no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.optkit import BATCHING, WORKLOAD, check_count, check_number, opt, require
from benchbatch.errors import UserError
from benchbatch.experiments.fields import (
    INT_MAX_TOKENS,
    LENGTH_KINDS,
    check_price_per_hour,
    chunk_of,
    chunk_size_field,
    engine_field,
    price_per_hour_field,
    step_costs_field,
    token_budget_field,
)
from benchbatch.experiments.serve.rates import (
    MAX_RATE_RPS,
    MAX_RATES,
    MIN_RATE_RPS,
    parse_caps,
    parse_rates,
    parse_server_kv,
)
from benchbatch.net.waits import PRIORITIES

SERVE_PANEL = "Serving curve"
ENDPOINT_PANEL = "A running server (--endpoint)"


SERVE_POLICIES = ("static", "continuous", "chunked")


# The serving curve's workload on a 2-core CPU with cpu-small (a decode step of 8 sequences
# about 30 ms): 8 slots, short outputs (median 16 tokens, at most 64) so a static group lasts
# about a second and a half, prompts lognormal around 128 tokens (up to 1,024: the long ones
# are what chunked prefill is for).
SERVE_WORKLOAD = dict(requests=500, slots=8, median=16.0, max_output=64, prompt_len=128)


# MLPerf's Llama-2-70B server limits (conversational): TTFT 2 s, TPOT 200 ms. A CPU's TPOT
# sits well under them, so queueing (TTFT) decides where a policy leaves the SLO.
SERVE_SLO = (2.0, 0.2)


@dataclass(frozen=True)
class ServeOptions:
    rates: tuple[str, ...] | None = opt(
        None,
        "Request rates in requests per second (Poisson arrivals, seeded; --burstiness), "
        "comma-separated; "
        "'max' queues every request at once (vLLM's --request-rate inf; --request-rate is "
        "taken too). Default: the simulated capacity (the best policy's request throughput "
        "at max) times 0.1, 0.2, ... 1.1, and max, so the knee shows on any device.",
        panel=SERVE_PANEL,
        parse="words",
        aliases=("--request-rate",),
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
    endpoint: str | None = opt(
        None,
        "Measure a running OpenAI-compatible server instead (vLLM, SGLang, TGI, benchbatch "
        "serve): its base URL, e.g. http://127.0.0.1:8000. Each rate's --real-requests are "
        "streamed to /v1/completions at their arrival times on the wall clock; a URL ending "
        "in /v1/chat/completions sends each prompt as one user message of text there "
        "instead (the server's chat template adds tokens: requests.csv's "
        "server_prompt_tokens). No model is built here and nothing is simulated unless "
        "--step-costs is given. Credentials in the URL are never recorded.",
        panel=ENDPOINT_PANEL,
        metavar="URL",
    )
    served_model: str | None = opt(
        None,
        "With --endpoint: the model name to ask for (vLLM's --served-model-name). Default: "
        "the first the server lists at /v1/models.",
        panel=ENDPOINT_PANEL,
        metavar="NAME",
    )
    max_concurrency: tuple[str, ...] | None = opt(
        None,
        "The client keeps at most this many requests in flight (--endpoint's, the "
        "simulation's and the real engine's alike); later arrivals wait for a free one, and, "
        "as in vLLM's bench serve, their latencies count from when each is sent. Several, "
        "comma-separated (1,4,16): a concurrency sweep, each cap a point at one rate "
        "(--rates, default max: every request queued and that many kept in flight, "
        "GuideLLM's concurrent profile), drawn against the cap. Default: no cap.",
        panel=SERVE_PANEL,
        parse="words",
        metavar="N",
    )
    client_priority: str = opt(
        "auto",
        "With --endpoint: the client's streaming thread at real-time priority (Linux "
        "SCHED_FIFO; root or CAP_SYS_NICE) reads each chunk as it arrives even where other "
        "processes keep every core busy (else it may stamp late: serve.csv's "
        "client_wait_share): realtime (refused in one line where not allowed), normal, or "
        "auto (realtime where allowed, else normal, said).",
        panel=ENDPOINT_PANEL,
        choices=PRIORITIES,
        metavar="NAME",
    )
    request_timeout: float = opt(
        300.0,
        "With --endpoint: seconds a request's whole stream may take; past it the request is "
        "counted as timed out (its own column), never waited on.",
        panel=ENDPOINT_PANEL,
    )
    tokenizer: Path | None = opt(
        None,
        "With --endpoint: a tokenizer.json (or its folder) to build text prompts of exact "
        "token lengths. Default: the server's /tokenize where it has one, else prompts as "
        "token ids (which vLLM and benchbatch serve accept).",
        panel=ENDPOINT_PANEL,
    )
    predict: bool = opt(
        False,
        "With --endpoint: calibrate the server first (single requests at a few prompt "
        "lengths, steady decodes at 1, 2, 4, ... --slots requests; seconds to a minute or "
        "two), then predict every point with those costs and the server's scheduler as "
        "--slots (its max_num_seqs), --max-num-batched-tokens and --server-scheduler say, "
        "beside the measurement (prediction.csv/png, a verdict). The calibration is saved "
        "(step_cost.json) for --step-costs.",
        panel=ENDPOINT_PANEL,
    )
    server_scheduler: str = opt(
        "chunked",
        "With --predict, or --step-costs from an endpoint: the server's scheduler as "
        "predicted: chunked (chunked prefill under --max-num-batched-tokens, decodes first: "
        "vLLM V1's default) or continuous (whole prompts, vLLM's "
        "--no-enable-chunked-prefill).",
        panel=ENDPOINT_PANEL,
        choices=("chunked", "continuous"),
        metavar="NAME",
    )
    server_kv: str | None = opt(
        None,
        "With --predict, or --step-costs from an endpoint: the server's KV pool as BLOCKS or "
        "BLOCKSxTOKENS (512x128: 512 blocks of 128 tokens; vLLM's num_gpu_blocks and "
        "--block-size); a request that finds no block free preempts the newest running one, "
        "as vLLM's does. Default: what the server's /metrics says (vLLM's cache_config_info); "
        "a server that says nothing is predicted with KV for every running sequence.",
        panel=ENDPOINT_PANEL,
        metavar="POOL",
    )
    real_rates: tuple[str, ...] | None = opt(
        None,
        "Rates to serve on the real engine. Default: chosen to fit --real-time: first, per "
        "policy, the last rate the simulation keeps within the SLO and the first it does not "
        "(where the real engine must confirm the knee), then the highest rate it keeps up "
        "with even with every step 10% dearer (a point below saturation for the "
        "prediction's verdict, off the edge where a few percent of step cost decide), then "
        "the cheapest others.",
        panel=SERVE_PANEL,
        parse="words",
    )
    real_requests: int = opt(
        40,
        "Requests per real-engine or --endpoint point (the first of the simulated "
        "workload, same lengths and arrival times). A point lasts at least this over its "
        "rate, so on a CPU they are few, and their p99s say they are uncertain.",
        panel=SERVE_PANEL,
    )
    real_time: float = opt(
        150.0,
        "Seconds the real engine may take, by the simulation's estimate of each point "
        "(default rates only); with --endpoint, the seconds its default rates may take "
        "after the max point that finds its capacity.",
        panel=SERVE_PANEL,
    )
    burstiness: float = opt(
        1.0,
        "Arrivals' burstiness (vLLM's bench serve --burstiness): the gaps between requests "
        "are gamma-distributed with this shape and mean 1/rate: 1 is Poisson, 0.25 comes in "
        "bursts and lulls (gaps varying twice as much), 4 more evenly spaced (0.01 to 100).",
        panel=SERVE_PANEL,
    )
    # The SLOs are held in seconds; typed with a unit (2s, 200ms, 500us) or as a bare number
    # of milliseconds (vLLM's --goodput ttft:200). The old spelling in seconds stays as the
    # hidden --slo-ttft-s and --slo-tpot-s.
    slo_ttft: float = opt(
        SERVE_SLO[0],
        "Time-to-first-token limit: 2s, 200ms, or a bare number of milliseconds (as vLLM). "
        "Default: MLPerf's Llama-2-70B server limit (conversational).",
        panel=SERVE_PANEL,
        parse="time_s",
        aliases=("--slo-ttft-s:s",),
    )
    slo_tpot: float = opt(
        SERVE_SLO[1],
        "Time-per-output-token limit: 200ms, 0.2s, or a bare number of milliseconds. Goodput "
        "counts requests meeting both limits; a point is within the SLO when its p99 TTFT and "
        "p99 TPOT are (MLPerf's server rule).",
        panel=SERVE_PANEL,
        parse="time_s",
        aliases=("--slo-tpot-s:s",),
    )
    step_costs: tuple[Path, ...] | None = step_costs_field(
        "instead of timing steps on the model first (with --engine sim, no model is built)."
    )
    max_num_batched_tokens: int = token_budget_field("in the chunked policy.")
    chunk_size: int | None = chunk_size_field("in the chunked policy")
    output_dist: str = opt(
        "lognormal",
        "Output lengths: fixed (--output-median each), uniform (integers from --min-output to "
        "--max-output), lognormal (median --output-median, sigma --output-sigma, clipped to "
        "[--min-output, --max-output]).",
        panel=WORKLOAD,
        choices=LENGTH_KINDS,
        metavar="KIND",
    )
    min_output: int = opt(1, "Shortest output (tokens).", panel=WORKLOAD)
    prompt_dist: str = opt(
        "lognormal",
        "Prompt lengths: fixed (--prompt-len each), uniform (integers from --min-prompt to "
        "--max-prompt), lognormal (median --prompt-len, sigma --prompt-sigma, clipped to "
        "[--min-prompt, --max-prompt]).",
        panel=WORKLOAD,
        choices=LENGTH_KINDS,
        metavar="KIND",
    )
    prompt_sigma: float = opt(0.6, "Lognormal sigma of the prompt lengths.", panel=WORKLOAD)
    min_prompt: int = opt(1, "Shortest prompt (tokens).", panel=WORKLOAD)
    max_prompt: int = opt(1024, "Longest prompt (tokens).", panel=WORKLOAD)
    price_per_hour: float | None = price_per_hour_field()

    MAX_RATES = MAX_RATES
    MAX_RATE_RPS = MAX_RATE_RPS
    # The least rate: below it the arrival times leave a float's range (1e-320 is subnormal:
    # 1/rate is infinite) long before they mean anything.
    MIN_RATE_RPS = MIN_RATE_RPS
    MAX_REAL_REQUESTS = 100_000
    MAX_TIMEOUT_S = 86_400.0
    # The simulated sweep's work, bounded before it runs (work_checks.check_work): every point
    # (policy, rate) steps its scheduler through every output token (a step at least one)
    # and each prefill, and keeps a requests.csv row per request (a request costs about as
    # much as 5 steps, a step about 25 us here). The default sweep of 500 requests is about
    # 500,000; 3,000 requests (2.9M) took 35 s on a loaded 2-core machine.
    MAX_SIM_WORK = 5_000_000
    REQUEST_WORK = 5

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
        if self.real_rates is not None and self.engine == "sim" and self.endpoint is None:
            raise UserError("real_rates", "only applies with --engine real (a simulated sweep "
                            "serves no rate on the model)")  # fmt: skip
        check_count("real_requests", self.real_requests, 1, self.MAX_REAL_REQUESTS)
        check_price_per_hour(self.price_per_hour)
        self._check_endpoint()
        check_number("real_time", self.real_time, 0, open_low=True)
        check_number("burstiness", self.burstiness, 0.01, most=100)
        for name in ("slo_ttft", "slo_tpot"):
            value = getattr(self, name)
            check_number(name, value, 0, open_low=True)
        check_count("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.chunk_size is not None:
            check_count("chunk_size", self.chunk_size, 1)
        check_number("prompt_sigma", self.prompt_sigma)
        for name in ("min_output", "min_prompt", "max_prompt"):
            check_count(name, getattr(self, name), 1, INT_MAX_TOKENS)

    def _check_endpoint(self) -> None:
        check_number("request_timeout", self.request_timeout, 0, open_low=True)
        require(
            self.request_timeout <= self.MAX_TIMEOUT_S,
            "request_timeout",
            f"{self.request_timeout:g} s is more than a day; a stream that long is a hang",
        )
        if self.server_kv is not None:
            require(
                self.endpoint is not None and bool(self.predict or self.step_costs),
                "server_kv",
                "only applies with --endpoint and --predict or --step-costs",
            )
            self.server_kv_value  # noqa: B018 (checked as it is read)
        caps = self.caps  # checked as they are read
        if len(caps) > 1 and self.rates is not None:
            require(
                len(parse_rates(self.rates, "rates")) == 1,
                "max_concurrency",
                f"{len(caps)} caps sweep the concurrency at one rate; give one --rates (or "
                "none: max), or one cap",
            )
        if len(caps) > 1 and self.real_rates is not None and self.endpoint is None:
            raise UserError(
                "real_rates",
                f"{len(caps)} --max-concurrency caps sweep the concurrency at one rate, and "
                "the real engine serves the caps that fit --real-time at that rate: give one "
                "--rates (or none: max) instead",
            )
        if self.endpoint is None:
            for name in ("served_model", "tokenizer"):
                if getattr(self, name) is not None:
                    raise UserError(name, "only applies with --endpoint")
            if self.client_priority != "auto":
                raise UserError("client_priority", "only applies with --endpoint")
            if self.predict:
                raise UserError("predict", "only applies with --endpoint (a running server)")
            return
        if self.predict and self.step_costs:
            raise UserError(
                "predict",
                "give one of --predict (calibrate the server now) and --step-costs (reuse a "
                "calibration)",
            )
        from benchbatch.net.endpoint import check_url

        check_url(self.endpoint, "endpoint")
        if self.tokenizer is not None:  # before the workload is drawn and warned about
            file = self.tokenizer / "tokenizer.json" if self.tokenizer.is_dir() else self.tokenizer
            require(file.is_file(), "tokenizer",
                    f"{file} is not a file (a tokenizer.json or a folder with one)")  # fmt: skip
        if self.served_model is not None:
            require(bool(self.served_model.strip()), "served_model", "give a model name")
        if self.real_rates is not None:
            raise UserError("real_rates", "does not apply with --endpoint: give --rates")

    @property
    def server_kv_value(self) -> tuple[int | None, int | None]:
        """--server-kv as (blocks, block size); None for what it does not give."""
        if self.server_kv is None:
            return None, None
        return parse_server_kv(self.server_kv, INT_MAX_TOKENS)

    @property
    def caps(self) -> tuple[int | None, ...]:
        """--max-concurrency's caps, ascending, duplicates dropped; (None,): no cap."""
        if self.max_concurrency is None:
            return (None,)
        return parse_caps(self.max_concurrency, "max_concurrency", self.MAX_REAL_REQUESTS)

    @property
    def concurrency_sweep(self) -> bool:
        """Several --max-concurrency caps: each a point, at one rate."""
        return len(self.caps) > 1

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
        from benchbatch.core.lengths import LengthDist

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
