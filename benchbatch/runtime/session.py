"""A run's session on its device: the target (device, dtype, this rank's place among the
ranks, the process group joined), the model built on it, and the checks that must pass
before either is made. The options stay data (benchbatch/core/options.py); what they
build is made here."""

from __future__ import annotations

import dataclasses

from benchbatch.core import accounting
from benchbatch.core.options import ModelOptions, RunOptions
from benchbatch.errors import UserError
from benchbatch.runtime import device, distributed


def target_of(run: RunOptions):
    """The device (auto: CUDA when present) and dtype (fp16 on CUDA, fp32 on CPU). Under
    torchrun each rank takes cuda:LOCAL_RANK (or the CPU) and joins the process group."""
    target = device.resolve(distributed.device_spec(run.device), run.dtype)
    return dataclasses.replace(target, world=distributed.start(target.device, run.tp))


def build_model(model: ModelOptions, target, seed: int = 0):
    """The model on the target device and dtype, and its config (checked to fit first):
    the checkpoint's weights, or seeded random ones. With no model named, the device's
    default preset (see device_preset). Its weights are laid out as measured fastest on
    the device (runtime/layout.py; model.layout says which)."""
    from benchbatch.runtime import layout, tensor_parallel
    from benchbatch.runtime.model import Transformer

    cfg = shape(model, target)
    shard = tensor_parallel.of(target.world)  # this rank's part of the model, or None
    if model.model is not None:
        from benchbatch.runtime import checkpoint

        check_fits(cfg, target, "--model")
        net, cfg = checkpoint.load(
            model.model, target.device, target.dtype, cfg.max_context, shard=shard
        )
    else:
        check_fits(cfg, target, model.source())
        net = Transformer(cfg, target.device, target.dtype, seed, shard=shard)
    return net.lay_out(layout.choose(net)), cfg  # the device's faster weight layout


def check_checkpoint(model: ModelOptions, cfg, target) -> None:
    """A --model checkpoint's files, before any folder is made: everything its safetensors
    headers and config tell (runtime/checkpoint.check). Nothing without --model."""
    if model.model is None:
        return
    from benchbatch.runtime import checkpoint

    checkpoint.check(model.model, target.device, target.dtype, cfg)


def check_fits(cfg, target, option: str, cache: tuple[int, int, str] | None = None) -> None:
    """Refuse, before building it, a model whose weights (and rotary tables, built in
    float64) exceed the memory free on the device: the allocator would crash or swap.
    Under tensor parallelism: this rank's shard of it, on this rank's device. cache (slots,
    tokens per slot, the option that set the slots): a real engine's KV cache (this rank's
    heads of it), which must fit beside the weights too."""
    tp = target.tp
    need = accounting.weight_bytes(cfg, target.dtype_name, tp) + 16 * cfg.max_context * cfg.head_dim
    free = device.free_memory_bytes(target.device)
    where = "free on the GPU" if target.device.type == "cuda" else "of available RAM"
    if need > free:
        raise UserError(
            option,
            f"the model ({cfg.name}: hidden {cfg.hidden}, {cfg.layers} layers, max context "
            f"{cfg.max_context:,}) needs {need / 2**30:,.1f} GiB, more than the "
            f"{free / 2**30:,.1f} GiB {where}",
        )
    if cache is None:
        return
    slots, tokens, slots_option = cache
    kv = accounting.kv_cache_bytes(cfg, target.dtype_name, slots, tokens, tp)
    if need + kv > free:
        raise UserError(
            slots_option,
            f"a KV cache of {slots:,} slots x {tokens:,} tokens needs {kv / 2**30:,.1f} GiB; "
            f"beside the model's {need / 2**30:,.1f} GiB that is more than the "
            f"{free / 2**30:,.1f} GiB {where}",
        )


def check_pool_fits(cfg, target, blocks: int, block_size: int, option: str) -> None:
    """Refuse, before any folder is made, a paged KV pool of `blocks` blocks (and its scratch
    block; this rank's heads of it) that does not fit beside the model's weights in the memory
    free on the device. A model that does not fit alone is check_fits' to refuse."""
    weights = accounting.weight_bytes(cfg, target.dtype_name, target.tp)
    weights += 16 * cfg.max_context * cfg.head_dim
    pool = (
        (blocks + 1) * block_size * accounting.kv_bytes_per_token(cfg, target.dtype_name, target.tp)
    )
    free = device.free_memory_bytes(target.device)
    where = "free on the GPU" if target.device.type == "cuda" else "of available RAM"
    if weights <= free < weights + pool:
        raise UserError(
            option,
            f"a paged KV pool of {blocks + 1:,} blocks of {block_size} tokens needs "
            f"{pool / 2**30:,.1f} GiB; beside the model's {weights / 2**30:,.1f} GiB that is "
            f"more than the {free / 2**30:,.1f} GiB {where} (a smaller --kv-memory)",
        )


# Sizes that make a model of their own: given alone, they start from the article's shape.
# (--max-context alone only shortens the device's default model.)
SHAPE_SIZES = ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab")


def device_preset(target, model: ModelOptions | None = None) -> str:
    """The model a command builds when none is named: the article's on CUDA, a CPU-sized one
    on a CPU (the article's model runs minutes per command there). Sizes given without a
    --preset or --config (`--hidden 2048 --layers 12`, the article's command) start from
    the article's preset on any device: its heads, MLP and vocabulary, not cpu-small's."""
    if model is not None and _sizes_alone(model):
        return "article"
    return "article" if target.device.type == "cuda" else "cpu-small"


def _sizes_alone(model: ModelOptions) -> bool:
    given = model.overrides()
    return not model.chosen() and any(k in given for k in SHAPE_SIZES)


def shape(model: ModelOptions, target):
    """The ModelConfig a run builds (model.shape over device_preset), named for what it is:
    the preset's name when no given size changes it, else "article with hidden 2048,
    layers 6" (core/config.named_shape). A checkpoint keeps its own name."""
    from benchbatch.core import config

    cfg = model.shape(device_preset(target, model))
    if model.model is not None or not model.overrides():
        return cfg
    bare = dataclasses.replace(model, **{k: None for k in ModelOptions.SIZES})
    return config.named_shape(bare.shape(device_preset(target, model)), cfg, model.overrides())


def preset_note(model: ModelOptions, target) -> str | None:
    if _sizes_alone(model):
        cfg = shape(model, target)
        return (
            f"building {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, "
            f"MLP {cfg.intermediate:,}, vocabulary {cfg.vocab:,}): sizes given without --preset "
            "start from the article preset; pass --preset to start from another"
        )
    if model.chosen():
        return None
    name = device_preset(target)
    where = "CUDA" if name == "article" else "CPU"
    return (
        f"using the {name} preset, the default on {where} (article on CUDA, cpu-small on CPU); "
        "pass --preset or --config to change it"
    )
