"""Checkpoints saved by transformers load into benchbatch's model and compute the same logits.

Tiny Llama, Mistral, Qwen2 and Qwen3 models with random weights (norms and biases too, so
every parameter matters) are saved with save_pretrained as safetensors, one of them sharded,
loaded with benchbatch.runtime.checkpoint and compared with transformers' forward: prefill logits,
five cached decode steps, greedy tokens. Then the ways a checkpoint can be wrong.
"""

import inspect
import json

import pytest
import torch

from benchbatch.core.config import preset
from benchbatch.errors import UserError
from benchbatch.runtime import checkpoint
from benchbatch.runtime.rotary import rotary_tables

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=64,  # with head_dim 16, some pairs in each band
)
FAMILIES = {
    "llama3": ("Llama", dict(rope_parameters=LLAMA3_ROPE)),
    "llama-bias": (
        "Llama",
        dict(
            attention_bias=True,
            mlp_bias=True,
            rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=10000.0),
        ),
    ),
    "mistral": ("Mistral", dict(sliding_window=None, tie_word_embeddings=True)),
    "qwen2": ("Qwen2", dict(tie_word_embeddings=True)),
    "qwen3": (
        "Qwen3",
        dict(head_dim=32, rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    ),
}
TOL = dict(rtol=1e-4, atol=1e-5)


def hf_model(family: str, seed: int = 0, **changes):
    name, extra = FAMILIES[family]
    config = getattr(transformers, f"{name}Config")(**{**TINY, **extra, **changes})
    torch.manual_seed(seed)
    model = getattr(transformers, f"{name}ForCausalLM")(config).eval()
    with torch.no_grad():  # norms at 1 and biases at 0 would hide a missed parameter
        for pname, p in model.named_parameters():
            p.normal_(1.0 if "norm" in pname else 0.0, 0.2 if "norm" in pname else 0.1)
    return model


def save(model, path, **kwargs):
    model.save_pretrained(path, **kwargs)
    return path


@pytest.fixture(params=list(FAMILIES))
def pair(request, tmp_path):
    """A transformers model and the same checkpoint loaded by benchbatch (qwen3 sharded)."""
    family = request.param
    hf = hf_model(family)
    shard = {"max_shard_size": "40KB"} if family == "qwen3" else {}
    folder = save(hf, tmp_path / family, **shard)
    if family == "qwen3":
        assert (folder / "model.safetensors.index.json").is_file()
        assert len(list(folder.glob("*.safetensors"))) > 3
    ours, cfg = checkpoint.load(folder, "cpu", torch.float32)
    return hf, ours, cfg


PROMPTS = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def test_prefill_logits_equal_transformers(pair):
    hf, ours, _ = pair
    torch.testing.assert_close(ours(PROMPTS), hf(PROMPTS).logits, **TOL)


def cache_keyword(hf) -> str:
    """The forward's name for the KV cache: `cache` from transformers 5.25 on (its
    `past_key_values` is deprecated there), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


def cache_of(out):
    """The cache a forward returned, under either name."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


@torch.no_grad()
def test_cached_decode_and_greedy_tokens_equal_transformers(pair):
    hf, ours, _ = pair
    out = hf(PROMPTS, use_cache=True)
    past, theirs_logits = cache_of(out), [out.logits[:, -1:]]
    cache = ours.new_cache(2, 32)
    our_logits = [ours.step(PROMPTS, cache, slice(0, 2))]
    theirs_tokens, our_tokens = [], []
    for _ in range(5):
        theirs_tokens.append(theirs_logits[-1].argmax(-1))
        our_tokens.append(our_logits[-1].argmax(-1))
        out = hf(theirs_tokens[-1], use_cache=True, **{cache_keyword(hf): past})
        past = cache_of(out)
        theirs_logits.append(out.logits)
        our_logits.append(ours.step(our_tokens[-1], cache, slice(0, 2)))
    torch.testing.assert_close(torch.cat(our_logits, 1), torch.cat(theirs_logits, 1), **TOL)
    assert torch.equal(torch.cat(our_tokens, 1), torch.cat(theirs_tokens, 1))


def test_the_config_read_is_the_families(pair):
    hf, _, cfg = pair
    c = hf.config
    assert (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads) == (64, 2, 4, 2)
    assert (
        cfg.head_dim == (getattr(c, "head_dim", None) or 16)
        and cfg.tie_embeddings == c.tie_word_embeddings
    )
    assert cfg.qk_norm == (c.model_type == "qwen3")
    assert cfg.qkv_bias == (c.model_type == "qwen2" or getattr(c, "attention_bias", False))


def test_both_rope_layouts_give_the_same_model(tmp_path):
    """transformers 5 nests theta and scaling in rope_parameters; 4 kept rope_theta at the
    top and rope_scaling beside it. Both files must build the same model."""
    folder = save(hf_model("llama3"), tmp_path / "m")
    new, _ = checkpoint.load(folder, "cpu", torch.float32)
    raw = json.loads((folder / "config.json").read_text())
    params = raw.pop("rope_parameters")
    raw["rope_theta"] = params.pop("rope_theta")
    raw["rope_scaling"] = params
    (folder / "config.json").write_text(json.dumps(raw))
    old, cfg = checkpoint.load(folder, "cpu", torch.float32)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling.type == "llama3"
    assert torch.equal(old(PROMPTS), new(PROMPTS))


@pytest.mark.parametrize("name", ["llama3.2-1b", "qwen3-0.6b", "llama3-8b"])
def test_rotary_tables_equal_transformers_bit_for_bit(name):
    cfg = preset(name)
    rope = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope.update(rope_type=s.type, factor=s.factor, low_freq_factor=s.low_freq_factor)
        rope.update(high_freq_factor=s.high_freq_factor)
        rope.update(original_max_position_embeddings=s.original_max_context)
    config = transformers.LlamaConfig(
        hidden_size=cfg.hidden,
        num_attention_heads=cfg.heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_context,
        rope_parameters=rope,
    )
    embedding = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)
    positions = torch.tensor([[0, 1, 7, 1000, 8191, cfg.max_context - 1]])
    cos, sin = embedding(torch.zeros(1, dtype=torch.float32), positions)
    ours_cos, ours_sin = rotary_tables(cfg, "cpu", torch.float32)
    half = cfg.head_dim // 2
    assert torch.equal(ours_cos[positions[0]], cos[0, :, :half])
    assert torch.equal(ours_sin[positions[0]], sin[0, :, :half])


def test_loading_draws_no_random_weights(tmp_path, monkeypatch):
    from benchbatch.runtime.model import Transformer

    monkeypatch.setattr(Transformer, "randomize", lambda *a: pytest.fail("randomized"))
    folder = save(hf_model("qwen2"), tmp_path / "m")
    model, _ = checkpoint.load(folder, "cpu", torch.float32)
    assert model.lm_head.weight is model.embed.weight


def test_load_in_half_precision_converts_each_tensor(tmp_path):
    hf = hf_model("qwen3")
    folder = save(hf, tmp_path / "m")
    model, _ = checkpoint.load(folder, "cpu", torch.bfloat16, max_context=64)
    assert model.embed.weight.dtype == torch.bfloat16 and model.rope_cos.shape == (64, 16)
    want = hf.model.layers[1].self_attn.k_proj.weight.to(torch.bfloat16)
    assert torch.equal(model.blocks[1].attention.wqkv.weight[128:192], want)


# --- what is refused ----------------------------------------------------------------------


def refused(folder, match: str, option: str = "--model"):
    with pytest.raises(UserError, match=match) as err:
        checkpoint.load(folder, "cpu", torch.float32)
    assert err.value.option == option and "\n" not in str(err.value)
    return err.value


@pytest.fixture
def saved(tmp_path):
    return save(hf_model("llama3"), tmp_path / "m")


def rewrite(folder, change):
    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    change(tensors)
    safetensors_torch.save_file(tensors, path)


def test_missing_tensor(saved):
    rewrite(saved, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    refused(saved, "lacks model.layers.1.mlp.down_proj.weight, which the config's model needs")


def test_extra_tensor(saved):
    rewrite(saved, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}))
    refused(saved, "holds model.layers.0.mlp.extra.weight, which the config's model has no place")


def test_wrong_shape(saved):
    rewrite(
        saved, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 64)})
    )
    refused(
        saved, r"k_proj.weight in model.safetensors has shape \[8, 64\], the config says \[32, 64\]"
    )


def test_unloadable_dtype(saved):
    rewrite(saved, lambda t: t.update({"model.norm.weight": torch.zeros(64, dtype=torch.int8)}))
    refused(saved, "model.norm.weight is stored as I8; benchbatch loads F32, F16 and BF16")


def test_values_beyond_fp16_are_refused_in_fp16(saved):
    rewrite(saved, lambda t: t["model.norm.weight"].fill_(1e6))
    with pytest.raises(UserError, match="model.norm.weight holds values beyond fp16's range"):
        checkpoint.load(saved, "cpu", torch.float16)


def test_unknown_architecture(saved):
    raw = json.loads((saved / "config.json").read_text())
    raw.update(architectures=["GemmaForCausalLM"], model_type="gemma")
    (saved / "config.json").write_text(json.dumps(raw))
    refused(saved, "architectures: 'GemmaForCausalLM' is not one benchbatch loads")


def test_a_tied_checkpoint_may_store_its_head_only_if_equal(tmp_path):
    folder = save(hf_model("qwen2"), tmp_path / "m")
    embed = safetensors_torch.load_file(folder / "model.safetensors")["model.embed_tokens.weight"]
    rewrite(folder, lambda t: t.update({"lm_head.weight": embed.clone()}))
    checkpoint.load(folder, "cpu", torch.float32)
    rewrite(folder, lambda t: t.update({"lm_head.weight": embed + 1}))
    refused(folder, "lm_head.weight differs from model.embed_tokens.weight")


def test_a_hub_id_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused("Qwen/Qwen3-0.6B", "downloads nothing")
    assert "hf download Qwen/Qwen3-0.6B --local-dir Qwen3-0.6B" in err.message


def test_folders_that_are_not_checkpoints(tmp_path, saved):
    refused(tmp_path / "nope", "no such folder")
    refused(saved / "config.json", "is a file; give the folder")
    (saved / "model.safetensors").rename(saved / "pytorch_model.bin")
    refused(saved, "holds PyTorch .bin weights; benchbatch reads safetensors only")
    (saved / "config.json").unlink()
    refused(saved, "has no config.json")


def test_end_of_sequence_ids(tmp_path, saved):
    assert checkpoint.eos_token_ids(saved) == {2}  # LlamaConfig's default, in config.json
    (saved / "generation_config.json").write_text('{"eos_token_id": [5, 9]}')
    assert checkpoint.eos_token_ids(saved) == {5, 9}
    (saved / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(UserError, match="eos_token_id: not token ids"):
        checkpoint.eos_token_ids(saved)


def test_a_checkpoint_with_no_eos_the_model_makes_is_served_without_one(tmp_path, saved):
    """benchbatch serve (required=False): no eos_token_id, or one outside the vocabulary
    (transformers 5 writes null for Qwen3), serves to max_tokens; --stop-at-eos refuses."""
    (saved / "generation_config.json").write_text('{"eos_token_id": [5, 900]}')
    assert checkpoint.eos_token_ids(saved, 128, required=False) == {5}
    with pytest.raises(UserError, match="outside the model's vocabulary"):
        checkpoint.eos_token_ids(saved, 128)
    (saved / "generation_config.json").write_text('{"eos_token_id": 900}')
    assert checkpoint.eos_token_ids(saved, 128, required=False) == frozenset()
    (saved / "generation_config.json").write_text('{"eos_token_id": null}')
    raw = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps(raw | {"eos_token_id": None}))
    assert checkpoint.eos_token_ids(saved, 128, required=False) == frozenset()
    with pytest.raises(UserError, match="no eos_token_id"):
        checkpoint.eos_token_ids(saved, 128)
    from benchbatch.core.options import ModelOptions
    from benchbatch.experiments.server.run import _stop_tokens

    said = []
    rec = type("Rec", (), {"warning": lambda self, text: said.append(text)})()
    assert _stop_tokens(rec, ModelOptions(model=str(saved)), 128) == frozenset()
    assert len(said) == 1 and "every request runs to its max_tokens" in said[0]


def test_a_single_file_beside_an_index_is_refused(tmp_path):
    """A sharded save over a single one leaves both: transformers loads model.safetensors,
    vLLM the index's shards (benchbatch served the shards: other weights than transformers',
    unsaid)."""
    folder = save(hf_model("llama3", seed=1), tmp_path / "m")
    save(hf_model("llama3", seed=0), folder, max_shard_size="40KB")
    assert (folder / "model.safetensors").is_file()
    assert (folder / "model.safetensors.index.json").is_file()
    refused(folder, "holds both model.safetensors and model.safetensors.index.json")


@pytest.mark.parametrize("change", [
    {"sliding_window": 8},
    {"attention_chunk_size": 8},
    {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8},
])  # fmt: skip
def test_a_llama_config_with_a_window_is_refused(saved, change):
    """Llama with a window's fields: transformers' cache windows its decodes while its
    prefill stays causal (its generate() with and without the cache disagree); benchbatch
    ran it unwindowed, unsaid."""
    raw = json.loads((saved / "config.json").read_text())
    (saved / "config.json").write_text(json.dumps(raw | change))
    refused(saved, "sliding window or chunked attention is not modelled")
    plain = raw | {"sliding_window": None, "layer_types": ["full_attention"] * 2}
    (saved / "config.json").write_text(json.dumps(plain))
    checkpoint.load(saved, "cpu", torch.float32)


def test_a_context_capped_by_the_sliding_window_says_so(tmp_path):
    """Mistral with a window under max_position_embeddings: the context is the window's,
    and the refusal of a longer one names it (it said "the checkpoint's 8 positions" of a
    config that says 256)."""
    from benchbatch.experiments.fields import check_context

    folder = save(hf_model("mistral", sliding_window=8), tmp_path / "m")
    cfg = checkpoint.read_config(folder)
    assert cfg.max_context == 8 and cfg.windowed()
    with pytest.raises(UserError, match="more than the checkpoint's 8 positions .its sliding_"):
        checkpoint.load(folder, "cpu", torch.float32, max_context=100)
    with pytest.raises(UserError, match="12 \\+ 1 new token exceeds the sliding window's 8"):
        check_context(cfg, (12,))


def test_stored_dtype(saved):
    assert checkpoint.stored_dtype(saved) == "fp32"


# --- on a GPU (skipped without CUDA) -------------------------------------------------------


@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize(
    "dtype,tol",
    [(torch.float32, dict(rtol=1e-4, atol=1e-4)), (torch.bfloat16, dict(rtol=0.05, atol=0.1))],
)
def test_loads_on_cuda_and_matches_transformers(tmp_path, dtype, tol):
    hf = hf_model("qwen3")
    folder = save(hf, tmp_path / "m", max_shard_size="40KB")
    ours, _ = checkpoint.load(folder, "cuda", dtype)
    assert ours.embed.weight.device.type == "cuda" and ours.embed.weight.dtype == dtype
    hf = hf.to("cuda", dtype)
    prompts = PROMPTS.cuda()
    ref = hf(prompts).logits.float()
    # bf16: rounding differs with the order of operations (about 0.05 on CPU)
    torch.testing.assert_close(ours(prompts).float(), ref, **tol)


@pytest.mark.gpu
def test_rotary_tables_on_cuda_equal_transformers():
    cfg = preset("llama3.2-1b")
    s = cfg.rope_scaling
    config = transformers.LlamaConfig(
        hidden_size=cfg.hidden,
        num_attention_heads=cfg.heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_context,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=cfg.rope_theta,
            factor=s.factor,
            low_freq_factor=s.low_freq_factor,
            high_freq_factor=s.high_freq_factor,
            original_max_position_embeddings=s.original_max_context,
        ),
    )
    embedding = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config).cuda()
    positions = torch.tensor([[0, 1, 7, 1000, 8191, cfg.max_context - 1]], device="cuda")
    cos, _ = embedding(torch.zeros(1, device="cuda", dtype=torch.bfloat16), positions)
    ours, _ = rotary_tables(cfg, "cuda", torch.bfloat16)
    assert torch.equal(ours[positions[0]], cos[0, :, : cfg.head_dim // 2])
