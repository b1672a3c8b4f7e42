"""A completions stream's server-sent events applied to the client's record of its request
(core/streamed.Streamed): net/client.py reads the lines off the response and stamps them;
this reads what each event says (OpenAI's /v1/completions stream: chunks with choices, a
usage chunk, [DONE], or an error)."""

from __future__ import annotations

import json

from benchbatch.core.streamed import Streamed, error_line
from benchbatch.net.endpoint import body_message


class Broke(Exception):
    """A stream that broke: stopped early, a malformed or error chunk."""


def apply_event(rec: Streamed, data: str, stamp: float) -> bool:
    """Apply one event (its data lines joined) to the record, read at `stamp`: a chunk with
    choices is a token chunk (its time kept, its text and finish reason), a usage chunk the
    server's counts; True at [DONE]. Broke for a [DONE] before any chunk, a malformed or
    non-object chunk, or an error sent mid-stream."""
    if data.strip() == "[DONE]":
        if not rec.chunk_s:
            raise Broke("[DONE] before any chunk with choices")
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
    if choices:
        rec.chunk_s.append(stamp)
        first = choices[0] if isinstance(choices[0], dict) else {}
        text = first.get("text")
        rec.text += text if isinstance(text, str) else ""
        rec.finish_reason = first.get("finish_reason") or rec.finish_reason
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("completion_tokens"), int):
            rec.output_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            rec.server_prompt_tokens = usage["prompt_tokens"]
    return False
