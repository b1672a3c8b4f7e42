"""Real prompts: a file of them, tokenized with the checkpoint's own tokenizer.json.

The file is JSONL (one object per line, its "prompt" or "text" field) or plain text (one
prompt per line); blank lines are skipped. Tokenizing goes through the `tokenizers` package
(the optional `hf` extra), with the tokenizer's own special tokens (Llama's BOS, for one), as
transformers' tokenizer(text) does; no chat template is applied: a prompt is sent as written.
"""

from __future__ import annotations

from pathlib import Path

from benchbatch.errors import UserError

OPTION = "--prompts"
FIELDS = ("prompt", "text")


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a JSONL or text file, in file order."""
    from benchbatch.core.inputs import read_text

    path = Path(path)
    lines = read_text(path, OPTION).splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise UserError(OPTION, f"{path} holds no prompts")
    if path.suffix == ".jsonl" or numbered[0][1].lstrip().startswith("{"):
        return [_json_prompt(path, n, line) for n, line in numbered]
    return [line for _, line in numbered]


def _json_prompt(path: Path, n: int, line: str) -> str:
    from benchbatch.core.inputs import parse_json

    row = parse_json(line, path, OPTION, where=f" line {n}")
    if isinstance(row, dict):
        for key in FIELDS:
            if isinstance(row.get(key), str):
                return row[key]
    raise UserError(OPTION, f'{path} line {n} has no "prompt" or "text" string')


def load_tokenizer(file: Path, option: str, what: str, missing: str):
    """A tokenizer.json read by the tokenizers library (an optional dependency), or one line
    naming the option: no package (`what` needs it), no such file (`missing`), a bad file."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError(
            option, f"{what} needs the tokenizers package: pip install 'benchbatch[hf]'"
        ) from None
    if not file.is_file():
        raise UserError(option, missing)
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust library raises plain Exceptions for a bad file
        raise UserError(option, f"cannot read {file}: {str(e).splitlines()[0]}") from None


def tokenize(prompts: list[str], model_dir: str | Path) -> list[list[int]]:
    """Token ids of each prompt, by the tokenizer.json of the checkpoint folder."""
    file = Path(model_dir) / "tokenizer.json"
    missing = f"{model_dir} has no tokenizer.json to tokenize the prompts with"
    tokenizer = load_tokenizer(file, OPTION, "tokenizing", missing)
    ids = [encoding.ids for encoding in tokenizer.encode_batch(prompts)]
    for i, row in enumerate(ids):
        if not row:
            raise UserError(OPTION, f"prompt {i + 1} tokenizes to no tokens")
    return ids


def prompt_token_ids(path: str | Path, model_dir: str | Path) -> list[list[int]]:
    """read_prompts, then tokenize: what --prompts FILE with --model DIR serves."""
    return tokenize(read_prompts(path), model_dir)
