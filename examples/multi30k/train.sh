#!/usr/bin/env bash
# Train one architecture with the shared settings, then average its last
# checkpoints. Resumable: a finished run is not redone, an interrupted one
# continues from checkpoint_last.pt.
# Usage: train.sh WORK_DIR NAME ARCH [extra fairseq-train flags...]
#   e.g. train.sh work soft transformer_soft_small
#   DATA_BIN: the binarized data (default WORK_DIR/data-bin; e.g. a distilled
#   corpus of hardattn_tools/distillation.py)
set -euo pipefail
source "$(dirname "$0")/common.sh"
WORK_DIR=${1:?usage: train.sh WORK_DIR NAME ARCH [flags...]}
NAME=${2:?usage: train.sh WORK_DIR NAME ARCH [flags...]}
ARCH=${3:?usage: train.sh WORK_DIR NAME ARCH [flags...]}
shift 3
DATA_BIN=${DATA_BIN:-$WORK_DIR/data-bin}
RUN="$WORK_DIR/runs/$NAME"
mkdir -p "$RUN"
if [ -f "$RUN/checkpoint_avg.pt" ]; then log "$NAME: already trained"; exit 0; fi

log "$NAME: training $ARCH for $EPOCHS epochs (log: $RUN/train.log)"
fairseq-train "$DATA_BIN" --arch "$ARCH" "${TRAIN_FLAGS[@]}" \
  --save-dir "$RUN" --keep-last-epochs "$KEEP_EPOCHS" "$@" \
  >> "$RUN/train.log" 2>&1
log "$NAME: averaging the last $AVERAGE_LAST epoch checkpoints"
"$PYTHON" -m hardattn_tools.average_checkpoints --inputs "$RUN" \
  --num-epoch-checkpoints "$AVERAGE_LAST" --output "$RUN/checkpoint_avg.pt" >> "$RUN/train.log" 2>&1
log "$NAME: done ($RUN/checkpoint_avg.pt)"
