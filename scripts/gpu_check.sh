#!/usr/bin/env bash
# The GPU checks, from a checkout (no install), in under 6 minutes on one NVIDIA GPU:
#   scripts/gpu_check.sh OUTDIR
# Runs the GPU tests, then the article's measurements. Everything lands in OUTDIR, and
# OUTDIR/gpu-results.tgz packs it (the device tool brings back only a few files).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
bb() { timeout "$1" python -m benchbatch "${@:2}" 2>&1 | tee -a "$out/log.txt"; }
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$out/log.txt"; }

step "machine"
{ nvidia-smi; python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } \
  >"$out/machine.txt" 2>&1
step "GPU tests"
timeout 60 python -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu-tests.txt" | tail -3
step "reproduce: probe, phases (table B), sweep (table A), occupancy (C) + report"
bb 120 reproduce --out "$out/reproduce" --force
step "phases without CUDA graphs (launch overhead visible), on the reproduce run's ceilings"
bb 30 phases --no-cuda-graphs --ceilings "$out/reproduce/probe.csv" --out "$out/phases-eager" --force
step "sweep: context grid (the KV cache read grows with context)"
bb 45 sweep --context 128,512,2048 --ceilings "$out/reproduce/probe.csv" --out "$out/sweep-contexts" --force
step "occupancy on the real engine (article model, 200 requests, 32 slots)"
bb 45 occupancy --engine real --requests 200 --out "$out/occupancy-real" --force
step "chunked prefill: the three Sarathi-Serve schemes, simulated and on the model"
bb 45 ablation --engine real --requests 60 --long-prompt-len 2048 --max-num-batched-tokens 512 \
  --chunk-size 256 --max-num-seqs 16 --out "$out/ablation" --force
step "piggyback: prefill tokens riding on a decode step"
bb 20 piggyback --decode-batch 32 --out "$out/piggyback" --force
step "pack"
tar czf "$out/gpu-results.tgz" -C "$out" --exclude gpu-results.tgz . 2>/dev/null
step "done"
