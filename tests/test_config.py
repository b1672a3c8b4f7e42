import json

import pytest

from benchbatch.config import ModelConfig, from_hf_config, preset, swiglu_intermediate
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
        (dict(hidden=100, heads=3), "--heads"),
        (dict(hidden=64, heads=4, kv_heads=3), "--kv-heads"),
        (dict(hidden=0), "--hidden"),
        (dict(layers=-1), "--layers"),
        (dict(vocab=0), "--vocab"),
    ],
)
def test_bad_shapes_name_the_option(kwargs, option):
    with pytest.raises(UserError) as err:
        ModelConfig(**kwargs)
    assert err.value.option == option


def test_unknown_preset():
    with pytest.raises(UserError, match="unknown preset 'gpt5'"):
        preset("gpt5")


def test_hf_config_json_is_read_for_shapes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
                "max_position_embeddings": 8192,
                "rope_theta": 500000.0,
                "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
            }
        )
    )
    cfg = from_hf_config(path)
    assert cfg.replace(name="llama3-8b") == preset("llama3-8b")


@pytest.mark.parametrize(
    "content,needle",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"hidden_size": 64}', "lacks num_hidden_layers"),
        ('{"hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 2}', "wrong type"),
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
