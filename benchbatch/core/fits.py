"""Whether requests fit a model, checked before any engine runs (no torch here): a slot's
cache length (the longest prompt plus the longest output), the model's context, and real
prompts' token ids against its vocabulary. A request that does not fit is a UserError
naming the option that made it."""

from __future__ import annotations

from collections.abc import Sequence

from benchbatch.core.workload import Request, Workload
from benchbatch.errors import UserError


def check_prompt_ids(vocab: int, requests: Sequence[Request]) -> None:
    """A user error if a real prompt holds a token the model has no embedding for (a
    tokenizer from another model)."""
    if isinstance(requests, Workload):
        return  # columns: random prompts, no ids to check
    for r in requests:
        if r.prompt_ids is not None and (max(r.prompt_ids) >= vocab or min(r.prompt_ids) < 0):
            bad = max(r.prompt_ids) if max(r.prompt_ids) >= vocab else min(r.prompt_ids)
            raise UserError(
                "prompts",
                f"prompt {r.id} holds token id {bad}, outside the model's vocabulary of "
                f"{vocab:,}: is the tokenizer the checkpoint's?",
            )


def cache_len(requests: Sequence[Request]) -> int:
    """Tokens a slot must hold: the longest prompt plus the longest output. A padded static
    slot grows for as long as its group runs, which never passes this either."""
    if isinstance(requests, Workload):  # columns: no Request built for each
        return int(requests.prompt_tokens.max()) + int(requests.output_tokens.max())
    return max(r.prompt_tokens for r in requests) + max(r.output_tokens for r in requests)


def check_prompt_fits(max_context: int, requests: Sequence[Request], option: str) -> None:
    """A user error naming `option` if some prompt and its first output token alone do not
    fit the model's rotary table (a longer output is the caller's: refused by check_fits,
    clipped by sweep's memory ceiling)."""
    if isinstance(requests, Workload):
        longest = int(requests.prompt_tokens.max()) if len(requests.prompt_tokens) else 0
    else:
        longest = max((r.prompt_tokens for r in requests), default=0)
    if longest + 1 > max_context:
        raise UserError(
            option,
            f"a {longest:,}-token prompt and its first output token exceed the model's "
            f"--max-context {max_context:,}",
        )


def check_fits(max_context: int, requests: Sequence[Request], *, prompt: str | None = None,
               output: str = "max_output") -> None:  # fmt: skip
    """A user error if some request would outgrow the model's rotary table, naming the option
    that made the length: `prompt` (default: `output`) when a prompt and its first output
    token alone do not fit, else `output`."""
    check_prompt_fits(max_context, requests, prompt or output)
    need = cache_len(requests)
    if need > max_context:
        raise UserError(
            output,
            f"the longest prompt plus the longest output is {need:,} tokens, more than the "
            f"model's --max-context {max_context:,}",
        )


def length_options(workload, requests) -> tuple[str, str]:
    """The options that made the longest prompt of `requests` (drawn from `workload`, a
    WorkloadOptions) and the longest output, for an error about a length: --prompts,
    --trace, --long-prompt-len or --prompt-len; --trace or --max-output."""
    longest = int(Workload.of(requests).prompt_tokens.max())
    prompt = "prompt_len"
    if workload.prompts is not None:  # the prompts' lengths are the file's lines
        prompt = "prompts"
    elif workload.trace is not None:
        prompt = "trace"
    elif workload.long_prompt_fraction > 0 and longest == workload.long_prompt_len:
        prompt = "long_prompt_len"
    return prompt, "trace" if workload.trace is not None else "max_output"
