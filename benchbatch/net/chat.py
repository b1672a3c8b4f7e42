"""A checkpoint's chat template, as benchbatch's server applies it to a chat completion's
messages: found beside the tokenizer (chat_template.jinja, else tokenizer_config.json's
chat_template) or given as a file, compiled once in jinja2's immutable sandbox with the
settings and helpers transformers' apply_chat_template gives a template (trim_blocks,
lstrip_blocks, loop controls, raise_exception, tojson, strftime_now; {% generation %}
renders its body), and rendered with add_generation_prompt and the checkpoint's special
tokens. The text is then tokenized without special tokens (the template writes its own
BOS), as transformers and vLLM do. tests/test_server_chat.py checks the prompt ids against
transformers' apply_chat_template."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from benchbatch.errors import UserError

OPTION = "chat_template"
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's source, where it came from and the special tokens it is given."""

    source: str
    origin: str
    special: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            compiled = _environment().from_string(self.source)
        except Exception as e:  # noqa: BLE001 - jinja2's syntax errors and more
            raise UserError(OPTION, f"{self.origin} is no jinja2 template: {e}") from None
        object.__setattr__(self, "_compiled", compiled)

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               kwargs: dict | None = None) -> str:  # fmt: skip
        """The prompt's text: the messages, then the assistant's turn opened (unless
        add_generation_prompt is false); kwargs: a request's chat_template_kwargs, as
        vLLM passes them. A template that refuses them (raise_exception) raises
        ValueError with its message."""
        import jinja2

        try:
            return self._compiled.render(**{**self.special, **(kwargs or {})},
                                         messages=messages,
                                         add_generation_prompt=add_generation_prompt,
                                         tools=None, documents=None)  # fmt: skip
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template refused the messages: {e}") from None


def _environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """{% generation %}...{% endgeneration %} (transformers' assistant masks): the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)  # fmt: skip

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def find_template(given: Path | None, folder: Path | None) -> ChatTemplate | None:
    """--chat-template (a file of jinja2 text), else the template beside the tokenizer in
    folder: chat_template.jinja, else tokenizer_config.json's chat_template (a string, or
    a list of named ones: "default"); None where there is none. The special tokens come from
    folder's tokenizer_config.json (a given file's too, when folder has one)."""
    config = _config(folder)
    special = {name: _token(config.get(name)) for name in SPECIAL if _token(config.get(name))}
    if given is not None:
        if not given.is_file():
            raise UserError(OPTION, f"{given} is not a file (a jinja2 chat template)")
        return ChatTemplate(_read(given), str(given), special)
    if folder is None:
        return None
    beside = folder / "chat_template.jinja"
    if beside.is_file():
        return ChatTemplate(_read(beside), str(beside), special)
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if isinstance(source, str) and source.strip():
        return ChatTemplate(source, f"{folder / 'tokenizer_config.json'}'s chat_template", special)
    return None


def _config(folder: Path | None) -> dict:
    path = None if folder is None else folder / "tokenizer_config.json"
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(_read(path))
    except ValueError as e:
        raise UserError(OPTION, f"{path} is not JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(OPTION, f"cannot read {path}: {e}") from None


def _token(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
