"""The model's shape and computation: one dataclass, named presets, a config.json reader.

A ModelConfig says everything that changes what the model computes (sizes, q/k norm, biases,
rotary frequencies), so that a preset or a Hugging Face config.json builds the same model as
transformers does. Weights are random unless a checkpoint is loaded (benchbatch.runtime.checkpoint).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from benchbatch.errors import UserError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def swiglu_intermediate(hidden: int) -> int:
    """Llama's rule: 8/3 x hidden, rounded up to a multiple of 256."""
    return 256 * math.ceil(8 * hidden / 3 / 256)


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequencies rescaled for long contexts, as transformers computes them.

    linear: every frequency divided by factor. llama3 (Llama 3.1 and 3.2): frequencies whose
    wavelength exceeds original_max_context / low_freq_factor divided by factor, those below
    original_max_context / high_freq_factor kept, the band between interpolated.
    """

    type: str  # "linear" or "llama3"
    factor: float
    low_freq_factor: float | None = None  # llama3 only
    high_freq_factor: float | None = None  # llama3 only
    original_max_context: int | None = None  # llama3 only

    def __post_init__(self) -> None:
        # Values are checked where they are read (config.json): a bad one here is a bug.
        llama3 = (self.low_freq_factor, self.high_freq_factor, self.original_max_context)
        if self.type == "linear":
            ok = all(v is None for v in llama3)
        elif self.type == "llama3":
            ok = None not in llama3 and self.high_freq_factor > self.low_freq_factor > 0
        else:
            ok = False
        if not ok or not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"invalid rope scaling: {self}")


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
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's queries and keys, before rotary
    qkv_bias: bool = False  # Qwen2: the q, k and v projections add a bias
    o_bias: bool = False  # the output projection adds a bias (Llama's attention_bias)
    mlp_bias: bool = False  # gate, up and down add a bias (Llama's mlp_bias)
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None  # keys a query sees; max_context may not pass it
    name: str = "custom"

    def __post_init__(self) -> None:
        for field in ("hidden", "layers", "heads", "vocab", "max_context"):
            if getattr(self, field) <= 0:
                raise UserError(field, "must be a positive integer")
        if isinstance(self.rope_scaling, dict):  # from asdict() in replace()
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.intermediate is None:
            object.__setattr__(self, "intermediate", swiglu_intermediate(self.hidden))
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise UserError(
                    "heads", f"hidden {self.hidden} is not divisible by heads {self.heads}"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        self._check_derived()
        self._check_window()
        for field in ("rope_theta", "norm_eps"):  # read and checked from config.json
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{field} must be a positive finite number, got {value}")

    def _check_derived(self) -> None:
        for field, option in (("kv_heads", "kv_heads"), ("intermediate", "intermediate")):
            if getattr(self, field) <= 0:
                raise UserError(option, "must be a positive integer")
        if self.head_dim <= 0:
            raise UserError("heads", f"head_dim must be positive, got {self.head_dim}")
        if self.heads % self.kv_heads:
            raise UserError(
                "kv_heads", f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}"
            )
        if self.head_dim % 2:
            raise UserError("heads", f"head_dim {self.head_dim} must be even for rotary")

    def _check_window(self) -> None:
        window = self.sliding_window
        if window is not None and self.max_context > window:
            raise UserError(
                "max_context",
                f"{self.max_context:,} is more than the model's sliding window of {window:,} "
                "tokens (past it attention is windowed, which benchbatch does not model)",
            )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def windowed(self) -> bool:
        """The context is the sliding window's (a checkpoint's max_context capped by it)."""
        return self.sliding_window is not None and self.max_context == self.sliding_window

    def context_limit(self) -> str:
        """What caps the context, as an error line says it."""
        if self.windowed():
            return (
                f"the sliding window's {self.max_context:,} tokens (config.json's "
                "sliding_window: benchbatch runs windowed attention only within it)"
            )
        return f"--max-context {self.max_context:,}"

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


# Real models exactly as their published config.json describes them (tests/test_config.py
# reads a copy of each through hfconfig.from_hf_config and compares), plus the articles' 12 x 2048
# and a tiny one for tests.
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
        max_context=4096,  # every command's defaults fit (phases prefills 2,048 tokens)
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
        qk_norm=True,
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
        rope_scaling=RopeScaling(
            "llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_context=8192,
        ),
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
    "llama3-70b": ModelConfig(
        hidden=8192,
        layers=80,
        heads=64,
        kv_heads=8,
        intermediate=28672,
        vocab=128256,
        max_context=8192,
        rope_theta=500000.0,
        name="llama3-70b",
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


def named_shape(base: ModelConfig, built: ModelConfig, given: dict) -> ModelConfig:
    """`built` (base with the sizes `given` on the command line) named for what it is: the
    base's name when no size differs from it, else "article with hidden 1024, layers 2"."""
    changed = [f"{k.replace('_', ' ')} {v}" for k, v in given.items() if getattr(base, k) != v]
    name = base.name if not changed else f"{base.name} with {', '.join(changed)}"
    return built if built.name == name else dataclasses.replace(built, name=name)


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(PRESETS)
        raise UserError("preset", f"unknown preset {name!r} (known: {known})") from None
