"""Benchmark: benchbatch's model and engine against Hugging Face transformers, side by side.

The peer is transformers' LlamaForCausalLM (Qwen3's or Qwen2's for a config with q/k norm
or q/k/v bias) built from a config of the same model (random weights, nothing downloaded,
attn_implementation='sdpa'), on the same device and dtype. Measured in one run, with
benchbatch's timing harness:

- one decode step at batch 1 and 32 over a KV cache of --context tokens: the peer's cache
  is filled by a prefill first, then one step is timed (and cropped back after each
  repeat), with DynamicCache (generate's default) and StaticCache (preallocated);
- one prefill of --prefill tokens (logits of the last token only, as generate asks);
- end to end on the same requests (forced output lengths, same prompts): transformers'
  generate with static batching (requests in order in groups of --slots, left padding,
  min_new_tokens = max_new_tokens = the group's longest output, so every member runs as
  long as the longest, exactly the work of benchbatch's static policy) against
  benchbatch's engine, static and continuous, --rounds-generate runs each, alternating
  (the order flipped each run): each side's median run and the median of the runs' ratios.

Each step is timed in alternating rounds (benchbatch, then the peer, --rounds times), so a
burst of load from another process hits both alike: a step's bb/peer is the median of the
rounds' ratios (each round's median times), its times the medians of each side's pooled
repeats. On a shared 2-core machine --threads 1 keeps OpenMP from waiting on a
descheduled thread. benchbatch's weights are laid out as its commands lay them out (the
device's measured faster layout, runtime/layout.py; --layout forces one).
The default workload (64 requests, 16 slots, lognormal outputs median 70, at most 400)
simulates to about 1.9x fewer steps for continuous batching; more requests and slots widen
the gap (600 requests on 32 slots: 3.3x; with the article's outputs of at most 2000: 4.0x)
but take long on a CPU.

It prints a table (times, and benchbatch / peer time: below 1 means benchbatch is faster),
then one JSON line (with the machine, threads and the load average before and after).

    pip install 'benchbatch[peer]'   # or: pip install transformers
    python scripts/bench_peer.py [--preset cpu-small] [--device auto] [--threads 1]
        [--rounds 3] [--rounds-generate 3]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time

import torch
from script_common import int_list, load_line, load_now, machine, positive_float, positive_int

from benchbatch.core.config import ModelConfig, preset
from benchbatch.core.workload import Request, lognormal_workload
from benchbatch.runtime import device as devices
from benchbatch.runtime import layout, steps
from benchbatch.runtime.engine import Engine
from benchbatch.runtime.model import Transformer
from benchbatch.runtime.run_state import prompt_ids
from benchbatch.runtime.timing import Measurement, TimingOptions, measure, synchronize

try:
    import transformers
    from transformers import DynamicCache, StaticCache
except ImportError:  # the optional extra
    transformers = None

PAD = 0
DEFAULTS = {"context": 512, "prefill": 512, "requests": 64, "slots": 16, "max-output": 400,
            "prompt-len": 64, "repeats": 5}


def peer_family(cfg: ModelConfig) -> str:
    """The transformers family that computes what cfg describes: Qwen3 has q/k norm, Qwen2
    a bias on q, k, v only; the rest is Llama (attention_bias, mlp_bias and all)."""
    if cfg.qk_norm:
        return "Qwen3"
    if cfg.qkv_bias and not cfg.o_bias:
        return "Qwen2"
    return "Llama"


def peer_model(cfg: ModelConfig, dev: torch.device, dtype: torch.dtype, seed: int):
    """The transformers model of exactly benchbatch's config, random weights, sdpa attention."""
    family = peer_family(cfg)
    bias = {} if family == "Qwen2" else {"attention_bias": cfg.qkv_bias}
    if family == "Llama":
        bias["mlp_bias"] = cfg.mlp_bias
    scaling = None
    if cfg.rope_scaling is not None:  # rope_scaling beside rope_theta: read by 4.x and 5.x
        s = cfg.rope_scaling
        scaling = {"rope_type": s.type, "factor": s.factor}
        if s.type == "llama3":
            scaling.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor)
            scaling["original_max_position_embeddings"] = s.original_max_context
    config = getattr(transformers, f"{family}Config")(
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab,
        max_position_embeddings=cfg.max_context,
        rope_theta=cfg.rope_theta,
        rope_scaling=scaling,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        attn_implementation="sdpa",
        pad_token_id=PAD,
        **bias,
    )
    torch.manual_seed(seed)
    causal_lm = getattr(transformers, f"{family}ForCausalLM")
    model = causal_lm(config).to(device=dev, dtype=dtype).eval()
    return model, config


# --- single steps ------------------------------------------------------------------------------


def ours_step(model: Transformer, step: steps.Step):
    """benchbatch's step as phases times it (without CUDA graphs: the peer has none)."""
    return lambda opts: steps.time_step(model, step, opts, cuda_graphs=False)


def cache_keyword(model) -> str:
    """The forward's name for the KV cache: `cache` from transformers 5.25 on (where
    `past_key_values` is deprecated), `past_key_values` before (the GPU image's version)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def peer_decode(model, config, batch: int, context: int, kind: str):
    """One decode step over `context` cached tokens: prefill the cache, then time one step,
    cropping the new token off after each repeat so every repeat does the same work."""
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (batch, context), device=dev, generator=gen)
    token = torch.randint(0, config.vocab_size, (batch, 1), device=dev, generator=gen)
    if kind == "static":
        cache = StaticCache(config=config, max_cache_len=context + 1)
    else:
        cache = DynamicCache(config=config)
    held = {cache_keyword(model): cache}
    with torch.inference_mode():
        model(input_ids=prompt, use_cache=True, logits_to_keep=1, **held)

    @torch.inference_mode()
    def step():
        model(input_ids=token, use_cache=True, logits_to_keep=1, **held)
        if kind == "static":  # transformers 5's static layers count their length: rewind it
            for layer in cache.layers:
                layer.cumulative_length.fill_(context)
        else:
            cache.crop(-1)

    return lambda opts: measure(step, dev, opts)


def peer_prefill(model, config, tokens: int):
    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(2)
    prompt = torch.randint(0, config.vocab_size, (1, tokens), device=dev, generator=gen)

    @torch.inference_mode()
    def step():
        model(input_ids=prompt, use_cache=True, logits_to_keep=1,
              **{cache_keyword(model): DynamicCache(config=config)})

    return lambda opts: measure(step, dev, opts)


def alternate(timers: list, opts: TimingOptions, rounds: int) -> list[Measurement]:
    """Time each contestant in turn, `rounds` times over, and pool each one's raw times: a
    burst of load from another process then hits both sides alike. Each Measurement keeps
    its rounds' medians too (`round_ms`), for ratios taken round by round."""
    times: list[list[float]] = [[] for _ in timers]
    medians: list[list[float]] = [[] for _ in timers]
    for _ in range(rounds):
        for pooled, per_round, timer in zip(times, medians, timers, strict=True):
            m = timer(opts)
            pooled += m.times_ms
            per_round.append(m.median_ms)
    out = [Measurement(t) for t in times]
    for m, per_round in zip(out, medians, strict=True):
        m.round_ms = per_round
    return out


# --- end to end --------------------------------------------------------------------------------


def groups(requests: list[Request], slots: int) -> list[list[Request]]:
    """Static batching's groups: requests in order, `slots` at a time."""
    return [requests[i : i + slots] for i in range(0, len(requests), slots)]


def left_padded(group: list[Request], vocab: int, seed: int, dev) -> tuple[torch.Tensor, ...]:
    """The group's prompts (the engine's own prompt ids), left-padded, with their mask."""
    prompts = [prompt_ids(r, vocab, seed) for r in group]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(group), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(group), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = p, 1
    return ids.to(dev), mask.to(dev)


@torch.inference_mode()
def peer_generate_s(model, requests: list[Request], slots: int, seed: int) -> tuple[float, int]:
    """Wall time of generate over every group, and the tokens it generated (padding counted
    as generate computes it: every member runs as long as the group's longest)."""
    dev, vocab = model.device, model.config.vocab_size
    synchronize(dev)
    start, computed = time.perf_counter(), 0
    for group in groups(requests, slots):
        ids, mask = left_padded(group, vocab, seed, dev)
        longest = max(r.output_tokens for r in group)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=longest,
            min_new_tokens=longest,  # no early end-of-sequence: the lengths are forced
            do_sample=False,
            pad_token_id=PAD,
        )
        computed += (out.shape[1] - ids.shape[1]) * len(group)
    synchronize(dev)
    return time.perf_counter() - start, computed


def ours_engine_s(model: Transformer, requests: list[Request], slots: int, policy: str, seed: int):
    result = Engine(model, policy, slots, seed).run(requests)
    return result.wall_s, result.total_steps


# --- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default=None, help="default: article on CUDA, cpu-small else")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None, help="default: fp16 on CUDA, fp32 on CPU")
    for name in ("context", "prefill", "requests", "slots", "max-output", "prompt-len",
                 "repeats"):  # fmt: skip
        parser.add_argument(f"--{name}", type=positive_int, default=DEFAULTS[name])
    parser.add_argument("--batches", type=int_list, default=[1, 32])
    parser.add_argument("--median", type=positive_float, default=70)
    parser.add_argument("--min-time", type=positive_float, default=0.3)
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="alternating rounds per step (default 3)")  # fmt: skip
    parser.add_argument("--rounds-generate", type=positive_int, default=3,
                        help="end-to-end runs each, alternating (default 3)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads (default: torch's own choice)")  # fmt: skip
    parser.add_argument("--skip-generate", action="store_true")
    parser.add_argument("--layout", choices=("measured", "rows", "columns"), default="measured",
                        help="benchbatch's weight layout (default: measured on the device)")
    return parser.parse_args(argv)


def main() -> int:
    if transformers is None:
        print("bench_peer.py needs Hugging Face transformers: pip install 'benchbatch[peer]' "
              "(or pip install transformers)", file=sys.stderr)  # fmt: skip
        return 2
    args = parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.load_before = load_now()
    target = devices.resolve(args.device, args.dtype)
    cfg = preset(args.preset or ("article" if target.device.type == "cuda" else "cpu-small"))
    opts = TimingOptions(min_repeats=args.repeats, min_time_s=args.min_time)
    ours = Transformer(cfg, target.device, target.dtype, args.seed)
    forced = {"rows": layout.ROWS, "columns": layout.WeightLayout(columns=True)}
    ours.lay_out(forced.get(args.layout) or layout.choose(ours))
    peer, config = peer_model(cfg, target.device, target.dtype, args.seed)
    args.layout_name = ours.layout.name
    print(header(cfg, target, args), flush=True)
    points = step_points(ours, peer, config, args, opts)
    if not args.skip_generate:
        points += generate_points(ours, peer, args)
    print_table(points)
    print(load_line(args.load_before))
    print(json.dumps(summary(cfg, target, args, points)))
    return 0


def header(cfg: ModelConfig, target, args) -> str:
    return (
        f"benchbatch vs transformers {transformers.__version__} {peer_family(cfg)}ForCausalLM "
        "(sdpa): "
        f"{cfg.name} (hidden {cfg.hidden}, {cfg.layers} layers, {cfg.heads} heads, "
        f"{cfg.kv_heads} KV heads, MLP {cfg.intermediate}, vocab {cfg.vocab:,}), "
        f"{target.dtype_name}, {devices.device_name(target.device)} ({target.device}, "
        f"{torch.get_num_threads()} threads), torch {torch.__version__}; benchbatch's "
        f"weight layout: {args.layout_name}"
    )


def point(name: str, ours, peer, peer_name: str, note: str = "") -> dict:
    """A row of the table: median times (of Measurements, or given in ms) and their ratio."""
    ours_ms, peer_ms = (m.median_ms if isinstance(m, Measurement) else m for m in (ours, peer))
    row = {
        "point": name,
        "peer": peer_name,
        "benchbatch_ms": ours_ms,
        "peer_ms": peer_ms,
        "benchbatch_over_peer": ours_ms / peer_ms,
        "note": note,
    }
    if isinstance(ours, Measurement):
        row |= {"benchbatch_min_ms": ours.min_ms, "peer_min_ms": peer.min_ms}
        row |= {"benchbatch_cv": ours.cv, "peer_cv": peer.cv}
        ratios = [a / b for a, b in zip(ours.round_ms, peer.round_ms, strict=True)]
        row |= {"round_ratios": ratios, "benchbatch_over_peer": statistics.median(ratios)}
    return row


def step_points(ours, peer, config, args, opts) -> list[dict]:
    out = []
    for batch in args.batches:
        name = f"decode b={batch}, context {args.context}"
        timers = [ours_step(ours, steps.decode(batch, args.context))]
        timers += [peer_decode(peer, config, batch, args.context, k) for k in ("dynamic", "static")]
        mine, dynamic, static = alternate(timers, opts, args.rounds)
        out.append(point(name, mine, dynamic, "HF DynamicCache"))
        out.append(point(name, mine, static, "HF StaticCache"))
        progress(out[-2:])
    name = f"prefill {args.prefill}"
    timers = [ours_step(ours, steps.prefill(1, args.prefill)),
              peer_prefill(peer, config, args.prefill)]  # fmt: skip
    mine, theirs = alternate(timers, opts, args.rounds)
    out.append(point(name, mine, theirs, "HF forward"))
    progress(out[-1:])
    return out


def progress(points: list[dict]) -> None:
    for p in points:
        print(f"  {p['point']}: benchbatch {p['benchbatch_ms']:.4g} ms, {p['peer']} "
              f"{p['peer_ms']:.4g} ms", file=sys.stderr, flush=True)  # fmt: skip


def generate_points(ours, peer, args) -> list[dict]:
    """End to end on the same requests: generate and the engine's two policies run in turn,
    --rounds-generate times, the order flipped each run; each side's median run, and bb/peer
    the median of the runs' ratios."""
    requests = lognormal_workload(args.requests, median=args.median, max_output=args.max_output,
                                  prompt_len=args.prompt_len, seed=args.seed)  # fmt: skip
    warm = [Request(r.id, r.prompt_tokens, 2) for r in requests[:2]]
    peer_generate_s(peer, warm, 2, args.seed)  # first calls: allocation, lazy init
    ours_engine_s(ours, warm, 2, "continuous", args.seed)
    runs: dict[str, list[float]] = {"generate": [], "static": [], "continuous": []}
    computed, steps_run = 0, {}
    for i in range(args.rounds_generate):
        for side in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            if side == "generate":
                wall, computed = peer_generate_s(peer, requests, args.slots, args.seed)
            else:
                wall, steps_run[side] = ours_engine_s(ours, requests, args.slots, side, args.seed)
            runs[side].append(wall)
        print(f"  end to end: { {k: round(v[-1], 2) for k, v in runs.items()} } s", file=sys.stderr)
    outputs = sum(r.output_tokens for r in requests)
    what = f"{len(requests)} requests, {args.slots} slots, {outputs:,} output tokens"
    out = []
    for policy in ("static", "continuous"):
        row = point(f"{what}: engine {policy}", statistics.median(runs[policy]) * 1e3,
                    statistics.median(runs["generate"]) * 1e3, "HF generate",
                    f"{steps_run[policy]:,} steps; generate computed {computed:,} tokens; "
                    f"median of {args.rounds_generate} alternating runs")  # fmt: skip
        ratios = [a / b for a, b in zip(runs[policy], runs["generate"], strict=True)]
        out.append(row | {"round_ratios": ratios,
                          "benchbatch_over_peer": statistics.median(ratios)})  # fmt: skip
    return out


def print_table(points: list[dict]) -> None:
    width = max(len(p["point"]) for p in points) + 2
    print(f"{'point':<{width}}{'peer':<18}{'benchbatch ms':>15}{'peer ms':>12}{'bb/peer':>9}")
    for p in points:
        print(
            f"{p['point']:<{width}}{p['peer']:<18}{p['benchbatch_ms']:>15,.4g}"
            f"{p['peer_ms']:>12,.4g}{p['benchbatch_over_peer']:>9.3f}"
        )
    print("bb/peer: benchbatch's time over the peer's (below 1: benchbatch is faster)")


def summary(cfg: ModelConfig, target, args, points: list[dict]) -> dict:
    return {"bench": "peer", "transformers": transformers.__version__, "torch": torch.__version__,
            "device": devices.device_name(target.device),
            "host": machine(threads=torch.get_num_threads()) | {"load_before": args.load_before},
            "threads": torch.get_num_threads(), "dtype": target.dtype_name,
            "model": cfg.to_dict(), "context": args.context, "points": points}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
