"""Decode on machines nobody here has: step time and all-reduce share at TP 1, 2, 4, 8.

Pure arithmetic (no torch), from three things:

- the accounting: one rank's FLOPs and bytes of a decode step (accounting.step_cost with
  tp), its weights, KV cache and the largest batch its memory holds;
- one GPU's ceilings: the datasheet's (benchbatch/core/peaks.py) or measured ones (a probe.csv);
  a rank's step takes max(FLOPs / peak, bytes / bandwidth) (the roofline) over
  `efficiency` (the fraction of the roof real steps reach: 1 is the roof itself);
- the interconnect: each of the step's 2 x layers all-reduces of batch x hidden values takes
  latency + 2 (n - 1) / n x message / bus bandwidth (a ring all-reduce's traffic per GPU,
  nccl-tests' busbw), the logits gather latency + (n - 1) / n x logits / bus bandwidth.
  The bus bandwidth defaults to half the datasheet's bidirectional NVLink figure per GPU
  (one direction: NVLink 4, 900 GB/s, gives 450 GB/s).

Not modelled, and so said with the table: launch gaps (CUDA graphs assumed), communication
overlapping compute (none assumed), prefill, and the NCCL algorithm actually chosen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from benchbatch.core import accounting, sharding
from benchbatch.core.config import DTYPE_BYTES, ModelConfig

GB, GiB = 1e9, 2**30


@dataclass(frozen=True)
class Machine:
    """One GPU of the machine and the link between them; `sources` says where each came
    from (datasheet, measured, given)."""

    name: str
    tflops: float
    gbps: float
    memory_bytes: float | None
    busbw_gbps: float
    latency_us: float
    efficiency: float = 1.0
    sources: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "sources": dict(self.sources)}


def comm_ms(message_bytes: float, ranks: int, m: Machine, factor: float) -> float:
    """One collective: latency plus factor x message over the bus bandwidth."""
    if ranks == 1:
        return 0.0
    return m.latency_us / 1e3 + factor * message_bytes / (m.busbw_gbps * GB) * 1e3


def project(cfg: ModelConfig, dtype: str, tp: int, batch: int, context: int, m: Machine) -> dict:
    """One row: a decode step of `batch` sequences at `context` on one rank of tp."""
    cost = accounting.decode_cost(cfg, dtype, batch, context, tp)
    compute_ms = cost.flops / (m.tflops * 1e12) * 1e3
    memory_ms = cost.bytes / (m.gbps * GB) * 1e3
    model_ms = max(compute_ms, memory_ms) / m.efficiency
    message = accounting.allreduce_bytes(cfg, dtype, batch)
    reduce_ms = accounting.allreduces_per_step(cfg, tp) * comm_ms(message, tp, m, 2 * (tp - 1) / tp)
    logits = batch * sharding.vocab_per_rank(cfg, tp) * tp * DTYPE_BYTES[dtype]
    gather_ms = comm_ms(logits, tp, m, (tp - 1) / tp)
    step_ms = model_ms + reduce_ms + gather_ms
    weights = accounting.weight_bytes(cfg, dtype, tp)
    kv = accounting.kv_cache_bytes(cfg, dtype, batch, context + 1, tp)
    most = (
        accounting.max_batch(cfg, dtype, context + 1, int(m.memory_bytes), tp=tp)
        if m.memory_bytes
        else None
    )
    return {
        "tp": tp,
        "batch": batch,
        "context": context,
        "weights_gib": weights / GiB,
        "kv_gib": kv / GiB,
        "max_batch": most,
        "fits": None if most is None else batch <= most,  # None: the memory is unknown
        "compute_ms": compute_ms,
        "memory_ms": memory_ms,
        "bound": "compute" if compute_ms >= memory_ms else "memory",
        "model_ms": model_ms,
        "allreduce_ms": reduce_ms,
        "gather_ms": gather_ms,
        "step_ms": step_ms,
        "allreduce_share": reduce_ms / step_ms,
        "tokens_per_s": batch / step_ms * 1e3,
        "tokens_per_s_per_gpu": batch / step_ms * 1e3 / tp,
    }


def table(
    cfg: ModelConfig,
    dtype: str,
    tps: tuple[int, ...],
    batches: tuple[int, ...],
    contexts: tuple[int, ...],
    m: Machine,
) -> list[dict]:
    """Every (context, batch, tp) that shards, with the speedup over the fewest GPUs on
    which the step fits (same batch and context)."""
    rows = []
    for context in contexts:
        for batch in batches:
            group = [project(cfg, dtype, tp, batch, context, m) for tp in tps]
            # the base: the fewest GPUs it fits on (memory unknown: the fewest GPUs)
            base = next((r for r in group if r["fits"] is not False), None)
            for r in group:
                ok = base is not None and r["fits"] is not False
                r["speedup"] = base["step_ms"] / r["step_ms"] if ok else None
                r["speedup_over_tp"] = base["tp"] if ok else None
            rows += group
    return rows


# GPUs one NVLink domain joins on the machines benchbatch's datasheets list (HGX/DGX: 8);
# past it a real machine's all-reduce crosses InfiniBand or Ethernet, far slower.
NVLINK_DOMAIN = 8


def assumptions(cfg: ModelConfig, dtype: str, m: Machine, tps: tuple[int, ...] = ()) -> list[str]:
    """The table's assumptions, one line each, as printed beside it."""
    from benchbatch.core.units import figure

    src = dict(m.sources)
    memory = f"{figure(m.memory_bytes / GiB)} GiB" if m.memory_bytes else "memory unknown"
    said = [
        f"model: {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, "
        f"{cfg.kv_heads} KV heads, vocabulary {cfg.vocab:,}), {dtype}",
        f"one GPU: {m.name}, {figure(m.tflops)} TFLOP/s ({src.get('tflops')}), "
        f"{figure(m.gbps)} GB/s ({src.get('gbps')}), {memory} ({src.get('memory')}); a rank's "
        f"step is the roofline (max of FLOPs / peak, bytes / bandwidth) over efficiency "
        f"{m.efficiency:g}; its bytes are the weights and KV cache read and every op's "
        "activations read and written once (none fused: a few percent of a step)",
        f"all-reduce: {figure(m.latency_us)} us + 2(n-1)/n x message / {figure(m.busbw_gbps)} "
        f"GB/s bus bandwidth ({src.get('busbw')}; latency {src.get('latency')}); two per "
        "layer, of batch x hidden values; the logits gathered once per step (in step ms, "
        "not in AR ms: project.csv's gather_ms)",
        "not modelled: launch gaps (CUDA graphs assumed), communication overlapping compute "
        "(none), the NCCL algorithm chosen; weights, KV cache and workspace must fit each "
        "GPU with 10% held back" + ("" if m.memory_bytes else " (unknown here: fits ?)"),
    ]
    beyond = [t for t in tps if t > NVLINK_DOMAIN]
    if beyond and "given" not in str(src.get("busbw")) and "measured" not in str(src.get("busbw")):
        said.append(
            f"{', '.join(map(str, beyond))} GPUs are past one NVLink domain ({NVLINK_DOMAIN} "
            "GPUs on HGX/DGX machines): their all-reduces would cross InfiniBand or "
            "Ethernet, far slower than the NVLink figure priced here; give --busbw and "
            "--allreduce-latency for that network"
        )
    return said


@dataclass(frozen=True)
class Link:
    """The all-reduce a probe.csv measured under torchrun: best bus bandwidth, and the
    time of its smallest message (the latency)."""

    busbw_gbps: float
    latency_us: float
    source: str


def interconnect_from_csv(path, option: str = "ceilings") -> Link | None:
    """The all-reduce rows of a probe.csv (None when it was measured on one process), each
    checked: a size in bytes, a time and a bus bandwidth above 0 (a row that is not is
    refused naming the option, never priced)."""
    import csv
    import math

    from benchbatch.errors import UserError

    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("kind") == "allreduce"]
    rows = [r for r in rows if r.get("status", "ok") == "ok" and r.get("gbps")]
    if not rows:
        return None
    read = []
    for n, r in enumerate(rows, 1):
        try:
            size, ms, gbps = int(r["size"]), float(r["step_ms"]), float(r["gbps"])
        except (KeyError, TypeError, ValueError):
            raise UserError(option, f"{path}: all-reduce row {n} needs a whole size in bytes, "
                            "a step_ms and a gbps") from None  # fmt: skip
        if size <= 0 or not all(math.isfinite(v) and v > 0 for v in (ms, gbps)):
            raise UserError(option, f"{path}: all-reduce row {n} has size {r['size']}, "
                            f"step_ms {r['step_ms']}, gbps {r['gbps']}: each must be a "
                            "finite number above 0")  # fmt: skip
        read.append((size, ms, gbps, r.get("ranks", "?")))
    best = max(gbps for _, _, gbps, _ in read)
    size, ms, _, ranks = min(read)
    return Link(best, 1e3 * ms, f"measured ({path}, {ranks} ranks)")
