"""A completions stream's server-sent events applied to the client's record of its request
(core/streamed.Streamed): net/client.py reads the lines off the response and stamps them;
this reads what each event says (OpenAI's /v1/completions and /v1/chat/completions streams:
chunks with choices, a usage chunk, [DONE], or an error).

A chat stream opens with a chunk that only names the role (delta {"role": "assistant",
"content": ""}): vLLM sends it when the first token is ready, just before that token's own
chunk, and it carries no token, so it is not counted as one. vLLM's bench serve counts it:
its TTFT is that chunk's (the token's follows within the same write), and its ITL has one
gap of about nothing more per request than the tokens have."""

from __future__ import annotations

import json

from benchbatch.core.streamed import Streamed, error_line
from benchbatch.net.endpoint import body_message

# Finish reasons of a stream the server cut short (vLLM's FinishReason: abort, aborted by
# the server or its client; error, a request-level failure): the request failed, though the
# stream ended in [DONE]. vLLM's bench serve does not look; a stopped server's truncated
# outputs would then count as served, and within the SLO.
CUT_SHORT = ("abort", "error")


class Broke(Exception):
    """A stream that broke: stopped early, a malformed or error chunk."""


def apply_event(rec: Streamed, data: str, stamp: float) -> bool:
    """Apply one event (its data lines joined) to the record, read at `stamp`: a chunk with
    choices is a token chunk (its time kept, its text and finish reason), a usage chunk the
    server's counts; True at [DONE]. Broke for a [DONE] before any chunk, a malformed or
    non-object chunk, an error sent mid-stream, or a stream the server cut short (CUT_SHORT).
    """
    if data.strip() == "[DONE]":
        if not rec.chunk_s:
            raise Broke("[DONE] before any chunk with choices")
        if rec.finish_reason in CUT_SHORT:  # a whole stream, but not the output asked for
            raise Broke(f"the server ended the request with finish_reason "
                        f"{rec.finish_reason!r} after {len(rec.chunk_s)} chunks")  # fmt: skip
        return True
    try:
        chunk = json.loads(data)
    except ValueError:
        raise Broke(
            f"a malformed chunk after {len(rec.chunk_s)}: {error_line(data, 80)!r}"
        ) from None
    if not isinstance(chunk, dict):
        raise Broke(f"a chunk that is no JSON object: {error_line(data, 80)!r}")
    if chunk.get("error") or chunk.get("object") == "error":
        raise Broke(f"the server sent an error mid-stream: {body_message(data)}")
    choices = chunk.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise Broke(f"a chunk whose choices is no list: {error_line(data, 80)!r}")
    if choices:
        first = choices[0] if isinstance(choices[0], dict) else {}
        delta = first.get("delta")
        if isinstance(delta, dict):  # a chat chunk
            if role_only(delta, first):
                return False
            text = delta.get("content")
        else:
            text = first.get("text")
        rec.chunk_s.append(stamp)
        rec.text += text if isinstance(text, str) else ""
        rec.finish_reason = first.get("finish_reason") or rec.finish_reason
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        if _count(usage.get("completion_tokens")):
            rec.output_tokens = usage["completion_tokens"]
        if _count(usage.get("prompt_tokens")):
            rec.server_prompt_tokens = usage["prompt_tokens"]
    return False


def role_only(delta: dict, choice: dict) -> bool:
    """A chat chunk that names the role and carries nothing else: no text (content absent,
    null or empty), no other delta field (reasoning, tool calls), no finish reason."""
    rest = {k: v for k, v in delta.items() if k not in ("role", "content") and v}
    return (
        "role" in delta
        and not delta.get("content")
        and not rest
        and not choice.get("finish_reason")
    )


def _count(value) -> bool:
    """A usage count: an int, not a bool (JSON's true is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)
