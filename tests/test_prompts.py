"""--prompts: reading JSONL and text files, tokenizing as transformers' tokenizer does."""

import json
import sys

import pytest

from benchbatch.core import prompts
from benchbatch.errors import UserError

VOCAB = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "the": 5, "cat": 6, ",": 7}


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_reads_prompt_or_text_fields(tmp_path):
    rows = [{"prompt": "hello world"}, {"text": "the cat", "id": 3}, {"prompt": " spaced "}]
    path = write(tmp_path, "p.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert prompts.read_prompts(path) == ["hello world", "the cat", " spaced "]


def test_jsonl_is_recognized_without_its_suffix(tmp_path):
    path = write(tmp_path, "p.txt", '{"prompt": "a"}\n{"prompt": "b"}\n')
    assert prompts.read_prompts(path) == ["a", "b"]


def test_text_is_one_prompt_per_line(tmp_path):
    path = write(tmp_path, "p.txt", "hello world\n\n  the cat\r\nlast")
    assert prompts.read_prompts(path) == ["hello world", "  the cat", "last"]


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("p.jsonl", '{"prompt": "a"}\n{"prompt": ', "line 2 is not valid JSON"),
        ("p.jsonl", '{"prompt": "a"}\n\n{"body": "b"}\n', 'line 3 has no "prompt" or "text"'),
        ("p.jsonl", '{"prompt": 5}\n', 'line 1 has no "prompt" or "text" string'),
        ("p.jsonl", '["a"]\n', 'line 1 has no "prompt"'),
        ("p.txt", "\n  \n", "holds no prompts"),
    ],
)
def test_bad_prompt_files(tmp_path, name, text, message):
    with pytest.raises(UserError, match=message) as err:
        prompts.read_prompts(write(tmp_path, name, text))
    assert err.value.option == "--prompts"


def test_missing_prompt_file(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        prompts.read_prompts(tmp_path / "nope.jsonl")


@pytest.fixture
def model_dir(tmp_path):
    """A checkpoint folder's tokenizer.json: words, and a BOS the post-processor adds."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_tokens_are_transformers_tokens(model_dir):
    transformers = pytest.importorskip("transformers")
    texts = ["hello world", "the cat, the   cat", "unknown words"]
    ids = prompts.tokenize(texts, model_dir)
    assert ids == [[1, 3, 4], [1, 5, 6, 7, 5, 6], [1, 0, 0]]
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(model_dir / "tokenizer.json")
    )
    assert ids == [reference(t)["input_ids"] for t in texts]


def test_prompt_token_ids_reads_then_tokenizes(model_dir, tmp_path):
    path = write(tmp_path, "p.jsonl", '{"prompt": "hello"}\n{"text": "cat cat"}\n')
    assert prompts.prompt_token_ids(path, model_dir) == [[1, 3], [1, 6, 6]]


def test_a_prompt_with_no_tokens(tmp_path, model_dir):
    tokenizers = pytest.importorskip("tokenizers")
    bare = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="<unk>"))
    bare.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    bare.save(str(model_dir / "tokenizer.json"))
    with pytest.raises(UserError, match="prompt 2 tokenizes to no tokens"):
        prompts.tokenize(["hello", "   "], model_dir)


def test_no_tokenizer_json(tmp_path):
    with pytest.raises(UserError, match="has no tokenizer.json") as err:
        prompts.tokenize(["hello"], tmp_path)
    assert err.value.option == "--prompts"


def test_a_broken_tokenizer_json(tmp_path):
    pytest.importorskip("tokenizers")
    write(tmp_path, "tokenizer.json", '{"model": 3}')
    with pytest.raises(UserError, match="cannot read"):
        prompts.tokenize(["hello"], tmp_path)


def test_without_the_tokenizers_package(model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"pip install 'benchbatch\[hf\]'"):
        prompts.tokenize(["hello"], model_dir)
