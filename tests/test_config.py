import json

import pytest

from benchbatch.core.config import (
    ModelConfig,
    RopeScaling,
    preset,
    swiglu_intermediate,
)
from benchbatch.core.hfconfig import from_hf_config
from benchbatch.errors import UserError


def test_article_preset_is_12_layers_of_2048():
    cfg = preset("article")
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim) == (
        2048,
        12,
        16,
        16,
        128,
    )
    assert cfg.intermediate == 5632 == swiglu_intermediate(2048)  # 8/3 x 2048 = 5461.3 -> 5632


def test_overrides_derive_dependent_sizes_again():
    cfg = preset("article").replace(hidden=512, layers=4)
    assert (cfg.hidden, cfg.layers, cfg.head_dim, cfg.intermediate) == (512, 4, 32, 1536)
    gqa = preset("llama3-8b").replace(layers=2)
    assert (gqa.kv_heads, gqa.intermediate) == (8, 14336)  # published values kept


@pytest.mark.parametrize(
    "kwargs,option",
    [
        (dict(hidden=100, heads=3), "heads"),
        (dict(hidden=64, heads=4, kv_heads=3), "kv_heads"),
        (dict(hidden=0), "hidden"),
        (dict(layers=-1), "layers"),
        (dict(vocab=0), "vocab"),
    ],
)
def test_bad_shapes_name_the_option(kwargs, option):
    with pytest.raises(UserError) as err:
        ModelConfig(**kwargs)
    assert err.value.option == option


def test_unknown_preset():
    with pytest.raises(UserError, match="unknown preset 'gpt5'"):
        preset("gpt5")


def test_hf_config_json_without_model_type_is_a_plain_shape(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8}')
    cfg = from_hf_config(path)
    assert cfg == ModelConfig(hidden=512, layers=4, heads=8, name="config")


@pytest.mark.parametrize(
    "content,needle",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"hidden_size": 64}', "lacks num_hidden_layers"),
        (
            '{"hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 2}',
            "hidden_size: must be an integer, got 'big'",
        ),
    ],
)
def test_malformed_hf_config(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(UserError, match=needle) as err:
        from_hf_config(path)
    assert err.value.option == "--config"


def test_missing_hf_config(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        from_hf_config(tmp_path / "nope.json")


# --- presets against their published config.json ------------------------------------------
# Copied from the Hub (huggingface.co/<repo>/blob/main/config.json), as transformers 4 saved
# them: rope_theta at the top, rope_scaling beside it.

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "transformers_version": "4.31.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
LLAMA_3_70B = {  # meta-llama/Meta-Llama-3-70B
    **LLAMA_3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
HUB = {
    "qwen3-0.6b": QWEN3_0_6B,
    "llama3-70b": LLAMA_3_70B,
    "llama3.2-1b": LLAMA_3_2_1B,
    "llama3-8b": LLAMA_3_8B,
    "llama2-7b": LLAMA_2_7B,
}


def write_config(tmp_path, raw: dict, name: str = "config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


def transformers5_layout(raw: dict) -> dict:
    """The same config as transformers 5 saves it: theta and scaling in rope_parameters."""
    raw = dict(raw)
    params = raw.pop("rope_scaling") or {"rope_type": "default"}
    raw["rope_parameters"] = {**params, "rope_theta": raw.pop("rope_theta", 10000.0)}
    return raw


@pytest.mark.parametrize("name", list(HUB))
def test_preset_is_its_hub_config(tmp_path, name):
    cfg = from_hf_config(write_config(tmp_path, HUB[name]))
    assert cfg.replace(name=name) == preset(name)


@pytest.mark.parametrize("name", list(HUB))
def test_both_rope_layouts_read_the_same(tmp_path, name):
    old = from_hf_config(write_config(tmp_path, HUB[name], "old.json"))
    new = from_hf_config(write_config(tmp_path, transformers5_layout(HUB[name]), "new.json"))
    assert old == new


def test_faithful_fields_of_the_presets():
    qwen3, llama = preset("qwen3-0.6b"), preset("llama3.2-1b")
    assert (qwen3.qk_norm, qwen3.rope_theta, qwen3.head_dim, qwen3.tie_embeddings) == (
        True,
        1e6,
        128,
        True,
    )
    assert llama.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    assert llama.rope_theta == 500000.0 and not llama.qk_norm


def test_family_defaults_fill_absent_fields(tmp_path):
    base = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 32}
    qwen3 = from_hf_config(write_config(tmp_path, {**base, "model_type": "qwen3"}))
    # transformers' Qwen3Config: head_dim 128 and 32 KV heads unless given
    assert (qwen3.head_dim, qwen3.kv_heads, qwen3.norm_eps, qwen3.vocab) == (128, 32, 1e-6, 151936)
    llama = from_hf_config(write_config(tmp_path, {**base, "model_type": "llama"}))
    assert (llama.head_dim, llama.kv_heads, llama.intermediate, llama.max_context) == (
        8,
        32,
        11008,
        2048,
    )
    qwen2 = from_hf_config(write_config(tmp_path, {**base, "model_type": "qwen2"}))
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)


def test_llama_biases_follow_the_config(tmp_path):
    raw = {**LLAMA_3_8B, "attention_bias": True, "mlp_bias": True}
    cfg = from_hf_config(write_config(tmp_path, raw))
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (True, True, True)


def test_linear_rope_scaling_in_the_old_type_key(tmp_path):
    raw = {**LLAMA_2_7B, "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert from_hf_config(write_config(tmp_path, raw)).rope_scaling == RopeScaling("linear", 4.0)


def test_sliding_window_caps_the_context(tmp_path):
    mistral = {**LLAMA_2_7B, "model_type": "mistral", "num_key_value_heads": 8}
    mistral.update(max_position_embeddings=32768, sliding_window=4096)
    cfg = from_hf_config(write_config(tmp_path, mistral))
    assert (cfg.max_context, cfg.sliding_window) == (4096, 4096)
    with pytest.raises(UserError, match="sliding window of 4,096") as err:
        cfg.replace(max_context=8192)
    assert err.value.option == "max_context"
    none = from_hf_config(write_config(tmp_path, {**mistral, "sliding_window": None}))
    assert (none.max_context, none.sliding_window) == (32768, None)


@pytest.mark.parametrize(
    "changes,window",
    [
        (dict(use_sliding_window=False, sliding_window=1024), None),
        (dict(use_sliding_window=True, sliding_window=1024, max_window_layers=28), None),
        (dict(use_sliding_window=True, sliding_window=1024, max_window_layers=27), 1024),
        (dict(use_sliding_window=True, sliding_window=1024, layer_types=["full_attention"] * 28),
         None),
    ],
)  # fmt: skip
def test_qwen_sliding_window_layers(tmp_path, changes, window):
    cfg = from_hf_config(write_config(tmp_path, {**QWEN3_0_6B, **changes}))
    assert cfg.sliding_window == window
    assert cfg.max_context == (window or 40960)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(rope_theta=NAN), "rope_theta: must be a positive finite number, got nan"),
        (dict(rope_theta=-1), "rope_theta: must be a positive finite number, got -1"),
        (dict(rms_norm_eps=-1e-6), "rms_norm_eps: must be a positive finite number"),
        (dict(rms_norm_eps=INF), "rms_norm_eps: must be a positive finite number, got inf"),
        (dict(head_dim=0), "head_dim: must be a positive integer, got 0"),
        (dict(head_dim=63), "head_dim: 63 is odd"),
        (dict(num_key_value_heads=3), "num_key_value_heads: 16 attention heads do not split"),
        (dict(text_config=None), "text_config: must be an object, got None"),
        (dict(text_config=[1]), "text_config: must be an object"),
        (dict(model_type="gemma"), "model_type: 'gemma' is not a family benchbatch models"),
        (dict(hidden_act="gelu"), "hidden_act: 'gelu' is not modelled"),
        (dict(quantization_config={"quant_method": "awq"}), "quantization_config: quantized"),
        (dict(partial_rotary_factor=0.5), "partial_rotary_factor: 0.5: partial rotary"),
        (dict(tie_word_embeddings="yes"), "tie_word_embeddings: must be true or false"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling.rope_type: 'yarn'"),
        (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_scaling.type: 'dynamic'"),
        (dict(rope_scaling={"rope_type": "linear"}), "rope_scaling.factor: missing"),
        (dict(rope_scaling={"rope_type": "linear", "factor": NAN}), "rope_scaling.factor: must"),
        (dict(rope_scaling=[1]), "rope_scaling: must be an object or null"),
        (
            dict(rope_parameters={"rope_type": "default", "rope_theta": NAN}),
            "rope_parameters.rope_theta: must be a positive finite number, got nan",
        ),
        (
            dict(rope_parameters={"full_attention": {"rope_type": "default"}}),
            "rope_parameters: rotary parameters per layer type are not modelled",
        ),
        (
            dict(use_sliding_window=True, layer_types=["full_attention"]),
            "layer_types: must list 28 of",
        ),
    ],
)
def test_config_fields_that_change_the_computation_are_modelled_or_refused(
    tmp_path, changes, message
):
    raw = {**QWEN3_0_6B, **changes}
    if "rope_parameters" in changes:
        raw.pop("rope_theta")
    path = write_config(tmp_path, raw)
    with pytest.raises(UserError) as err:
        from_hf_config(path)
    assert err.value.option == "--config"
    assert str(err.value).startswith(f"--config: {path}: ")
    assert message in str(err.value)


@pytest.mark.parametrize(
    "scaling,message",
    [
        (dict(low_freq_factor=None), "rope_scaling.low_freq_factor: missing"),
        (dict(high_freq_factor=1.0), "rope_scaling.high_freq_factor: 1.0 must be more than"),
        (dict(factor=0.5), "rope_scaling.factor: must be at least 1, got 0.5"),
        (dict(original_max_position_embeddings=0), "original_max_position_embeddings: must be"),
    ],
)
def test_bad_llama3_scaling_is_refused(tmp_path, scaling, message):
    rope = {k: v for k, v in {**LLAMA_3_2_1B["rope_scaling"], **scaling}.items() if v is not None}
    path = write_config(tmp_path, {**LLAMA_3_2_1B, "rope_scaling": rope})
    with pytest.raises(UserError, match=message):
        from_hf_config(path)


def test_llama3_original_context_falls_back_to_max_positions(tmp_path):
    rope = dict(LLAMA_3_2_1B["rope_scaling"])
    del rope["original_max_position_embeddings"]
    cfg = from_hf_config(write_config(tmp_path, {**LLAMA_3_2_1B, "rope_scaling": rope}))
    assert cfg.rope_scaling.original_max_context == 131072


def test_config_errors_name_the_option_given(tmp_path):
    path = write_config(tmp_path, {**QWEN3_0_6B, "rope_theta": NAN})
    with pytest.raises(UserError) as err:
        from_hf_config(path, option="--model")
    assert err.value.option == "--model"
