"""The streaming client through the chat completions API (an --endpoint URL that ends in
/v1/chat/completions), against the scripted server of test_client.py with its scripted
clock: what is sent (one user message, no prompt field, the same length fields), which
chunks count as tokens (not the role's announcement; an empty held-back token and a
reasoning token do), and the metrics to the bit; then the API the URL names."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
import test_client
from test_client import Scripted, chat_chunk, run_all, sse, usage

from benchbatch.core.streamed import request_metrics, run_metrics, token_mismatches
from benchbatch.net.client import Prompt
from benchbatch.net.discovery import server_info
from benchbatch.net.endpoint import Endpoint, check_url, completion_payload, make_endpoint
from benchbatch.net.events import role_only

clock, server = test_client.clock, test_client.server  # test_client's fixtures


def test_chat_times_count_tokens_not_the_role_announcement(clock, server):
    # Request 0 as vLLM streams a chat: the role alone at 0.25, its first token's chunk at
    # 0.375, a token whose text is held back (content ""), one more with the finish, usage.
    a = [
        (0.25, sse(chat_chunk("", role="assistant"))),
        (0.375, sse(chat_chunk("He"))),
        (0.5, sse(chat_chunk(""))),
        (1.0, sse(chat_chunk("llo", "length"))),
        (1.0, sse(usage(3, prompt=12))),
    ]
    # Request 1: a reasoning model's first token (no content, reasoning_content), role sent
    # with the first token in one chunk (as some servers do), no usage.
    b = [
        (0.75, sse(chat_chunk(None, role="assistant", reasoning_content="Hm"))),
        (1.25, sse(chat_chunk("ok", "length"))),
    ]
    server.scripts = {"m0": ("stream", 0, a), "m1": ("stream", 1, b)}
    clock.now.update({0: 0.0, 1: 0.5})
    records = run_all(
        Endpoint(server.url, "tiny", 60, chat=True),
        [Prompt(0, "m0", 5, 3), Prompt(1, "m1", 5, 2)],
        [0.0, 0.5],
        length_fields=("ignore_eos",),
        clock=clock,
    )
    assert [r.error for r in records] == [None, None]
    assert records[0].chunk_s == [0.375, 0.5, 1.0]  # not the role's 0.25
    assert records[1].chunk_s == [0.75, 1.25]  # its role rode on a token: counted
    assert [r.text for r in records] == ["Hello", "ok"]
    assert [r.output_tokens for r in records] == [3, None]
    assert records[0].server_prompt_tokens == 12  # the template's tokens, as the server says
    assert records[0].finish_reason == "length"
    assert token_mismatches(records)[0].request_id == 1  # no usage: unchecked, said

    m = request_metrics(records[0])
    assert Fraction(m.ttft) == Fraction(3, 8) and Fraction(m.e2e) == 1
    assert (m.e2e - m.ttft) / (m.num_tokens - 1) == 0.3125  # TPOT
    run = run_metrics(records)
    assert run.tbt_counts == Counter({0.125: 1, 0.5: 2})  # no near-zero role gap

    bodies = [b for b in server.bodies if b["max_tokens"] > 1]
    assert len(bodies) == 2
    for body, text, n in zip(bodies, ("m0", "m1"), (3, 2), strict=True):
        assert body["messages"] == [{"role": "user", "content": text}]
        assert "prompt" not in body
        assert body["max_tokens"] == n and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["temperature"] == 0 and body["ignore_eos"] is True


def test_the_length_fields_are_probed_through_chat(clock):
    server = Scripted(clock, reject_fields=True)
    try:
        info = server_info(Endpoint(server.url, "tiny", 60, chat=True))
    finally:
        server.close()
    assert info["length_fields"] == [] and info["length_probe"] == "served"
    assert set(info["dropped_fields"]) == {"ignore_eos", "min_tokens"}
    probes = [b for b in server.bodies if b["max_tokens"] == 1]
    assert probes and all(b["messages"][0]["content"] == "Hello" for b in probes)
    assert all("prompt" not in b for b in probes)  # no token-id try: chat takes text only


@pytest.mark.parametrize(
    "delta, finish, alone",
    [
        ({"role": "assistant", "content": ""}, None, True),
        ({"role": "assistant"}, None, True),
        ({"role": "assistant", "content": None, "tool_calls": []}, None, True),
        ({"role": "assistant", "content": "a"}, None, False),
        ({"role": "assistant", "content": ""}, "stop", False),
        ({"role": "assistant", "reasoning_content": "x"}, None, False),
        ({"content": ""}, None, False),  # a token whose text is held back
        ({}, None, False),
    ],
)
def test_role_only_is_the_announcement_alone(delta, finish, alone):
    assert role_only(delta, {"delta": delta, "finish_reason": finish}) is alone


def test_the_api_is_the_one_the_url_names():
    base = "http://127.0.0.1:8000"
    assert not make_endpoint(base).chat and make_endpoint(base).route == "/v1/completions"
    named = make_endpoint(base + "/v1/chat/completions/")
    assert named.chat and named.url == base and named.route == "/v1/chat/completions"
    assert named.api(named.route) == base + "/v1/chat/completions"
    assert not make_endpoint(base + "/v1/completions").chat
    assert not make_endpoint(base + "/v1").chat
    assert make_endpoint("http://h/proxy/v1/chat/completions?x=1").url == "http://h/proxy?x=1"
    assert check_url(base + "/v1/chat/completions") == base


def test_a_chat_body_carries_text_only():
    body = completion_payload("m", "hi", 4, ("min_tokens",), {"seed": 1}, chat=True)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "min_tokens": 4,
        "seed": 1,
    }
    with pytest.raises(ValueError):
        completion_payload("m", [1, 2], 4, (), chat=True)
