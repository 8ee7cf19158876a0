#!/usr/bin/env bash
# Multi30k en-de (Task 1), test2016: the soft baseline and hard retrieval
# attention trained with identical settings (common.sh), each decoded as
# trained and with the other attention kind (the paper's Table 4).
#
# Usage: examples/multi30k/run.sh DATA_DIR [WORK_DIR]
#   DATA_DIR: the multi30k folder (../shared/data/multi30k here)
#   WORK_DIR: where BPE, binarized data, checkpoints and results go
#             (default: work/multi30k); every stage is skipped when done.
#   ABLATIONS=1 also trains the paper's Table 3 ablations (hard cross-attention
#   only; hard encoder self-attention too). EPOCHS, SEED, THREADS: common.sh.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/common.sh"
DATA_DIR=${1:?usage: run.sh DATA_DIR [WORK_DIR]}
WORK_DIR=${2:-work/multi30k}
mkdir -p "$WORK_DIR"

bash "$HERE/prepare.sh" "$DATA_DIR" "$WORK_DIR"

EXPERIMENTS=("$PYTHON" "$HERE/experiments.py")  # the runs and decodes, declared once
WANTED=" soft hard soft_decoded_hard hard_decoded_soft "
[ "${ABLATIONS:-0}" = 1 ] && WANTED+="hard_cross hard_all "
while IFS=$'\t' read -r name arch _ flags; do
  # shellcheck disable=SC2086
  [[ "$WANTED" == *" $name "* ]] && bash "$HERE/train.sh" "$WORK_DIR" "$name" "$arch" $flags
done < <("${EXPERIMENTS[@]}" runs)
for subset in valid test; do
  while IFS=$'\t' read -r name arch _ flags; do
    [[ "$WANTED" == *" $name "* ]] && SUBSET=$subset bash "$HERE/evaluate.sh" "$DATA_DIR" "$WORK_DIR" "$name" "$name" > /dev/null
  done < <("${EXPERIMENTS[@]}" runs)
  while IFS=$'\t' read -r name run overrides; do
    [[ "$WANTED" == *" $name "* ]] && SUBSET=$subset bash "$HERE/evaluate.sh" "$DATA_DIR" "$WORK_DIR" "$run" "$name" \
      --model-overrides "$overrides" > /dev/null
  done < <("${EXPERIMENTS[@]}" decodes)
done
"$PYTHON" "$HERE/../../scripts/results_table.py" "$WORK_DIR" --print
