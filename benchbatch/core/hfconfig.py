"""A Hugging Face config.json read as the computation it describes: modelled or refused.

transformers builds Llama, Mistral, Qwen2 and Qwen3 from the same few fields, but each family
has its own defaults for the fields a config.json leaves out, and reads a few of its own:
Qwen3's per-head q/k norm, Qwen2's q/k/v bias, Mistral's sliding window. Here every field
that changes what the model computes is either modelled (a ModelConfig field) or refused in
one line naming the file and the field: a number for a different model is worse than none.
Fields that only matter for training or generation (dropout, initializer_range, token ids,
the stored dtype) change nothing benchbatch computes and are not read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from benchbatch.core.config import ModelConfig, RopeScaling
from benchbatch.errors import UserError

INT_MAX = 2**63 - 1  # sizes end in torch shapes: 64 bits at most


@dataclass(frozen=True)
class Family:
    """What transformers reads for one model_type, and its defaults for absent fields."""

    defaults: dict = field(default_factory=dict)
    bias: str = "config"  # config: attention_bias (q, k, v, o); qkv: q, k, v always; none
    mlp_bias: bool = False  # reads mlp_bias
    qk_norm: bool = False
    window: str | None = None  # all: sliding_window on every layer; layers: Qwen's rule


_QWEN = {
    "vocab_size": 151936,
    "intermediate_size": 22016,
    "num_key_value_heads": 32,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "sliding_window": 4096,
    "max_window_layers": 28,
}

# The defaults of transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config.
FAMILIES: dict[str, Family] = {
    "llama": Family(
        {"vocab_size": 32000, "intermediate_size": 11008, "max_position_embeddings": 2048}
        | {"rms_norm_eps": 1e-6},
        mlp_bias=True,
    ),
    "mistral": Family(
        {"vocab_size": 32000, "intermediate_size": 14336, "num_key_value_heads": 8}
        | {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "sliding_window": 4096},
        bias="none",
        window="all",
    ),
    "qwen2": Family(_QWEN, bias="qkv", window="layers"),
    "qwen3": Family(_QWEN | {"head_dim": 128}, qk_norm=True, window="layers"),
}
# A config.json without model_type is a shape description, not a Hugging Face model:
# ModelConfig's own defaults fill it, and it computes as a Llama.
SHAPE_ONLY = Family()

HIDDEN_ACTS = ("silu", "swish")  # the same function under two names
ROPE_TYPES = ("default", "linear", "llama3")


def load_json(path: Path, option: str) -> dict:
    """A JSON object from a file, or a UserError naming the option and the file (a FIFO, a
    byte-order mark, endless nesting or huge integers included: benchbatch.core.inputs)."""
    from benchbatch.core.inputs import read_json_object

    return read_json_object(path, option)


class Fields:
    """Typed reads of one JSON object's fields; every complaint names the file and field."""

    def __init__(self, raw: dict, path: Path, option: str, defaults=None, prefix: str = ""):
        self.raw, self.path, self.option = raw, path, option
        self.defaults, self.prefix = defaults or {}, prefix

    def fail(self, key: str, message: str) -> NoReturn:
        raise UserError(self.option, f"{self.path}: {self.prefix}{key}: {message}")

    def get(self, key: str):
        """The value (None for an explicit null), or the family's default when absent."""
        return self.raw[key] if key in self.raw else self.defaults.get(key)

    def integer(self, key: str, minimum: int = 1) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be an integer, got {_short(value)}")
        if not minimum <= value <= INT_MAX:
            kind = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
            self.fail(key, f"must be {kind}, got {value}")
        return value

    def number(
        self, key: str, default: float | None = None, most: float = 1e12, least: float = 0.0
    ) -> float | None:
        """A finite number in (least, most] (JSON allows NaN and Infinity: they are refused;
        so is a value no model uses, which would only overflow the rotary tables)."""
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(key, f"must be a number, got {_short(value)}")
        if not (math.isfinite(value) and value > 0):
            self.fail(key, f"must be a positive finite number, got {value}")
        if not least < value <= most:
            self.fail(key, f"must be more than {least:g} and at most {most:g}, got {value:g}")
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_short(value)}")
        return value


def _short(value) -> str:
    """A value for an error line, cut short."""
    from benchbatch.core.inputs import short

    try:
        text = repr(value)
    except RecursionError:
        text = type(value).__name__
    return short(text)


def read_config(path: Path, option: str = "--config", name: str | None = None) -> ModelConfig:
    """The model a config.json describes, exactly as transformers would build it."""
    top = load_json(path, option)
    raw = language_model(top, path, option)
    model_type = raw.get("model_type")
    family = _family(model_type, path, option)
    f = Fields(raw, path, option, family.defaults)
    _refuse_unmodelled(f, Fields(top, path, option))
    sizes = _sizes(f)
    theta, scaling = _rope(f, sizes.get("max_context"))
    window = _window(f, family, sizes["layers"])
    if window is not None and sizes.get("max_context", window + 1) > window:
        sizes["max_context"] = window  # up to the window, windowed attention is plain causal
    qkv_bias = family.bias == "qkv" or (family.bias == "config" and f.flag("attention_bias"))
    fields = dict(
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=f.number("rms_norm_eps", default=ModelConfig.norm_eps, most=1),
        tie_embeddings=f.flag("tie_word_embeddings"),
        qk_norm=family.qk_norm,
        qkv_bias=qkv_bias,
        o_bias=family.bias == "config" and qkv_bias,
        mlp_bias=family.mlp_bias and f.flag("mlp_bias"),
        sliding_window=window,
        name=name or (model_type if isinstance(model_type, str) else path.stem),
    )
    _check_shapes(f, sizes)
    try:
        return ModelConfig(**sizes, **fields)
    except UserError as e:  # a rule of ModelConfig's that the checks above do not spell out
        raise UserError(option, f"{path}: {e.message}") from None


def language_model(raw: dict, path: Path, option: str) -> dict:
    """Multimodal configs nest the language model under text_config."""
    if "text_config" not in raw:
        return raw
    text = raw["text_config"]
    if not isinstance(text, dict):
        Fields(raw, path, option).fail("text_config", f"must be an object, got {_short(text)}")
    return text


def _family(model_type, path: Path, option: str) -> Family:
    if model_type is None:
        return SHAPE_ONLY
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        known = ", ".join(FAMILIES)
        Fields({}, path, option).fail(
            "model_type", f"{_short(model_type)} is not a family benchbatch models ({known})"
        )
    return FAMILIES[model_type]


HF_SIZES = {
    "hidden_size": "hidden",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "intermediate_size": "intermediate",
    "vocab_size": "vocab",
    "max_position_embeddings": "max_context",
    "head_dim": "head_dim",
}


REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads")


def _sizes(f: Fields) -> dict:
    """The integer sizes that are set (absent ones are left to ModelConfig's defaults)."""
    missing = [key for key in REQUIRED if key not in f.raw]
    if missing:
        raise UserError(f.option, f"{f.path} lacks {', '.join(missing)}")
    values = {field: f.integer(key) for key, field in HF_SIZES.items()}
    for key in REQUIRED:
        if values[HF_SIZES[key]] is None:
            f.fail(key, "must be a positive integer, got null")
    return {field: value for field, value in values.items() if value is not None}


def _check_shapes(f: Fields, s: dict) -> None:
    """ModelConfig's rules in config.json's words, so the message names the field."""
    heads = s["heads"]
    kv_heads = s.get("kv_heads", heads)
    if heads % kv_heads:
        f.fail("num_key_value_heads", f"{heads} attention heads do not split into {kv_heads}")
    if "head_dim" not in s and s["hidden"] % heads:
        f.fail("num_attention_heads", f"hidden_size {s['hidden']} does not split into {heads}")
    head_dim = s.get("head_dim", s["hidden"] // heads)
    if head_dim % 2:
        f.fail("head_dim", f"{head_dim} is odd: rotary embeddings rotate pairs")


def _refuse_unmodelled(f: Fields, top: Fields) -> None:
    """Fields that change the computation in ways benchbatch does not model."""
    act = f.get("hidden_act")
    if act is not None and act not in HIDDEN_ACTS:
        f.fail("hidden_act", f"{_short(act)} is not modelled (the MLP is SwiGLU: silu)")
    for fields in (f, top):
        if fields.raw.get("quantization_config") is not None:
            fields.fail(
                "quantization_config",
                "quantized models are not modelled (benchbatch runs fp32, fp16 or bf16 weights)",
            )
    partial = f.get("partial_rotary_factor")
    if partial is not None and partial != 1:
        f.fail("partial_rotary_factor", f"{_short(partial)}: partial rotary is not modelled")


def _rope(f: Fields, max_position: int | None) -> tuple[float, RopeScaling | None]:
    """theta and scaling from either layout: rope_theta beside rope_scaling (transformers 4)
    or both inside rope_parameters (5). As in transformers, a value inside the dict wins."""
    key = "rope_scaling" if f.raw.get("rope_scaling") else "rope_parameters"
    params = f.raw.get(key) or {}
    if not isinstance(params, dict):
        f.fail(key, f"must be an object or null, got {_short(params)}")
    if any(isinstance(v, dict) for v in params.values()):
        f.fail(key, "rotary parameters per layer type are not modelled")
    p = Fields(params, f.path, f.option, prefix=f"{key}.")
    theta = p.number("rope_theta", least=1) or f.number("rope_theta", 10000.0, least=1)
    partial = p.get("partial_rotary_factor")
    if partial is not None and partial != 1:
        p.fail("partial_rotary_factor", f"{_short(partial)}: partial rotary is not modelled")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        which = "rope_type" if "rope_type" in params else "type"
        p.fail(which, f"{_short(kind)} is not modelled (benchbatch models {', '.join(ROPE_TYPES)})")
    if kind == "default":
        return theta, None
    factor = _factor(p)
    if kind == "linear":
        return theta, RopeScaling("linear", factor)
    return theta, _llama3(f, p, factor, max_position)


def _factor(p: Fields) -> float:
    factor = p.number("factor")
    if factor is None:
        p.fail("factor", "missing: the scaling needs it")
    if factor < 1:
        p.fail("factor", f"must be at least 1, got {factor}")
    return factor


def _llama3(f: Fields, p: Fields, factor: float, max_position: int | None) -> RopeScaling:
    low, high = p.number("low_freq_factor"), p.number("high_freq_factor")
    for key, value in (("low_freq_factor", low), ("high_freq_factor", high)):
        if value is None:
            p.fail(key, "missing: llama3 scaling needs it")
    if high <= low:
        p.fail("high_freq_factor", f"{high} must be more than low_freq_factor {low}")
    # transformers: a top-level original_max_position_embeddings wins, then the dict's,
    # then max_position_embeddings.
    original = f.integer("original_max_position_embeddings")
    original = original or p.integer("original_max_position_embeddings") or max_position
    if original is None:
        p.fail("original_max_position_embeddings", "missing: llama3 scaling needs it")
    return RopeScaling("llama3", factor, low, high, original)


def _window(f: Fields, family: Family, layers: int) -> int | None:
    """The sliding window some layer attends through, or None. A family without one (Llama)
    given a window's fields is refused: transformers' own cache windows its decodes then,
    while its prefill stays causal, so no one computation is transformers'."""
    if family.window is None and family is not SHAPE_ONLY:
        types = f.raw.get("layer_types")
        windowed = [k for k in ("sliding_window", "attention_chunk_size")
                    if f.raw.get(k) is not None]  # fmt: skip
        if isinstance(types, list) and any(t != "full_attention" for t in types):
            windowed.append("layer_types")
        if windowed:
            f.fail(windowed[0], "a sliding window or chunked attention is not modelled for "
                   "this model_type")  # fmt: skip
    if family.window == "all":
        return f.integer("sliding_window")
    if family.window != "layers" or not f.flag("use_sliding_window"):
        return None
    window = f.integer("sliding_window")
    types = f.get("layer_types")
    if types is None:
        first = f.integer("max_window_layers", minimum=0)
        if first is None:
            f.fail("max_window_layers", "must be an integer with use_sliding_window, got null")
        return window if first < layers else None
    known = ("full_attention", "sliding_attention")
    if not isinstance(types, list) or len(types) != layers or any(t not in known for t in types):
        f.fail("layer_types", f"must list {layers} of {', '.join(known)}")
    return window if "sliding_attention" in types else None


def from_hf_config(path: str | Path, option: str = "--config") -> ModelConfig:
    """The model a Hugging Face config.json describes."""
    return read_config(Path(path), option)
