#!/usr/bin/env bash
# Multi-worker fairseq-train on CPU (or as a template for several machines).
#
# On this fairseq build, CPU multi-worker training works only with
# --ddp-backend legacy_ddp, started as one process per worker with an
# explicit init method (torchrun provides RANK/WORLD_SIZE/MASTER_*), and a
# resumed run must let every worker read the checkpoint
# (--load-checkpoint-on-all-dp-ranks). This script sets all of that; GPUs
# use fairseq's default pytorch_ddp and need none of it.
#
# Usage: scripts/train_distributed.sh WORKERS fairseq-train arguments...
#   e.g. scripts/train_distributed.sh 2 data-bin --user-dir fairseq_hardattn \
#          --arch transformer_hard_dec_small --max-tokens 4096 --lr 5e-4 ...
# Environment: MASTER_PORT (default 29500), THREADS per worker (default 1).
set -euo pipefail
WORKERS=${1:?usage: train_distributed.sh WORKERS fairseq-train-arguments...}
shift
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "train_distributed.sh: WORKERS must be a positive integer, got '$WORKERS'" >&2; exit 2; }
export OMP_NUM_THREADS=${THREADS:-1}
BIN="$(dirname "$(command -v python)")"
exec "$BIN/torchrun" --nproc-per-node "$WORKERS" --master-port "${MASTER_PORT:-29500}" \
  --no-python bash -c 'exec "$0" "$@" --cpu --distributed-world-size "$WORLD_SIZE" \
    --distributed-backend gloo --distributed-init-method env:// --distributed-no-spawn \
    --distributed-rank "$RANK" --ddp-backend legacy_ddp --load-checkpoint-on-all-dp-ranks' \
  "${FAIRSEQ_TRAIN:-$BIN/fairseq-train}" "$@"
