"""A local Hugging Face checkpoint's folder and config.json, read without torch: what the
model is (its shape, its architecture checked against the ones benchbatch loads), before
anything is built. benchbatch/runtime/checkpoint.py loads its weights."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NoReturn

from benchbatch.core import hfconfig
from benchbatch.core.config import ModelConfig
from benchbatch.errors import UserError

OPTION = "--model"
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
CONFIG_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def fail(message: str) -> NoReturn:
    raise UserError(OPTION, message)


def folder(path: str | Path) -> Path:
    """The checkpoint folder, or a UserError saying what is wrong and how to get one."""
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            fail(f"{p} has no config.json (give the folder of a Hugging Face checkpoint)")
        return p
    if p.exists():
        fail(f"{p} is a file; give the folder that holds config.json and the .safetensors")
    text = str(path)
    if HUB_ID.fullmatch(text):
        local = text.split("/")[-1]
        fail(
            f"no folder {text!r} here, and benchbatch downloads nothing; fetch it first with "
            f"`hf download {text} --local-dir {local}`, then pass --model {local}"
        )
    fail(f"no such folder: {p}")


def read_config(path: str | Path) -> ModelConfig:
    """The checkpoint's model (its config.json), without touching the weights."""
    p = folder(path)
    raw = hfconfig.load_json(p / "config.json", OPTION)
    _check_architecture(raw, p / "config.json")
    return hfconfig.read_config(p / "config.json", OPTION, name=p.resolve().name)


def _check_architecture(raw: dict, path: Path) -> None:
    fields = hfconfig.Fields(raw, path, OPTION)
    known = ", ".join(ARCHITECTURES)
    archs = raw.get("architectures")
    if archs is None:  # older configs: model_type alone says the family
        if raw.get("model_type") not in ARCHITECTURES.values():
            fields.fail("model_type", f"{hfconfig._short(raw.get('model_type'))} is not one of "
                        f"{known}")  # fmt: skip
        return
    if not isinstance(archs, list) or len(archs) != 1:
        fields.fail("architectures", f"expected one architecture, got {hfconfig._short(archs)}")
    if not isinstance(archs[0], str) or archs[0] not in ARCHITECTURES:
        fields.fail(
            "architectures", f"{hfconfig._short(archs[0])} is not one benchbatch loads ({known})"
        )
    if raw.get("model_type") != ARCHITECTURES[archs[0]]:
        fields.fail("model_type", f"{hfconfig._short(raw.get('model_type'))} does not match "
                    f"{archs[0]}")  # fmt: skip


def stored_dtype(path: str | Path) -> str | None:
    """The dtype config.json says the weights are in (fp32, fp16, bf16), or None."""
    raw = hfconfig.load_json(folder(path) / "config.json", OPTION)
    stored = raw.get("torch_dtype") or raw.get("dtype")
    return CONFIG_DTYPES.get(stored) if isinstance(stored, str) else None


def eos_token_ids(path: str | Path, vocab: int | None = None, required: bool = True
                  ) -> frozenset[int]:  # fmt: skip
    """The ids that end a generation: generation_config.json's, else config.json's. With the
    model's vocab, each must be a token the model can generate (else --stop-at-eos never
    stops). required False (a server, whose clients may ask for ignore_eos): none, or none
    the model can generate, is the empty set, not an error."""
    p = folder(path)
    for name in ("generation_config.json", "config.json"):
        file = p / name
        if not file.is_file():
            continue
        raw = hfconfig.load_json(file, OPTION)
        value = raw.get("eos_token_id")
        if value is None and name == "config.json":
            value = hfconfig.language_model(raw, file, OPTION).get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
        ):
            shown = hfconfig._short(value)
            hfconfig.Fields(raw, file, OPTION).fail("eos_token_id", f"not token ids: {shown}")
        outside = [i for i in ids if vocab is not None and i >= vocab]
        if outside and not required:
            return frozenset(i for i in ids if i not in outside)
        if outside:
            raise UserError(
                "--stop-at-eos",
                f"{file}: eos_token_id {outside[0]:,} is outside the model's vocabulary "
                f"({vocab:,} tokens, ids 0 to {vocab - 1:,}), so generation could never stop "
                "at it",
            )
        return frozenset(ids)
    if not required:
        return frozenset()
    raise UserError(
        "--stop-at-eos",
        f"{p}: no eos_token_id in generation_config.json or "
        "config.json, so there is no end-of-sequence token to stop at",
    )
