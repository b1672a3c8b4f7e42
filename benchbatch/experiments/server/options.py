"""The serve command's own options, as data (no typer, no torch)."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.optkit import BATCHING, check_count, check_number, opt, require
from benchbatch.experiments.fields import chunk_of, chunk_size_field, token_budget_field

SERVER = "Server"
POLICIES = ("static", "continuous", "chunked")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
MAX_PORT = 65535
MAX_DURATION_S = 30 * 24 * 3600.0


def is_loopback(host: str) -> bool:
    """A loopback name or address (127.0.0.0/8, ::1): the server is for this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerOptions:
    policy: str = opt(
        "continuous",
        "The scheduler: static (a group runs until its longest request ends), continuous "
        "(a freed slot is refilled the next step) or chunked (continuous with chunked prefill "
        "under --max-num-batched-tokens, chunks riding with decodes).",
        panel=BATCHING,
        choices=POLICIES,
    )
    max_num_batched_tokens: int = token_budget_field("with --policy chunked.")
    chunk_size: int | None = chunk_size_field("with --policy chunked")
    host: str = opt(
        "127.0.0.1",
        "Address to listen on: a loopback address or name only (127.0.0.1, ::1, localhost); "
        "the server is for measuring on this machine, not for a network.",
        panel=SERVER,
    )
    port: int = opt(
        8000, "TCP port to listen on; 0 picks a free one (said in `listening on URL`).",
        panel=SERVER,
    )  # fmt: skip
    served_model_name: str | None = opt(
        None,
        "The model's name in /v1/models and the requests' `model` field. Default: the "
        "checkpoint folder's name, else the preset's.",
        panel=SERVER,
    )
    tokenizer: Path | None = opt(
        None,
        "A tokenizer.json (or a folder holding one) for string prompts, /tokenize and the "
        "chunks' text. Default: the --model checkpoint's own, if it has one; without any, "
        "prompts must be token ids and a token's text is its id in angle brackets (<5>).",
        panel=SERVER,
    )
    chat_template: Path | None = opt(
        None,
        "A jinja2 chat template file for /v1/chat/completions (vLLM's --chat-template). "
        "Default: the tokenizer's folder's chat_template.jinja or tokenizer_config.json's "
        "chat_template; without any, chat requests are refused (400).",
        panel=SERVER,
    )
    max_model_len: int | None = opt(
        None,
        "Tokens one request may hold, prompt plus max_tokens (vLLM's --max-model-len): the "
        "KV cache is --slots rows of this many tokens, allocated once. Default: the model's "
        "--max-context.",
        panel=SERVER,
    )
    duration: float | None = opt(
        None,
        "Stop after this many seconds (default: run until Ctrl-C or SIGTERM).",
        panel=SERVER,
    )
    pin: bool = opt(
        True,
        "Pin the model thread to its own cores (as many as --threads, leaving at least one) "
        "and the HTTP loop to the rest, where the platform allows (Linux); said at start.",
        panel=SERVER,
        flag="--pin/--no-pin",
    )

    def __post_init__(self) -> None:
        require(
            is_loopback(self.host),
            "host",
            f"{self.host!r} is not a loopback address: the server listens on this machine "
            "only (127.0.0.1, ::1 or localhost)",
        )
        check_count("port", self.port, 0, MAX_PORT)
        check_count("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.chunk_size is not None:
            check_count("chunk_size", self.chunk_size, 1)
        if self.max_model_len is not None:
            check_count("max_model_len", self.max_model_len, 2)
        if self.duration is not None:
            check_number("duration", self.duration, 0, open_low=True, most=MAX_DURATION_S,
                         unit=" s")  # fmt: skip
            require(math.isfinite(self.duration), "duration", "must be a finite number")
        if self.served_model_name is not None:
            require(bool(self.served_model_name.strip()), "served_model_name", "is empty")

    def settings(self) -> tuple[str, dict]:
        """The scheduler policy and its settings (SchedulerConfig's fields), as serve-sweep
        runs each serving policy."""
        if self.policy == "chunked":
            return "continuous", {
                "chunked_prefill": True,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "chunk_size": chunk_of(self.chunk_size, self.max_num_batched_tokens),
                "mixed": True,
            }
        return self.policy, {}
