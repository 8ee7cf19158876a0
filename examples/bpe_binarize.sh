#!/usr/bin/env bash
# Learn joint BPE on the training text (subword-nmt), apply it to every split,
# and binarize with one dictionary for both languages (fairseq-preprocess
# --joined-dictionary, which --share-all-embeddings needs).
# Usage: bpe_binarize.sh RAW_DIR SRC TGT WORK_DIR TRAIN VALID TEST
#   RAW_DIR/TRAIN.SRC etc.: one (tokenized) sentence per line, aligned by line.
#   Writes WORK_DIR/bpe/{codes,vocab.*,SPLIT.*} and WORK_DIR/data-bin.
#   BPE_MERGES (default 10000), THREADS (default 2).
set -euo pipefail
USAGE="usage: bpe_binarize.sh RAW_DIR SRC TGT WORK_DIR TRAIN VALID TEST"
RAW=${1:?$USAGE}; SRC=${2:?$USAGE}; TGT=${3:?$USAGE}; WORK=${4:?$USAGE}
TRAIN=${5:?$USAGE}; VALID=${6:?$USAGE}; TEST=${7:?$USAGE}
: "${BPE_MERGES:=10000}" "${THREADS:=2}"
for split in "$TRAIN" "$VALID" "$TEST"; do
  for lang in "$SRC" "$TGT"; do
    [ -s "$RAW/$split.$lang" ] || { echo "bpe_binarize.sh: missing $RAW/$split.$lang" >&2; exit 2; }
  done
done
if [ -f "$WORK/data-bin/.done" ]; then echo "data ready in $WORK/data-bin" >&2; exit 0; fi

BPE="$WORK/bpe"
mkdir -p "$BPE"
echo "learning $BPE_MERGES joint BPE merges (subword-nmt)" >&2
subword-nmt learn-joint-bpe-and-vocab --input "$RAW/$TRAIN.$SRC" "$RAW/$TRAIN.$TGT" \
  -s "$BPE_MERGES" -o "$BPE/codes" --write-vocabulary "$BPE/vocab.$SRC" "$BPE/vocab.$TGT" \
  2> "$WORK/learn-bpe.log"
for split in "$TRAIN" "$VALID" "$TEST"; do
  for lang in "$SRC" "$TGT"; do
    subword-nmt apply-bpe -c "$BPE/codes" --vocabulary "$BPE/vocab.$lang" \
      --vocabulary-threshold 1 < "$RAW/$split.$lang" > "$BPE/$split.$lang"
  done
done
echo "binarizing" >&2
fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" --joined-dictionary \
  --trainpref "$BPE/$TRAIN" --validpref "$BPE/$VALID" --testpref "$BPE/$TEST" \
  --destdir "$WORK/data-bin" --workers "$THREADS" > "$WORK/preprocess.log" 2>&1
touch "$WORK/data-bin/.done"
echo "data ready in $WORK/data-bin" >&2
