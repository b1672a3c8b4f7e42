"""benchbatch's client (net/client.py, what serve-sweep --endpoint drives) against benchbatch's
own server (`benchbatch serve`'s engine and app, started in-process): every request's
streamed tokens are the in-process engine's greedy tokens, one chunk a token, the usage
counts agree with the chunks and with max_tokens, and the metrics come from every request.
The openai package's client checks the same server in tests/test_server.py; this is the
other side: the client checked against a server whose tokens are known."""

from __future__ import annotations

import re

import pytest

from benchbatch.core.streamed import failure_counts, run_metrics, token_mismatches
from benchbatch.net.client import Prompt, stream_requests
from benchbatch.net.discovery import server_info
from benchbatch.net.endpoint import make_endpoint

test_server = pytest.importorskip("test_server")  # its server fixture and helpers

pytestmark = pytest.mark.usefixtures("one_thread")


def ids_of(text: str) -> list[int]:
    return [int(t) for t in re.findall(r"<(\d+)>", text)]


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_the_client_gets_the_engines_tokens(tiny_model, policy):
    asks = test_server.draw(6, seed=11)
    prompts = [Prompt(i, p, len(p), n) for i, (p, n) in enumerate(asks)]
    arrivals = [0.0, 0.0, 0.01, 0.02, 0.03, 0.04]
    with test_server.serving(tiny_model, policy) as (url, engine):
        endpoint = make_endpoint(url, None, test_server.HANG_S, environ={})
        info = server_info(endpoint)
        assert info["served_model"] == "tiny" and info["models"] == ["tiny"]
        with stream_requests(endpoint, prompts, arrivals) as run:
            records = list(run)
    assert failure_counts(records) == {k: 0 for k in failure_counts(records)}
    assert not token_mismatches(records)
    by_id = {s.request_id: s for s in records}
    for i, (prompt, n) in enumerate(asks):
        s = by_id[i]
        assert ids_of(s.text) == test_server.alone(tiny_model, prompt, n), (policy, i)
        assert s.output_tokens == n == len(s.chunk_s)
        assert s.server_prompt_tokens == len(prompt)
    metrics = run_metrics(records)
    assert len(metrics.requests) == len(asks)
    assert sum(metrics.tbt_counts.values()) == sum(n - 1 for _, n in asks)
