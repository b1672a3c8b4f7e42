"""`benchbatch serve`'s POST /tokenize and /detokenize beside transformers: a chat's messages
tokenize to the ids transformers' apply_chat_template makes of the same template and
tokenizer, return_token_strs gives its convert_ids_to_tokens, /detokenize its decode (special
tokens kept, as vLLM's, which decodes with transformers' default); ids read as vLLM's
pydantic reads them, and bad bodies OpenAI's 400s naming the field."""

from __future__ import annotations

import json

import pytest
from test_server import _post, serving
from test_server_chat import TEMPLATE, as_transformers, checkpoint_folder, reference_ids, words

from benchbatch.net.chat import find_template
from benchbatch.net.completions import ApiError, Served
from benchbatch.net.tokenize import detokenize, tokenize

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["checkpoint_folder", "words"]  # the fixtures, shared with test_server_chat

CHAT = [{"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "the cat"},
                                     {"type": "text", "text": "sat on a mat"}]}]  # fmt: skip


def fast(words):
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="<s>", eos_token="<unk>", chat_template=TEMPLATE
    )


def served(words, checkpoint_folder, **kwargs) -> Served:
    """What the app serves, without an engine: neither route reaches one."""
    return Served(None, "tiny", 512, words, chat_template=find_template(None, checkpoint_folder),
                  **kwargs)  # fmt: skip


def test_messages_tokenize_as_transformers_renders_them(words, checkpoint_folder):
    s = served(words, checkpoint_folder)
    body = tokenize({"messages": CHAT, "return_token_strs": True}, s)
    ids = reference_ids(words, as_transformers(CHAT))
    assert body["tokens"] == ids and body["count"] == len(ids) and body["max_model_len"] == 512
    assert body["token_strs"] == fast(words).convert_ids_to_tokens(ids)
    # without the assistant's turn: transformers' rendering without it
    plain = fast(words).apply_chat_template(as_transformers(CHAT), add_generation_prompt=False)
    plain = list(plain["input_ids"] if hasattr(plain, "keys") else plain)
    assert tokenize({"messages": CHAT, "add_generation_prompt": "false"}, s)["tokens"] == plain
    assert len(plain) < len(ids)
    # a prompt: the tokenizer's BOS added unless add_special_tokens is false (vLLM's)
    text = "the cat sat"
    assert tokenize({"prompt": text}, s)["tokens"] == fast(words)(text)["input_ids"]
    assert tokenize({"prompt": text}, s)["tokens"][0] == words.token_to_id("<s>")
    unspecial = tokenize({"prompt": text, "add_special_tokens": False}, s)
    assert unspecial["tokens"] == fast(words)(text, add_special_tokens=False)["input_ids"]
    assert unspecial["token_strs"] is None  # vLLM's null unless asked


def test_detokenize_is_transformers_decode_with_special_tokens(words, checkpoint_folder):
    s = served(words, checkpoint_folder)
    ids = reference_ids(words, as_transformers(CHAT))
    text = detokenize({"tokens": ids}, s)["prompt"]
    assert text == fast(words).decode(ids)  # transformers' default keeps special tokens
    assert text.startswith("<s>")
    # ids as vLLM's lax list[int] takes them: 5.0, "5" and true are ids
    lax = [float(ids[1]), str(ids[2]), True]
    assert detokenize({"tokens": lax}, s)["prompt"] == fast(words).decode([ids[1], ids[2], 1])
    assert detokenize({"tokens": []}, s) == {"prompt": ""}


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ({}, "tokens", "with tokens"),
        ({"tokens": "1 2"}, "tokens", "must be a list"),
        ({"tokens": [1, -1]}, "tokens", "got -1"),
        ({"tokens": [1, 2.5]}, "tokens", "got 2.5"),
        ({"tokens": [1, "1e2"]}, "tokens", "got '1e2'"),
        ({"tokens": [1, None]}, "tokens", "got None"),
        ({"tokens": [1, 10_000]}, "tokens", "token id 10000 is out of the tokenizer's vocab"),
        ({"tokens": [1], "model": "other"}, "model", "does not exist"),
    ],
)
def test_bad_detokenize_bodies_are_400s_naming_the_field(words, checkpoint_folder, body, param,
                                                         said):  # fmt: skip
    with pytest.raises(ApiError) as e:
        detokenize(body, served(words, checkpoint_folder))
    assert e.value.param == param and said in e.value.message
    assert e.value.status == (404 if param == "model" else 400)


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ([1, 2], "prompt", "with a prompt or messages"),
        ({"prompt": [1, 2]}, "prompt", "must be a string"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools", "not served"),
        ({"messages": CHAT, "chat_template": "{{ 1 }}"}, "chat_template", "not served"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "no role tool"),
        ({"prompt": "hi", "return_token_strs": "maybe"}, "return_token_strs", "true or false"),
    ],
)
def test_bad_tokenize_bodies_are_400s_naming_the_field(words, checkpoint_folder, body, param,
                                                       said):  # fmt: skip
    with pytest.raises(ApiError) as e:
        tokenize(body, served(words, checkpoint_folder))
    assert (e.value.status, e.value.param) == (400, param) and said in e.value.message


def test_without_a_tokenizer_or_template_each_route_says_so(words):
    bare = Served(None, "tiny", 512, None)
    for route, body, param in ((tokenize, {"prompt": "hi"}, "prompt"),
                               (detokenize, {"tokens": [1]}, "tokens")):  # fmt: skip
        with pytest.raises(ApiError) as e:
            route(body, bare)
        assert e.value.param == param and "no tokenizer" in e.value.message
    with pytest.raises(ApiError) as e:
        tokenize({"messages": CHAT}, Served(None, "tiny", 512, words))
    assert e.value.param == "messages" and "no chat template" in e.value.message


def test_both_routes_are_served_over_http(tiny_model, words, checkpoint_folder):
    template = find_template(None, checkpoint_folder)
    with serving(tiny_model, tokenizer=words, chat_template=template) as (url, engine):
        status, body = _post(url + "/tokenize", json.dumps({"messages": CHAT}).encode())
        assert status == 200 and body["tokens"] == reference_ids(words, as_transformers(CHAT))
        status, back = _post(url + "/detokenize", json.dumps({"tokens": body["tokens"]}).encode())
        assert status == 200 and back == {"prompt": fast(words).decode(body["tokens"])}
        status, bad = _post(url + "/detokenize", b'{"tokens": [-1]}')
        assert status == 400 and bad["error"]["param"] == "tokens"
    assert engine.requests == []  # neither route reaches the engine
