#!/usr/bin/env bash
# The GPU checks, from a checkout (no install), on one NVIDIA GPU, in under 6 minutes:
#   [PYTHON=python3] scripts/gpu_check.sh OUTDIR
#   BUDGET_ONLY=1 scripts/gpu_check.sh OUTDIR   (print the steps' time budget, run nothing)
# A preflight first (every runtime and test dependency imports, CUDA is there: one line and
# stop otherwise); then tests/test_gpu.py; the graph-lifetime check, the kernel list and an
# OOM row followed by a normal one (scripts/gpu_lifetime_check.py); the article's
# measurements and their expected ranges; phases compiled without benchbatch's graphs (the
# cudagraphs and recompiles logs); then (with two or more GPUs) tensor parallelism over NCCL
# with torchrun, said skipped otherwise. Each step runs under its own
# timeout, and the timeouts plus the grace each step gets to exit add up to under 360 s:
# the script checks that sum before it starts and prints it. A step that times out keeps
# the rows it measured (benchbatch stops cleanly on SIGTERM). One verdict line per step.
# Everything lands in OUTDIR, and OUTDIR/gpu-results.tgz packs it (the device tool brings
# back only a few files). A relative OUTDIR is taken from where the script is called;
# inside this checkout it must be under results/ (anywhere else git would pick it up).
set -uo pipefail

LIMIT=360  # seconds the whole script may take
GRACE=3    # seconds a step gets after SIGTERM before SIGKILL
PY=${PYTHON:-python3}

# name, timeout (s): the only place the timeouts are set. Sized from the first run on an
# H200 (2026-12-04, results/nvidia-h200; each step's seconds are in its log): a step that
# times out keeps its rows and says so.
STEPS=(
  "preflight 10"
  "machine 8"
  "gpu-tests 25"
  "graph-lifetime 22"
  "attention 6"
  "reproduce 25"
  "ranges 5"
  "phases-eager 18"
  "phases-compile 45"
  "sweep-contexts 18"
  "occupancy-real 35"
  "ablation 48"
  "piggyback 28"
  "tensor-parallel 15"
  "pack 4"
)
# What each step should show on an H200 SXM (the article model, fp16), printed beside its
# verdict so a GPU run says at once what is off.
declare -A EXPECT=(
  [preflight]="every import ok, CUDA visible"
  [gpu-tests]="all pass; no test asserts a speed"
  [graph-lifetime]="KV caches held; both replays give the eager logits after 4 GB reused"
  [attention]="benchbatch's backends under 1 ms a new shape; cuDNN's cost recorded"
  [reproduce]="decode b=1 with graphs 0.33-0.5 ms; probe matmul 600-800 TFLOP/s, copy 3.8-4.3 TB/s"
  [ranges]="each of reproduce's numbers inside its H200 range"
  [phases-eager]="decode b=1 slower than with graphs, launch_bound true"
  [phases-compile]="decode b=1 well under phases-eager's, toward reproduce's 0.33-0.5 ms (fused kernels in one graph)"
  [occupancy-real]="continuous above static occupancy; steps near the estimate's (not x10)"
  [ablation]="engine calibration: per-token slopes not all zero, decode error under 50%"
  [piggyback]="a 64-token chunk adds well under a decode step's time"
)

out=${1:?usage: scripts/gpu_check.sh OUTDIR}
repo=$(cd "$(dirname "$0")/.." && pwd -P)
out=$(realpath -m -- "$out")  # relative to the caller's directory, not the repo's
case "$out/" in
  "$repo"/results/*) ;;
  "$repo"/*)
    echo "Error: OUTDIR: $out is inside the checkout $repo; use a folder outside it, or" \
      "results/<gpu-name>" >&2
    exit 2
    ;;
esac

budget=0
declare -A timeout_of
for s in "${STEPS[@]}"; do
  read -r name t <<<"$s"
  timeout_of[$name]=$t
  budget=$((budget + t + GRACE))
done
if ((budget >= LIMIT)); then
  echo "Error: the step timeouts add up to $budget s, not under $LIMIT s" >&2
  exit 2
fi
if [[ -n ${BUDGET_ONLY:-} ]]; then
  echo "budget $budget s for ${#STEPS[@]} steps (under $LIMIT s)"
  exit 0
fi

mkdir -p "$out" || exit 2
cd "$repo" || exit 2
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
log=$out/log.txt
say() { echo "$*" | tee -a "$log"; }
started=$SECONDS
say "gpu_check: ${#STEPS[@]} steps, timeouts + ${GRACE} s grace each = $budget s" \
  "(under $LIMIT s); python: $PY; out: $out"

# step NAME CMD...: run CMD under NAME's timeout, its output to $to (default: the log),
# then one verdict line (with $detail, if set).
step() {
  local name=$1 t=${timeout_of[$1]} begin=$SECONDS file=${to:-$log} rc verdict
  shift
  echo "== $(date -u +%H:%M:%S) $name (timeout $t s): $*" >>"$log"
  timeout -k "$GRACE" "$t" "$@" >>"$file" 2>&1
  rc=$?
  case $rc in
    0) verdict="ok" ;;
    124 | 137) verdict="TIMED OUT after $t s (rows measured so far are kept)" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  ((rc == 0)) || failed=$((failed + 1))
  [[ $file != "$log" ]] && detail="$(tail -n 1 "$file")${detail:+; $detail}"
  say "$(printf '%-15s %s [%d s]' "$name" "$verdict" $((SECONDS - begin)))${detail:+: $detail}"
  [[ -n ${EXPECT[$name]:-} ]] && say "$(printf '%-15s expected: %s' "" "${EXPECT[$name]}")"
  detail=""
}
bb() { step "$1" "$PY" -m benchbatch "${@:2}"; }

detail="" failed=0
check=scripts/gpu_lifetime_check.py
to=$out/preflight.txt step preflight "$PY" "$check" preflight
if ((failed)); then  # nothing below could run: the one line says what is missing
  say "stopped: $(tail -n 1 "$out/preflight.txt")"
  exit 1
fi
machine='import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, \
torch.cuda.get_device_name()); print("gpus", torch.cuda.device_count())'
to=$out/machine.txt step machine bash -c 'nvidia-smi; "$1" -c "$2"' _ "$PY" "$machine"
to=$out/gpu-tests.txt step gpu-tests "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu.py
# Decode b=1 and b=32 graphs replayed after the cache is emptied and 4 GB refilled; then
# the kernels of a prefill and a masked mixed step (kernels.txt); then an OOM row and a row.
to=$out/graph-lifetime.txt step graph-lifetime "$PY" "$check" lifetime "$out/graph-lifetime"
# A new shape's first call on cuDNN's attention and on the backends benchbatch runs.
to=$out/attention.txt step attention "$PY" "$check" attention

bb reproduce reproduce --out "$out/reproduce" --force
to=$out/ranges.txt step ranges "$PY" "$check" ranges "$out/reproduce"
bb phases-eager phases --no-cuda-graphs --ceilings "$out/reproduce/probe.csv" \
  --out "$out/phases-eager" --force
# Inductor's fused kernels replayed from benchbatch's own CUDA graph (inductor skips its
# own for the KV writes: the first H200 run's log): does fusing the ~25 small kernels a
# layer take decode b=1 from the eager step's time (1.08 ms in the first H200 run) toward
# its 0.32 ms weight read? (one prefill of 128 and decode b=1 only: the compile took 29 s
# for three shapes there.)
to=$out/phases-compile.txt step phases-compile env TORCH_LOGS=cudagraphs,recompiles \
  "$PY" -m benchbatch phases --compile --cuda-graphs --prefill 128 --decode-batch 1 \
  --min-time 0.05 --ceilings "$out/reproduce/probe.csv" --out "$out/phases-compile" --force
bb sweep-contexts sweep --context 128,512,2048 --ceilings "$out/reproduce/probe.csv" \
  --out "$out/sweep-contexts" --force
bb occupancy-real occupancy --engine real --requests 48 --output-median 16 --max-output 48 --out "$out/occupancy-real" --force
bb ablation ablation --engine real --requests 16 --long-prompt-len 1024 \
  --max-num-batched-tokens 512 --chunk-size 256 --max-num-seqs 8 --out "$out/ablation" --force
bb piggyback piggyback --decode-batch 32 --cuda-graphs --out "$out/piggyback" --force

# Tensor parallelism: two ranks (NCCL, one GPU each) time prefill and decode with their
# all-reduces, after the device's and the interconnect's ceilings (all-reduce bus bandwidth).
gpus=$(sed -n 's/^gpus \([0-9]*\)$/\1/p' "$out/machine.txt")
if ((${gpus:-0} >= 2)); then
  step tensor-parallel "$PY" -m torch.distributed.run --nproc-per-node 2 -m benchbatch phases \
    --prefill 512 --decode-batch 1,32 --min-time 0.05 --out "$out/tensor-parallel" --force
else
  say "$(printf '%-15s %s' tensor-parallel "skipped: ${gpus:-no} GPU(s) here, it needs two")"
fi

# Packed beside, then moved in: a tar of the folder it is writing into fails.
tgz=$(mktemp --suffix=.tgz)
step pack bash -c \
  'tar czf "$1" -C "$2" --exclude gpu-results.tgz . && mv "$1" "$2/gpu-results.tgz"' _ "$tgz" "$out"
say "done in $((SECONDS - started)) s; $failed step(s) not ok"
((failed == 0))
