"""`benchbatch serve`'s POST /v1/chat/completions, measured by clients not written here: the
prompt a chat's messages make is the one transformers' apply_chat_template makes of the
same template and tokenizer (its ids, to the token), the streamed tokens are the in-process
engine's greedy tokens of that prompt (the `openai` client, streamed and whole), the stream
opens with the role's chunk as vLLM's does, the template is found beside the tokenizer, bad
requests get OpenAI's errors and bad templates one line; then serve-sweep --endpoint's chat
run against it end to end."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
from test_server import HANG_S, alone, client, serving

from benchbatch.app.cli import app
from benchbatch.net.chat import ChatTemplate, find_template

openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('no role ' + m['role']) }}{% endif %}"
    "{{ m['role'] }} : {{ m['content'] | trim }} "
    "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}"
)
WORDS = ["<unk>", "system", "user", "assistant", ":", "hello", "world", "the", "cat", "sat",
         "on", "a", "mat", "be", "brief"]  # fmt: skip


@pytest.fixture(scope="module")
def words():
    """A word-level tokenizer (one token a word or a colon) with <s> as its special BOS,
    which it adds to a text encoded with special tokens (as Llama's does): a chat template
    writes its own, so a server that added it again would prompt with two."""
    vocab = {w: i for i, w in enumerate(WORDS + [f"w{i}" for i in range(200)])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.add_special_tokens(["<s>"])
    bos = ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[bos]
    )
    assert tok.encode("hello").ids == [bos[1], vocab["hello"]]
    return tok


@pytest.fixture(scope="module")
def checkpoint_folder(words, tmp_path_factory):
    """The tokenizer as a checkpoint keeps it: tokenizer.json, and tokenizer_config.json with
    the template and the BOS."""
    folder = tmp_path_factory.mktemp("tok")
    words.save(str(folder / "tokenizer.json"))
    config = {"bos_token": {"content": "<s>"}, "eos_token": "<unk>", "chat_template": TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def reference_ids(words, messages) -> list[int]:
    """transformers' own rendering and tokenization of the same template."""
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="<s>", eos_token="<unk>", chat_template=TEMPLATE
    )
    out = fast.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


CHATS = [
    [{"role": "user", "content": "hello world"}],
    [{"role": "system", "content": "be brief"},
     {"role": "user", "content": [{"type": "text", "text": "the cat"},
                                  {"type": "text", "text": "sat on a mat"}]}],
]  # fmt: skip


def as_transformers(messages):
    """Content parts as the server joins them (newlines), for transformers' template."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content)
        out.append({"role": m["role"], "content": content})
    return out


def test_chat_prompts_are_transformers_and_tokens_the_engines(tiny_model, words, checkpoint_folder):
    template = find_template(None, checkpoint_folder)
    assert template.special == {"bos_token": "<s>", "eos_token": "<unk>"}
    n = 6
    with serving(tiny_model, tokenizer=words, chat_template=template) as (url, _):
        c = client(url)

        def one(messages):
            return list(c.chat.completions.create(
                model="tiny", messages=messages, max_tokens=n, stream=True,
                stream_options={"include_usage": True},
                extra_body={"return_token_ids": True}))  # fmt: skip

        with ThreadPoolExecutor(len(CHATS)) as pool:
            streams = list(pool.map(one, CHATS))
        whole = c.chat.completions.create(model="tiny", messages=CHATS[0], max_tokens=n)
        counted = list(c.chat.completions.create(
            model="tiny", messages=CHATS[0], max_tokens=n, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True}))  # fmt: skip
    # continuous_usage_stats: every chunk the usage so far, the role's 0 (vLLM's)
    assert [ch.usage.completion_tokens for ch in counted] == [0, *range(1, n + 1), n]
    assert {ch.usage.prompt_tokens for ch in counted} == {len(reference_ids(words, CHATS[0]))}
    for messages, chunks in zip(CHATS, streams, strict=True):
        ids = reference_ids(words, as_transformers(messages))
        assert ids[0] == words.token_to_id("<s>")
        first = chunks[0].choices[0]
        assert first.delta.role == "assistant" and first.delta.content == ""
        assert chunks[0].object == "chat.completion.chunk" and chunks[0].id.startswith("chatcmpl-")
        token_chunks = [ch for ch in chunks[1:] if ch.choices]
        assert len(token_chunks) == n  # one a token, after the role's
        tokens = [t for ch in token_chunks for t in ch.choices[0].token_ids]
        assert tokens == alone(tiny_model, ids, n)
        assert [ch.choices[0].finish_reason for ch in token_chunks] == [None] * (n - 1) + ["length"]
        text = "".join(ch.choices[0].delta.content for ch in token_chunks)
        assert text == words.decode(ids + tokens)[len(words.decode(ids)) :]  # as one decoding
        assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(ids)
        assert chunks[-1].usage.completion_tokens == n
    ids = reference_ids(words, CHATS[0])
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    out = alone(tiny_model, ids, n)
    assert whole.choices[0].message.content == words.decode(ids + out)[len(words.decode(ids)) :]
    assert whole.usage.prompt_tokens == len(ids) and whole.choices[0].finish_reason == "length"


def test_the_template_is_found_beside_the_tokenizer(tmp_path, checkpoint_folder, words):
    messages = [{"role": "user", "content": "hello"}]
    from_config = find_template(None, checkpoint_folder)
    assert from_config.render(messages) == "<s>user : hello assistant :"
    assert from_config.origin.endswith("tokenizer_config.json's chat_template")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": TEMPLATE}]
    config = {"bos_token": "<s>", "chat_template": named}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert find_template(None, folder).render(messages) == from_config.render(messages)
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert find_template(None, folder).render(messages) == "hello!"  # the file comes first
    given = tmp_path / "given.jinja"
    given.write_text("{{ bos_token }}{{ messages | length }}")
    assert find_template(given, folder).render(messages) == "<s>1"  # the folder's BOS
    assert find_template(None, tmp_path / "empty") is None
    with pytest.raises(ValueError, match="no role tool"):
        from_config.render([{"role": "tool", "content": "x"}])


def test_bad_chat_requests_get_openai_errors(tiny_model, words):
    with serving(tiny_model, tokenizer=words) as (url, _):  # no template
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            client(url).chat.completions.create(model="tiny", messages=CHATS[0], max_tokens=2)
    template = ChatTemplate(TEMPLATE, "test", {"bos_token": "<s>"})
    bad = [
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"content": "x"}]}, "with a role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "no role tool"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "only text content"),
        ({"messages": CHATS[0], "temperature": 0.7}, "greedy"),
        ({"messages": CHATS[0], "tools": [{"type": "function"}]}, "tools"),
        ({"messages": CHATS[0], "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": CHATS[0], "max_tokens": 10**6}, "max_tokens"),
        ({"messages": CHATS[0], "top_logprobs": 3}, "top_logprobs is not served"),
        ({"messages": CHATS[0], "max_completion_tokens": 2, "max_tokens": "zz"},
         "max_tokens must be an integer"),
        # fields that change the prompt the template renders: served as vLLM, or refused
        ({"messages": CHATS[0], "tool_choice": "required"}, "tool_choice is not served"),
        ({"messages": CHATS[0], "continue_final_message": True},
         "continue_final_message is not served"),
        ({"messages": CHATS[0], "chat_template": "{{ 1 }}"}, "chat_template is not served"),
        ({"messages": CHATS[0], "chat_template_kwargs": {"messages": []}},
         "chat_template_kwargs may not set messages"),
        ({"messages": CHATS[0], "chat_template_kwargs": [1]}, "must be an object"),
        ({"messages": CHATS[0], "top_p": 0.5}, "top_p must be 1"),
        ({"messages": CHATS[0], "top_k": 5}, "top_k must be -1, 0"),
        ({"messages": CHATS[0], "seed": "x"}, "seed must be an integer"),
    ]  # fmt: skip
    with serving(tiny_model, tokenizer=words, chat_template=template) as (url, _):
        c = client(url)
        for body, said in bad:
            with pytest.raises(openai.BadRequestError, match=said):
                c.post("/chat/completions", body={"model": "tiny", **body}, cast_to=object)
        # a prompt past the context names the field it came in (a chat has no "prompt")
        long = [{"role": "user", "content": "hello " * 2000}]
        with pytest.raises(openai.BadRequestError, match="maximum context length") as e:
            c.post("/chat/completions", body={"model": "tiny", "messages": long,
                                              "max_tokens": 2}, cast_to=object)  # fmt: skip
        assert e.value.body["param"] == "messages"


@pytest.mark.parametrize(
    "args, said",
    [
        (["--chat-template", "no-such.jinja"], "no-such.jinja is not a file"),
        (["--chat-template", "{bad}"], "is no jinja2 template"),
    ],
)
def test_bad_templates_are_one_line(runner, tmp_path, checkpoint_folder, args, said):
    if args[1] == "{bad}":
        bad = tmp_path / "bad.jinja"
        bad.write_text("{% for m in messages %}never closed")
        args = ["--chat-template", str(bad)]
    out = tmp_path / "run"
    argv = ["serve", "--preset", "tiny", "--device", "cpu", "--tokenizer",
            str(checkpoint_folder), "--out", str(out), *args]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "--chat-template" in lines[0] and said in lines[0], result.output
    assert not out.exists()


def test_a_template_without_a_tokenizer_is_one_line(runner, tmp_path):
    given = tmp_path / "t.jinja"
    given.write_text(TEMPLATE)
    argv = ["serve", "--preset", "tiny", "--device", "cpu", "--chat-template", str(given),
            "--out", str(tmp_path / "run")]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and "--chat-template" in result.output, result.output
    assert "needs a tokenizer" in result.output


def test_serve_sweep_chats_with_benchbatch_serve(runner, tmp_path, tiny_model, words):
    """End to end, both ends benchbatch's: prompts of exact lengths by the server's
    /tokenize, sent as chat messages; the server counts the template's 5 tokens more (BOS,
    "user :", "assistant :"), the role's chunk is no token, every request is served."""
    template = ChatTemplate(TEMPLATE, "test", {"bos_token": "<s>"})
    out = tmp_path / "run"
    with serving(tiny_model, tokenizer=words, chat_template=template) as (url, _):
        argv = ["serve-sweep", "--endpoint", url + "/v1/chat/completions", "--requests", "6",
                "--real-requests", "4", "--prompt-dist", "fixed", "--prompt-len", "8",
                "--output-dist", "fixed", "--median", "4", "--max-output", "4", "--rates", "20",
                "--request-timeout", str(HANG_S), "--out", str(out)]  # fmt: skip
        result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    serve = pd.read_csv(out / "serve.csv")
    assert list(serve["requests"]) == [4] and list(serve["failed"]) == [0]
    assert list(serve["token_mismatch"]) == [0]
    requests = pd.read_csv(out / "requests.csv")
    assert (requests["chunks"] == 4).all() and (requests["output_tokens"] == 4).all()
    assert (requests["server_prompt_tokens"] == requests["prompt_tokens"] + 5).all()
    assert json.loads((out / "metadata.json").read_text())["endpoint"]["api"] == (
        "/v1/chat/completions"
    )


def test_a_chats_rendering_fields_are_served_as_vllm_serves_them(tiny_model, words):
    """add_generation_prompt false, chat_template_kwargs and add_special_tokens changed the
    prompt vLLM renders and were left out here (200, another prompt): the prompt is
    transformers' rendering with them, to the token (usage.prompt_tokens)."""
    template = ChatTemplate(TEMPLATE + "{% if brief %} be brief{% endif %}", "test",
                            {"bos_token": "<s>"})  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>",
                                                eos_token="<unk>",
                                                chat_template=template.source)  # fmt: skip

    def reference(**kwargs) -> int:
        out = fast.apply_chat_template(CHATS[0], tokenize=True, **kwargs)
        return len(out["input_ids"] if hasattr(out, "keys") else out)

    with serving(tiny_model, tokenizer=words, chat_template=template) as (url, _):
        c = client(url)

        def prompt_tokens(**extra) -> int:
            got = c.chat.completions.create(model="tiny", messages=CHATS[0], max_tokens=1,
                                            extra_body=extra)  # fmt: skip
            return got.usage.prompt_tokens

        assert prompt_tokens() == reference(add_generation_prompt=True)
        assert prompt_tokens(add_generation_prompt=False) == reference(
            add_generation_prompt=False)  # fmt: skip
        assert prompt_tokens(chat_template_kwargs={"brief": True}) == reference(
            add_generation_prompt=True, brief=True) == prompt_tokens() + 2  # fmt: skip
        # the template writes its BOS; add_special_tokens true adds the tokenizer's too
        assert prompt_tokens(add_special_tokens=True) == prompt_tokens() + 1
        # and a completion's add_special_tokens false leaves the tokenizer's BOS out
        text = "hello world"
        done = [c.completions.create(model="tiny", prompt=text, max_tokens=1,
                                     extra_body=extra).usage.prompt_tokens
                for extra in ({}, {"add_special_tokens": False})]  # fmt: skip
    assert done == [len(words.encode(text).ids),
                    len(words.encode(text, add_special_tokens=False).ids)] == [3, 2]


def test_special_tokens_are_left_out_of_the_text_unless_asked_for(words):
    """The end-of-sequence token's text ("</s>") was in every stopped answer's text; vLLM
    leaves special tokens out (skip_special_tokens, default true), streamed or whole."""
    from benchbatch.net.completions import Detokenizer

    bos, hello, world = (words.token_to_id(w) for w in ("<s>", "hello", "world"))
    ids = [hello, world, bos]
    assert words.decode(ids, skip_special_tokens=True) == "hello world"
    for skip, whole in ((True, "hello world"), (False, "hello world <s>")):
        d = Detokenizer(words, skip)
        assert "".join(d.add([i]) for i in ids) == whole
        assert Detokenizer(words, skip).add(ids) == whole
