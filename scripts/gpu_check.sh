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
timeout 120 python -m pytest -q -m gpu tests 2>&1 | tee "$out/gpu-tests.txt" | tail -3
step "phases, article defaults, CUDA graphs"
bb 90 phases --out "$out/phases" --force
step "phases, article defaults, no CUDA graphs"
bb 90 phases --no-cuda-graphs --out "$out/phases-eager" --force
# (each later command adds its run here, sized to keep the whole script under 6 minutes)
step "pack"
tar czf "$out/gpu-results.tgz" -C "$out" --exclude gpu-results.tgz . 2>/dev/null
step "done"
