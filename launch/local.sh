#!/usr/bin/env bash
# Single machine: N local ranks with torchrun (gloo on CPU, nccl on GPU).
#   launch/local.sh 4 algorithm=ddp train.steps=100
# (`decentrain ...` does the same without torchrun, via torch's launcher API.)
set -euo pipefail
NPROC=${1:?usage: launch/local.sh NPROC [hydra overrides...]}
shift
cd "$(dirname "$0")/.."
exec torchrun --standalone --nproc-per-node "$NPROC" -m recipes.train launcher=torchrun "$@"
