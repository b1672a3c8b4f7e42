"""The user's own model: a local Hugging Face folder (config.json + safetensors weights).

Llama, Mistral, Qwen2 and Qwen3 checkpoints map onto benchbatch's fused layout (wqkv is
[q | k | v] by rows, w13 is [gate | up]); anything else is refused by name. Nothing is
downloaded. The weights are read with safetensors, memory-mapped, one tensor at a time,
copied straight into the model's parameters on the device and in the run's dtype, so a
sharded checkpoint is never held whole in host memory; the model is built without random
initialization (Transformer(init=False)) so no time goes into weights that are overwritten.
Every problem (no such folder, a Hub id, missing, extra or misshapen tensors, a dtype the
device cannot run, a corrupt safetensors file) is one line naming --model, and all that
the headers and config tell is checked (check()) before a run's folder exists.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

import torch

from benchbatch.core import hfconfig
from benchbatch.core.checkpoint_config import (  # noqa: F401  (the checkpoint's config)
    ARCHITECTURES,
    CONFIG_DTYPES,
    HUB_ID,
    OPTION,
    eos_token_ids,
    fail,
    folder,
    read_config,
    stored_dtype,
)
from benchbatch.core.config import ModelConfig
from benchbatch.core.inputs import path_problem
from benchbatch.errors import UserError
from benchbatch.runtime.model import Transformer

STORED_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# Old checkpoints saved the rotary frequencies; transformers recomputes them from the config
# and so does benchbatch.
EMBED = "model.embed_tokens.weight"
IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def load(
    path: str | Path,
    device: torch.device | str,
    dtype: torch.dtype,
    max_context: int | None = None,
    shard=None,
) -> tuple[Transformer, ModelConfig]:
    """The checkpoint's model on `device` in `dtype`. max_context (at most the config's)
    shortens the rotary tables: positions past it are never used. shard: a rank of a
    tensor-parallel group (runtime/tensor_parallel.py) reads only its slices of each tensor."""
    cfg = read_config(path)
    if max_context is not None and max_context != cfg.max_context:
        if max_context > cfg.max_context:
            raise UserError(
                "--max-context",
                f"{max_context:,} is more than the checkpoint's {cfg.max_context:,} positions"
                + (" (its sliding_window: benchbatch runs windowed attention only within it)"
                   if cfg.windowed() else ""),  # fmt: skip
            )
        cfg = cfg.replace(max_context=max_context)
    shards, tensors = _checked(path, device, dtype, cfg)
    model = Transformer(cfg, device, dtype, init=False, shard=shard)
    targets = destinations(model) if shard is None else _sharded_targets(model, shard)
    with torch.no_grad():
        _copy(shards, tensors, targets, dtype)
    return model.eval(), cfg


def check(path: str | Path, device: torch.device | str, dtype: torch.dtype, cfg: ModelConfig):
    """Everything the checkpoint's files tell before its model is built, so a run refuses
    it before its folder exists: the dtype on the device, the safetensors files (each
    header read, no data), every tensor's name, shape and dtype against cfg's model, and a
    tied checkpoint's stored head equal to its embedding (those two read, in blocks of
    rows). Only values past fp16's range wait for the load, which reads every tensor."""
    _checked(path, device, dtype, cfg)


def _checked(path, device, dtype: torch.dtype, cfg: ModelConfig):
    _check_device_dtype(torch.device(device), dtype)
    shards = _shards(folder(path))
    tensors = _inventory(shards)
    # Shapes are checked against the whole model's (on the meta device: no memory).
    _check_tensors(tensors, destinations(Transformer(cfg, "meta", dtype, init=False)), cfg)
    if cfg.tie_embeddings and "lm_head.weight" in tensors:
        _check_tied_head(tensors, dtype)
    return shards, tensors


def _check_device_dtype(device: torch.device, dtype: torch.dtype) -> None:
    if device.type == "cuda" and dtype == torch.bfloat16:
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            name = torch.cuda.get_device_name(device)
            fail(f"{name} cannot run bf16; load the weights in fp16 or fp32 (--dtype)")


# --- the files -----------------------------------------------------------------------------


def _shards(p: Path) -> list[Path]:
    """The safetensors files: the index's shards, or the single model.safetensors; a folder
    with both (a sharded save over a single one: save_pretrained leaves the old file) is
    refused, as transformers loads the single file and vLLM the index's shards."""
    index = p / "model.safetensors.index.json"
    if index.is_file() and (p / "model.safetensors").is_file():
        fail(
            f"{p} holds both model.safetensors and model.safetensors.index.json (two saves "
            "into one folder?): transformers would load the first, vLLM the shards the index "
            "names; remove the one that is not the model"
        )
    if index.is_file():
        raw = hfconfig.load_json(index, OPTION)
        weight_map = raw.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            fail(f"{index}: weight_map must be an object naming each tensor's file")
        names = sorted({str(v) for v in weight_map.values()})
        for name in names:
            if Path(name).name != name or path_problem(p / name) or not (p / name).is_file():
                fail(f"{index} names a shard {name!r} that is not in {p}")
        return [p / name for name in names]
    single = p / "model.safetensors"
    if single.is_file():
        return [single]
    if any(p.glob("*.bin")) or any(p.glob("*.pt")):
        fail(
            f"{p} holds PyTorch .bin weights; benchbatch reads safetensors only (save_pretrained"
            " writes them; transformers can convert a folder with safe_serialization=True)"
        )
    fail(f"{p} has no model.safetensors nor model.safetensors.index.json")


def _inventory(shards: list[Path]) -> dict[str, tuple[Path, list[int], str]]:
    """Each stored tensor's file, shape and dtype, read from the headers only (safe_open
    also checks that the data the header promises is in the file)."""
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, tuple[Path, list[int], str]] = {}
    for shard in shards:
        try:
            with safe_open(shard, framework="pt") as f:
                for name in f.keys():
                    if name in tensors:
                        fail(f"{name} is stored twice ({tensors[name][0].name}, {shard.name})")
                    s = f.get_slice(name)
                    tensors[name] = (shard, list(s.get_shape()), s.get_dtype())
        except (OSError, RuntimeError, ValueError, SafetensorError) as e:  # a corrupt file
            fail(f"cannot read {shard} as safetensors: {_first_line(e)}")
    return tensors


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:300]


# --- the mapping ---------------------------------------------------------------------------


Span = tuple[int, int] | None  # rows of a fused parameter; None: all of it


def layout(cfg: ModelConfig) -> dict[str, tuple[str, Span]]:
    """Hugging Face tensor name -> (benchbatch's parameter, the rows of it the tensor fills)."""
    out: dict[str, tuple[str, Span]] = {
        "model.embed_tokens.weight": ("embed.weight", None),
        "model.norm.weight": ("norm.weight", None),
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = ("lm_head.weight", None)
    q, kv, inter = cfg.q_dim, cfg.kv_dim, cfg.intermediate
    qkv_rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
    mlp_rows = {"gate_proj": (0, inter), "up_proj": (inter, 2 * inter)}
    for i in range(cfg.layers):
        pre, mine = f"model.layers.{i}.", f"blocks.{i}."
        out[pre + "input_layernorm.weight"] = (mine + "attention_norm.weight", None)
        out[pre + "post_attention_layernorm.weight"] = (mine + "mlp_norm.weight", None)
        attn, mlp = (pre + "self_attn.", mine + "attention."), (pre + "mlp.", mine + "mlp.")
        out |= _linear(*attn, "wqkv", qkv_rows, cfg.qkv_bias)
        out |= _linear(*attn, "wo", {"o_proj": None}, cfg.o_bias)
        out |= _linear(*mlp, "w13", mlp_rows, cfg.mlp_bias)
        out |= _linear(*mlp, "w2", {"down_proj": None}, cfg.mlp_bias)
        if cfg.qk_norm:
            for norm in ("q_norm", "k_norm"):
                out[f"{pre}self_attn.{norm}.weight"] = (f"{mine}attention.{norm}.weight", None)
    return out


def _linear(prefix: str, mine: str, layer: str, rows: dict, bias: bool) -> dict:
    """Weights (and biases, when the layer has them) of projections fused by rows."""
    kinds = ("weight", "bias") if bias else ("weight",)
    return {
        f"{prefix}{name}.{kind}": (f"{mine}{layer}.{kind}", span)
        for name, span in rows.items()
        for kind in kinds
    }


def destinations(model: Transformer) -> dict[str, torch.Tensor]:
    """Hugging Face tensor name -> the part of benchbatch's parameter it fills (a view)."""
    params = dict(model.named_parameters())
    return {
        name: params[param] if span is None else params[param][slice(*span)]
        for name, (param, span) in layout(model.cfg).items()
    }


def _sharded_targets(model: Transformer, shard) -> dict[str, Callable]:
    """Hugging Face tensor name -> a call that copies this rank's slices of the tensor into
    its parameters (and returns what it wrote); a tied embedding also fills the head."""
    from benchbatch.runtime.tensor_parallel import write_piece

    cfg, params = model.cfg, dict(model.named_parameters())
    out: dict[str, Callable] = {
        name: functools.partial(write_piece, params[param], shard.piece(param, cfg), span)
        for name, (param, span) in layout(cfg).items()
    }
    if cfg.tie_embeddings:
        head_piece = shard.piece("lm_head.weight", cfg)
        head = functools.partial(write_piece, params["lm_head.weight"], head_piece, None)
        embed = out["model.embed_tokens.weight"]
        out["model.embed_tokens.weight"] = lambda t: (head(t), embed(t))[1]
    return out


def _check_tensors(tensors: dict, targets: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
    stored = {n for n in tensors if not IGNORED.fullmatch(n)}
    tied_head = cfg.tie_embeddings and "lm_head.weight" in stored
    extra = sorted(stored - set(targets) - ({"lm_head.weight"} if tied_head else set()))
    missing = sorted(set(targets) - stored)
    if missing:
        fail(f"the checkpoint lacks {_few(missing)}, which the config's model needs")
    if extra:
        fail(f"the checkpoint holds {_few(extra)}, which the config's model has no place for")
    for name, (shard, shape, dtype) in tensors.items():
        if name not in stored:
            continue
        dest = targets.get(name)
        if dest is None:  # a tied checkpoint's lm_head: it must fit the embedding
            dest = targets["model.embed_tokens.weight"]
        want = list(dest.shape)
        if shape != want:
            fail(f"{name} in {shard.name} has shape {shape}, the config says {want}")
        if dtype not in STORED_DTYPES:
            fail(f"{name} is stored as {dtype}; benchbatch loads F32, F16 and BF16 weights")


def _few(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _copy(shards: list[Path], tensors: dict, targets: dict, dtype: torch.dtype) -> None:
    """Each tensor from its memory-mapped file into its place (a view, or a call that writes
    a rank's slices), converted on the way."""
    from safetensors import SafetensorError, safe_open

    for shard in shards:
        try:
            with safe_open(shard, framework="pt") as f:
                for name in (n for n, (s, _, _) in tensors.items() if s == shard):
                    if name not in targets:  # ignored, or a tied head (checked before)
                        continue
                    target, tensor = targets[name], f.get_tensor(name)
                    written = target(tensor) if callable(target) else target.copy_(tensor)
                    if dtype == torch.float16 and not torch.isfinite(written).all():
                        fail(
                            f"{name} holds values beyond fp16's range; load it in bf16 or fp32 "
                            "(--dtype)"
                        )
        except (OSError, SafetensorError) as e:  # the file changed or went since the check
            fail(f"cannot read {shard} as safetensors: {_first_line(e)}")


TIED_BLOCK_BYTES = 64 << 20  # a tied head is compared with the embedding this much at a time


def _check_tied_head(tensors: dict, dtype: torch.dtype) -> None:
    """A tied checkpoint that also stores lm_head.weight: transformers uses the embedding for
    both; benchbatch accepts the extra tensor only if nothing is lost that way (the two equal
    in the run's dtype). Shapes are checked already; read in blocks of rows."""
    from safetensors import SafetensorError, safe_open

    (head_file, shape, _), embed_file = tensors["lm_head.weight"], tensors[EMBED][0]
    rows = max(1, TIED_BLOCK_BYTES // max(1, 4 * (shape[1] if len(shape) > 1 else 1)))
    try:
        with safe_open(head_file, framework="pt") as h, safe_open(embed_file, framework="pt") as e:
            head, embed = h.get_slice("lm_head.weight"), e.get_slice(EMBED)
            for a in range(0, shape[0] if shape else 0, rows):
                if not torch.equal(head[a : a + rows].to(dtype), embed[a : a + rows].to(dtype)):
                    fail(
                        "lm_head.weight differs from model.embed_tokens.weight, yet "
                        "tie_word_embeddings is true: the model would not be the checkpoint's"
                    )
    except (OSError, SafetensorError) as err:
        fail(f"cannot read {head_file} as safetensors: {_first_line(err)}")
