#!/usr/bin/env bash
# From raw parallel text to BLEU with hard retrieval attention: joint BPE,
# binarize, train, translate the test set, score with sacreBLEU.
# Usage: examples/quickstart.sh RAW_DIR SRC TGT WORK_DIR
#   RAW_DIR holds train.SRC train.TGT valid.* test.*: one tokenized sentence
#   per line. ARCH (default transformer_hard_dec_small), EPOCHS (default 25),
#   BPE_MERGES (default 10000). Runs on the CPU; add FAIRSEQ_FLAGS=... for more.
set -euo pipefail
USAGE="usage: quickstart.sh RAW_DIR SRC TGT WORK_DIR"
RAW=${1:?$USAGE}; SRC=${2:?$USAGE}; TGT=${3:?$USAGE}; WORK=${4:?$USAGE}
: "${ARCH:=transformer_hard_dec_small}" "${EPOCHS:=25}"
USER_DIR=$(python -m fairseq_hardattn)  # the plugin, from any working directory

bash "$(dirname "$0")/bpe_binarize.sh" "$RAW" "$SRC" "$TGT" "$WORK" train valid test

fairseq-train "$WORK/data-bin" --user-dir "$USER_DIR" --arch "$ARCH" --cpu \
  --share-all-embeddings --dropout 0.3 --optimizer adam --adam-betas '(0.9,0.98)' \
  --lr 0.004 --lr-scheduler inverse_sqrt --warmup-updates 800 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 4096 --max-epoch "$EPOCHS" --save-dir "$WORK/checkpoints" \
  --no-progress-bar --log-format simple ${FAIRSEQ_FLAGS:-} > "$WORK/train.log" 2>&1

fairseq-generate "$WORK/data-bin" --user-dir "$USER_DIR" --cpu \
  --path "$WORK/checkpoints/checkpoint_best.pt" --beam 4 --remove-bpe > "$WORK/test.gen"
grep '^H-' "$WORK/test.gen" | sed 's/^H-//' | sort -n | cut -f3 > "$WORK/test.hyp"
sacrebleu "$RAW/test.$TGT" -i "$WORK/test.hyp" -m bleu -b
