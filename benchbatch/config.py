"""The model's shape: one dataclass, named presets, and a reader for Hugging Face config.json.

Only shapes matter to benchbatch: weights are random, so a config.json is read for its sizes
and nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from benchbatch.errors import UserError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def swiglu_intermediate(hidden: int) -> int:
    """Llama's rule: 8/3 x hidden, rounded up to a multiple of 256."""
    return 256 * math.ceil(8 * hidden / 3 / 256)


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 2048
    layers: int = 12
    heads: int = 16
    kv_heads: int | None = None  # None: as many as heads (plain multi-head attention)
    intermediate: int | None = None  # None: swiglu_intermediate(hidden)
    vocab: int = 32000
    max_context: int = 4096
    head_dim: int | None = None  # None: hidden // heads (Qwen3 sets it apart from hidden)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    name: str = "custom"

    def __post_init__(self) -> None:
        for field in ("hidden", "layers", "heads", "vocab", "max_context"):
            if getattr(self, field) <= 0:
                raise UserError(f"--{field.replace('_', '-')}", "must be a positive integer")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.intermediate is None:
            object.__setattr__(self, "intermediate", swiglu_intermediate(self.hidden))
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise UserError(
                    "--heads", f"hidden {self.hidden} is not divisible by heads {self.heads}"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        self._check_derived()

    def _check_derived(self) -> None:
        if self.kv_heads <= 0 or self.intermediate <= 0 or self.head_dim <= 0:
            raise UserError("--kv-heads", "kv_heads, intermediate and head_dim must be positive")
        if self.heads % self.kv_heads:
            raise UserError(
                "--kv-heads", f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}"
            )
        if self.head_dim % 2:
            raise UserError("--heads", f"head_dim {self.head_dim} must be even for rotary")

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed; derived sizes are derived again unless given."""
        base = dataclasses.asdict(self)
        for derived in ("kv_heads", "intermediate", "head_dim"):
            if derived not in changes and _was_derived(self, derived):
                base[derived] = None
        base.update({k: v for k, v in changes.items() if v is not None})
        return ModelConfig(**base)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _was_derived(cfg: ModelConfig, field: str) -> bool:
    if field == "kv_heads":
        return cfg.kv_heads == cfg.heads
    if field == "intermediate":
        return cfg.intermediate == swiglu_intermediate(cfg.hidden)
    return cfg.head_dim * cfg.heads == cfg.hidden


# Published sizes of real models (their config.json), plus the articles' 12 x 2048 and a
# tiny one for tests. Only shapes: the weights are random.
PRESETS: dict[str, ModelConfig] = {
    "article": ModelConfig(hidden=2048, layers=12, heads=16, name="article"),
    "cpu-small": ModelConfig(hidden=512, layers=4, heads=8, max_context=4096, name="cpu-small"),
    "tiny": ModelConfig(
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=128,
        vocab=256,
        max_context=256,
        name="tiny",
    ),
    "qwen3-0.6b": ModelConfig(
        hidden=1024,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate=3072,
        vocab=151936,
        max_context=40960,
        rope_theta=1e6,
        norm_eps=1e-6,
        tie_embeddings=True,
        name="qwen3-0.6b",
    ),
    "llama3.2-1b": ModelConfig(
        hidden=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        intermediate=8192,
        vocab=128256,
        max_context=131072,
        rope_theta=500000.0,
        tie_embeddings=True,
        name="llama3.2-1b",
    ),
    "llama2-7b": ModelConfig(
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=32,
        intermediate=11008,
        vocab=32000,
        max_context=4096,
        name="llama2-7b",
    ),
    "llama3-8b": ModelConfig(
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        vocab=128256,
        max_context=8192,
        rope_theta=500000.0,
        name="llama3-8b",
    ),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(PRESETS)
        raise UserError("--preset", f"unknown preset {name!r} (known: {known})") from None


# Hugging Face config.json keys -> ModelConfig fields.
HF_KEYS = {
    "hidden_size": "hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "intermediate_size": "intermediate",
    "vocab_size": "vocab",
    "max_position_embeddings": "max_context",
    "head_dim": "head_dim",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "norm_eps",
    "tie_word_embeddings": "tie_embeddings",
}


def from_hf_config(path: str | Path) -> ModelConfig:
    """Shapes from a Hugging Face config.json (weights are never loaded)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise UserError("--config", f"cannot read {path}: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError("--config", f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise UserError("--config", f"{path} does not hold a JSON object")
    raw = raw.get("text_config", raw)  # multimodal configs nest the language model
    missing = [
        k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads") if k not in raw
    ]
    if missing:
        raise UserError("--config", f"{path} lacks {', '.join(missing)}")
    fields = {f: raw[k] for k, f in HF_KEYS.items() if raw.get(k) is not None}
    _check_types(path, fields)
    return ModelConfig(name=raw.get("model_type", path.stem), **fields)


def _check_types(path: Path, fields: dict) -> None:
    for field, value in fields.items():
        if field == "tie_embeddings":
            ok = isinstance(value, bool)
        elif field in ("rope_theta", "norm_eps"):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            raise UserError("--config", f"{path}: {field} = {value!r} has the wrong type")
