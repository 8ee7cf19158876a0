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
# the organisers' tokenized splits, under the names bpe_binarize.sh binarizes
# as fairseq's train / valid / test subsets
BPE_MERGES="$BPE_MERGES" THREADS="$THREADS" \
  bash "$(dirname "$0")/../bpe_binarize.sh" "$TOK" en de "$WORK_DIR" train val test_2016_flickr
