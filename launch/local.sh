#!/bin/bash
# zerotopo on this machine: the emulated local cluster (8 CPU ranks as 2 nodes x 2 packages x 2 dies,
# gloo). zerotopo spawns the ranks itself; no launcher is involved.
#
#   launch/local.sh                          # the tiny config
#   launch/local.sh configs/<model>.yml --set train_iters=20
set -euo pipefail
run() { if [[ -n "${ZEROTOPO_DRY_RUN:-}" ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }

CONFIG=${1:-configs/tiny.yml}
shift || true
# Eight ranks share the machine's cores: one thread each keeps them from oversubscribing it.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
run zerotopo train "$CONFIG" --launcher local "$@"
