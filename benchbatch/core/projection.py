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
        "fits": most is None or batch <= most,
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
            base = next((r for r in group if r["fits"]), None)
            for r in group:
                ok = base is not None and r["fits"]
                r["speedup"] = base["step_ms"] / r["step_ms"] if ok else None
                r["speedup_over_tp"] = base["tp"] if ok else None
            rows += group
    return rows


def assumptions(cfg: ModelConfig, dtype: str, m: Machine) -> list[str]:
    """The table's assumptions, one line each, as printed beside it."""
    src = dict(m.sources)
    memory = f"{m.memory_bytes / GiB:,.0f} GiB" if m.memory_bytes else "memory unknown"
    return [
        f"model: {cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, "
        f"{cfg.kv_heads} KV heads, vocabulary {cfg.vocab:,}), {dtype}",
        f"one GPU: {m.name}, {m.tflops:,.0f} TFLOP/s ({src.get('tflops')}), {m.gbps:,.0f} GB/s "
        f"({src.get('gbps')}), {memory} ({src.get('memory')}); a rank's step is the roofline "
        f"(max of FLOPs / peak, bytes / bandwidth) over efficiency {m.efficiency:g}",
        f"all-reduce: {m.latency_us:g} us + 2(n-1)/n x message / {m.busbw_gbps:,.0f} GB/s bus "
        f"bandwidth ({src.get('busbw')}; latency {src.get('latency')}); two per layer, of "
        "batch x hidden values; the logits gathered once per step",
        "not modelled: launch gaps (CUDA graphs assumed), communication overlapping compute "
        "(none), the NCCL algorithm chosen; weights, KV cache and workspace must fit each "
        "GPU with 10% held back",
    ]


@dataclass(frozen=True)
class Link:
    """The all-reduce a probe.csv measured under torchrun: best bus bandwidth, and the
    time of its smallest message (the latency)."""

    busbw_gbps: float
    latency_us: float
    source: str


def interconnect_from_csv(path) -> Link | None:
    """The all-reduce rows of a probe.csv (None when it was measured on one process)."""
    import csv

    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("kind") == "allreduce"]
    rows = [r for r in rows if r.get("status", "ok") == "ok" and r.get("gbps")]
    if not rows:
        return None
    best = max(float(r["gbps"]) for r in rows)
    smallest = min(rows, key=lambda r: int(r["size"]))
    ranks = smallest.get("ranks", "?")
    return Link(best, 1e3 * float(smallest["step_ms"]), f"measured ({path}, {ranks} ranks)")
