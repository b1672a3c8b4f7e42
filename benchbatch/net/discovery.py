"""What an OpenAI-compatible server says about itself before a run: the models it serves,
the headers and GET /version that name it, whether POST /tokenize answers, its /metrics,
and which of the length fields (LENGTH_FIELDS) it accepts, probed by one-token requests.
Every failure is one line (UserError("endpoint")), never a traceback or a hang."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

import aiohttp

from benchbatch.core.streamed import error_line
from benchbatch.errors import UserError
from benchbatch.net import metrics
from benchbatch.net.endpoint import (
    Endpoint,
    check_url,
    completion_payload,
    error_message,
    failure_reason,
    run_in_thread,
)

# The fields that make output lengths follow the workload (vLLM, SGLang): sent where the
# server accepts them (probed once, with a one-token request, before the run's clock starts).
LENGTH_FIELDS = ("ignore_eos", "min_tokens")
INFO_TIMEOUT_S = 30.0  # GET /v1/models and the other look-ups before a run


def server_info(endpoint: Endpoint, probe_fields: bool = True) -> dict:
    """What metadata records about the server: GET /v1/models (the served ids), the model
    chosen (UserError("served_model") when the name given is not served), the response
    headers that name the server and its version, GET /version where there is one (vLLM),
    whether POST /tokenize answers (vLLM's), and with probe_fields which of LENGTH_FIELDS
    the server accepts (one-token requests: a text, then token ids if the text is refused).
    No answer, a refused connection, an error status or an answer that is no model list:
    UserError("endpoint"), one line."""
    return run_in_thread(lambda: _server_info(endpoint, probe_fields))


async def _server_info(endpoint: Endpoint, probe_fields: bool) -> dict:
    timeout = aiohttp.ClientTimeout(total=min(endpoint.timeout_s, INFO_TIMEOUT_S))
    async with aiohttp.ClientSession(timeout=timeout, headers=endpoint.headers()) as session:
        status, body, headers = await _get(session, endpoint, "/v1/models")
        ids = _model_ids(endpoint, body)
        model = endpoint.model or ids[0]
        if model not in ids:
            raise UserError(
                "served_model",
                f"{model!r} is not served by {endpoint.public}: it serves {', '.join(ids)}",
            )
        entry = _model_entry(body, model)
        info = {
            "url": endpoint.public,
            "models": ids,
            "served_model": model,
            # vLLM's and benchbatch serve's /v1/models say the longest sequence; no OpenAI
            # server says its vocabulary size unless its entry carries a "vocab_size"
            "max_model_len": _whole(entry.get("max_model_len")),
            "vocab": _whole(entry.get("vocab_size")),
            "headers": version_headers(headers),
            "version": await _version(session, endpoint),
            "tokenize": await has_tokenize(session, endpoint, model),
            "metrics": await metrics.read(session, endpoint.api("/metrics")),
        }
        if probe_fields:  # a text, then token ids (for a server without a tokenizer)
            for prompt in ("Hello",) if endpoint.chat else ("Hello", [1]):
                try:
                    found = await probe_length_fields(session, endpoint, model, prompt)
                except NoAnswer:  # every request would wait out its timeout: nothing to time
                    raise UserError(
                        "endpoint",
                        f"{endpoint.public}: a one-token completion got no answer within "
                        f"--request-timeout {endpoint.timeout_s:g} s (the server takes "
                        "requests but does not answer them)",
                    ) from None
                if found["length_probe"] == "served":
                    break
            info |= found
        return info


async def _get(session, endpoint: Endpoint, path: str) -> tuple[int, str, Mapping[str, str]]:
    where = f"GET {endpoint.public.rstrip('/')}{path}"
    try:
        async with session.get(endpoint.api(path)) as resp:
            body = await resp.text(errors="replace")
            if resp.status != 200:
                raise UserError("endpoint", f"{where}: {error_message(resp.status, body)}")
            return resp.status, body, resp.headers
    except aiohttp.ClientConnectorError as e:
        raise UserError("endpoint", f"{where}: cannot connect ({failure_reason(e)})") from None
    except asyncio.TimeoutError:
        raise UserError(
            "endpoint", f"{where}: no answer within {session.timeout.total:g} s"
        ) from None
    except aiohttp.ClientError as e:
        raise UserError("endpoint", f"{where}: {failure_reason(e)}") from None


def _model_ids(endpoint: Endpoint, body: str) -> list[str]:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    models = data.get("data") if isinstance(data, dict) else None
    ids = [m["id"] for m in models or () if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not isinstance(models, list) or not ids:
        raise UserError(
            "endpoint",
            f"{endpoint.public}/v1/models gave no OpenAI model list "
            f"(not an OpenAI-compatible server?): {error_line(body, 80)!r}",
        )
    return ids


async def served_model(session, endpoint: Endpoint) -> str:
    """The first model of GET /v1/models (UserError("endpoint") when there is none)."""
    _, body, _ = await _get(session, endpoint, "/v1/models")
    return _model_ids(endpoint, body)[0]


def _model_entry(body: str, model: str) -> dict:
    entries = [m for m in json.loads(body)["data"] if isinstance(m, dict) and m.get("id") == model]
    return entries[0] if entries else {}


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def server_metrics(endpoint: Endpoint) -> dict:
    """GET /metrics now (net/metrics.parse); {} where the server has no such page."""

    async def get() -> dict:
        timeout = aiohttp.ClientTimeout(total=min(endpoint.timeout_s, INFO_TIMEOUT_S))
        async with aiohttp.ClientSession(timeout=timeout, headers=endpoint.headers()) as session:
            return await metrics.read(session, endpoint.api("/metrics"))

    return run_in_thread(get)


def version_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The response headers that name the server or a version (server, x-*version*, ...)."""
    keep = {}
    for name, value in headers.items():
        low = name.lower()
        if low in ("server", "x-powered-by") or "version" in low:
            keep[low] = error_line(value, 120)
    return keep


async def _version(session, endpoint: Endpoint) -> str | None:
    """vLLM's GET /version ({"version": ...}); None where the server has none."""
    try:
        async with session.get(endpoint.api("/version")) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    version = data.get("version") if isinstance(data, dict) else None
    return error_line(version, 80) if isinstance(version, str) else None


async def has_tokenize(session, endpoint: Endpoint, model: str) -> bool:
    """POST /tokenize answers with a token list (vLLM's {"count", "tokens"})."""
    try:
        data = await tokenize(session, endpoint, model, "Hello")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, LookupError):
        return False
    return isinstance(data, list)


async def tokenize(session, endpoint: Endpoint, model: str, text: str) -> list[int]:
    """Token ids of text by the server's POST /tokenize, without special tokens. Raises
    LookupError when the server answers anything but a token list."""
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    async with session.post(endpoint.api("/tokenize"), json=body) as resp:
        data = await resp.json(content_type=None) if resp.status == 200 else None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise LookupError(f"{endpoint.public}/tokenize gave no token list")
    return tokens


async def probe_length_fields(session, endpoint: Endpoint, model: str | None, prompt) -> dict:
    """Which of LENGTH_FIELDS the server accepts, by one-token streaming requests: sent with
    all; a 400 or 422 naming some drops those; one naming none is tried once without all
    (dropped if that is served). A probe with no served answer (a refused connection, a 5xx,
    a prompt the server refuses) is inconclusive: what was not named stays, and the run's own
    requests, if they fail, are counted. One taken and not answered within the request
    timeout raises NoAnswer (server_info: the endpoint refused; length_fields:
    inconclusive). The answer is kept for the endpoint when conclusive (stream_requests then
    sends no probe of its own).
    Returns {"length_fields": [sent], "dropped_fields": [...], "dropped_because": message,
    "length_probe": "served" or "inconclusive: message"}."""
    fields, dropped, because, served = list(LENGTH_FIELDS), [], None, False
    while True:
        status, message = await _one_token(session, endpoint, model, prompt, fields)
        if status == 200:
            served = True
            break
        if status not in (400, 422) or not fields:
            break
        named = [f for f in fields if f in message]
        if not named:
            status, _ = await _one_token(session, endpoint, model, prompt, [])
            if status == 200:
                dropped, because, fields, served = dropped + fields, message, [], True
            break
        dropped, because = dropped + named, message
        fields = [f for f in fields if f not in named]
    found = {
        "length_fields": fields,
        "dropped_fields": dropped,
        "dropped_because": because,
        "length_probe": "served" if served else error_line(f"inconclusive: {message}"),
    }
    if served:
        _PROBED[_probe_key(endpoint, model)] = found
    return found


# conclusive probes, per (base URL, model, chat or not)
_PROBED: dict[tuple[str, str | None, bool], dict] = {}


def _probe_key(endpoint: Endpoint, model: str | None) -> tuple[str, str | None, bool]:
    return check_url(endpoint.url), model, endpoint.chat


async def length_fields(session, endpoint: Endpoint, model: str | None, prompt) -> dict:
    """probe_length_fields' answer for this endpoint and model: the one kept from a
    conclusive probe (server_info's), else a probe with `prompt` now."""
    kept = _PROBED.get(_probe_key(endpoint, model))
    if kept:
        return kept
    try:
        return await probe_length_fields(session, endpoint, model, prompt)
    except NoAnswer as e:  # inconclusive: every field kept, the run's requests counted
        return {"length_fields": list(LENGTH_FIELDS), "dropped_fields": [],
                "dropped_because": None, "length_probe": f"inconclusive: {e}"}  # fmt: skip


async def _one_token(session, endpoint, model, prompt, fields) -> tuple[int | None, str]:
    payload = completion_payload(model, prompt, 1, fields, chat=endpoint.chat)
    try:
        async with session.post(
            endpoint.api(endpoint.route),
            json=payload,
            timeout=aiohttp.ClientTimeout(total=endpoint.timeout_s),
        ) as resp:
            body = await resp.text(errors="replace")
            return resp.status, error_message(resp.status, body) if resp.status != 200 else ""
    except asyncio.TimeoutError:
        raise NoAnswer(f"no answer within {endpoint.timeout_s:g} s") from None
    except aiohttp.ClientError as e:
        return None, failure_reason(e)


class NoAnswer(Exception):
    """A one-token probe the server took but did not answer within the request timeout."""
