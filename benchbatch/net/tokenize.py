"""vLLM's POST /tokenize and /detokenize as benchbatch's server answers them (no HTTP here
beyond the error): /tokenize takes a prompt (a string, with the tokenizer's special tokens
unless add_special_tokens is false) or a chat's messages (rendered by the chat template as a
chat completion's are, add_special_tokens false by default), and returns the ids, their
count, the context and, with return_token_strs, each id's token string; /detokenize takes
ids and returns their text, special tokens kept (vLLM decodes with the tokenizer's default,
which keeps them). Fields are read as vLLM's pydantic reads them (net/lax.py)."""

from __future__ import annotations

from benchbatch.net import lax
from benchbatch.net.completions import (
    ApiError,
    Served,
    bool_field,
    chat_prompt_ids,
    check_model,
)


def tokenize(body, served: Served) -> dict:
    """The answer to /tokenize: vLLM's TokenizeResponse (token_strs null unless asked)."""
    if not isinstance(body, dict) or ("prompt" not in body and "messages" not in body):
        raise ApiError(400, "the body must be a JSON object with a prompt or messages",
                       "prompt")  # fmt: skip
    check_model(body, served)
    if "messages" in body:
        ids = chat_prompt_ids(body, served)
    else:
        if served.tokenizer is None:
            raise ApiError(400, "this server has no tokenizer (start it with --tokenizer)",
                           "prompt")  # fmt: skip
        if not isinstance(body["prompt"], str):
            raise ApiError(400, "prompt must be a string", "prompt")
        special = bool_field(body, "add_special_tokens", True)
        ids = tuple(served.tokenizer.encode(body["prompt"], add_special_tokens=special).ids)
    strs = None
    if bool_field(body, "return_token_strs", False):
        strs = [served.tokenizer.id_to_token(i) for i in ids]
    return {"count": len(ids), "max_model_len": served.max_model_len, "tokens": list(ids),
            "token_strs": strs}  # fmt: skip


def detokenize(body, served: Served) -> dict:
    """The answer to /detokenize: {"prompt": the ids' text}. An id the tokenizer does not
    have is refused (a 400 naming tokens), where a tokenizer would leave it out unsaid."""
    if not isinstance(body, dict) or "tokens" not in body:
        raise ApiError(400, "the body must be a JSON object with tokens", "tokens")
    check_model(body, served)
    if served.tokenizer is None:
        raise ApiError(400, "this server has no tokenizer (start it with --tokenizer)",
                       "tokens")  # fmt: skip
    ids = token_ids(body["tokens"])
    size = served.tokenizer.get_vocab_size(with_added_tokens=True)
    past = [i for i in ids if i >= size]
    if past:
        raise ApiError(400, f"token id {past[0]} is out of the tokenizer's vocabulary of "
                       f"{size:,}", "tokens")  # fmt: skip
    return {"prompt": served.tokenizer.decode(ids, skip_special_tokens=False)}


def token_ids(value) -> list[int]:
    """A list of token ids as vLLM's list[int] field (ge=0, lax) takes it: each a whole
    number (5.0, "5" and true too) of at least 0."""
    if not isinstance(value, list):
        raise ApiError(400, f"tokens must be a list of token ids, got {value!r}", "tokens")
    ids = []
    for item in value:
        try:
            number = lax.as_int(item)
        except ValueError:
            number = None
        if number is None or number < 0:
            raise ApiError(400, f"tokens must be token ids (whole numbers of at least 0), got "
                           f"{item!r}", "tokens")  # fmt: skip
        ids.append(number)
    return ids
