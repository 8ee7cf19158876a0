#!/usr/bin/env bash
# Learn joint BPE on the tokenized, lowercased Multi30k training data with
# subword-nmt, apply it, and binarize with fairseq-preprocess.
# Usage: prepare.sh DATA_DIR WORK_DIR      (DATA_DIR: ../shared/data/multi30k)
set -euo pipefail
source "$(dirname "$0")/common.sh"
DATA_DIR=${1:?usage: prepare.sh DATA_DIR WORK_DIR}
WORK_DIR=${2:?usage: prepare.sh DATA_DIR WORK_DIR}
TOK="$DATA_DIR/tok"
for f in train.en train.de val.en val.de test_2016_flickr.en test_2016_flickr.de; do
  [ -s "$TOK/$f" ] || { echo "prepare.sh: missing $TOK/$f (is DATA_DIR the multi30k folder?)" >&2; exit 2; }
done
if [ -f "$WORK_DIR/data-bin/.done" ]; then log "data ready in $WORK_DIR/data-bin"; exit 0; fi

BPE="$WORK_DIR/bpe"
mkdir -p "$BPE"
log "learning $BPE_MERGES joint BPE merges (subword-nmt)"
subword-nmt learn-joint-bpe-and-vocab --input "$TOK/train.en" "$TOK/train.de" \
  -s "$BPE_MERGES" -o "$BPE/codes" --write-vocabulary "$BPE/vocab.en" "$BPE/vocab.de" \
  2> "$WORK_DIR/learn-bpe.log"
for split in train val test_2016_flickr; do
  for lang in en de; do
    subword-nmt apply-bpe -c "$BPE/codes" --vocabulary "$BPE/vocab.$lang" \
      --vocabulary-threshold 1 < "$TOK/$split.$lang" > "$BPE/$split.$lang"
  done
done
log "binarizing"
fairseq-preprocess --source-lang en --target-lang de --joined-dictionary \
  --trainpref "$BPE/train" --validpref "$BPE/val" --testpref "$BPE/test_2016_flickr" \
  --destdir "$WORK_DIR/data-bin" --workers "$THREADS" > "$WORK_DIR/preprocess.log" 2>&1
touch "$WORK_DIR/data-bin/.done"
log "data ready in $WORK_DIR/data-bin"
