"""A request as the live engine (runtime/live.py) serves it: its status and times, why it
finished (OpenAI's finish_reason where it has one), and the refusal of one the engine cannot
take. No torch here: the server (net/) reads these without the model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A request's status, and why it finished (OpenAI's finish_reason where it has one).
WAITING, RUNNING, FINISHED, CANCELLED, ABORTED = (
    "waiting", "running", "finished", "cancelled", "aborted",
)  # fmt: skip
LENGTH, STOP, ABORT = "length", "stop", "abort"

Deliver = Callable[[list[int], "str | None"], None]  # (new tokens, finish reason or None)


class Refused(ValueError):
    """A request the engine cannot take (too long for its cache, a token outside the
    vocabulary, the engine stopping); param: the request field at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


@dataclass(eq=False)
class LiveRequest:
    """One request as the live engine serves it; times in seconds on the engine's clock
    (0: the engine was made), steps as the step log numbers them."""

    id: int
    prompt_ids: tuple[int, ...]
    max_tokens: int
    deliver: Deliver
    stop_tokens: frozenset[int] = frozenset()
    min_tokens: int = 0
    arrival_s: float = 0.0  # submitted (the HTTP handler had parsed it)
    queued_s: float | None = None  # taken off the inbox into the scheduler's queue
    queued_step: int | None = None  # the first step that could run it
    first_token_s: float | None = None
    first_token_step: int | None = None
    finish_s: float | None = None
    finish_step: int | None = None
    output_tokens: int = 0
    status: str = WAITING
    finish_reason: str | None = None

    def stops(self, token: int) -> bool:
        """Whether this token (already counted) ends the request: a stop token after
        min_tokens others, as vLLM's min_tokens (stop tokens held back while fewer than
        min_tokens came: the earliest is token min_tokens + 1)."""
        return token in self.stop_tokens and self.output_tokens > self.min_tokens

    def row(self) -> dict:
        ttft = None if self.first_token_s is None else self.first_token_s - self.arrival_s
        return {
            "id": self.id,
            "prompt_tokens": len(self.prompt_ids),
            "max_tokens": self.max_tokens,
            "output_tokens": self.output_tokens,
            "status": self.status,
            "finish_reason": self.finish_reason,
            "arrival_s": self.arrival_s,
            "queued_s": self.queued_s,
            "first_token_s": self.first_token_s,
            "finish_s": self.finish_s,
            "ttft_s": ttft,
            "e2e_s": None if self.finish_s is None else self.finish_s - self.arrival_s,
            "queued_step": self.queued_step,
            "first_token_step": self.first_token_step,
            "finish_step": self.finish_step,
        }
