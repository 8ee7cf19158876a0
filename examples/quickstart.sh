#!/usr/bin/env bash
# From raw parallel text to BLEU with hard retrieval attention: Moses
# tokenization (sacremoses, as fairseq's --tokenizer moses), joint BPE
# (subword-nmt), binarizing, training, translating the test set, then
# detokenizing and scoring with sacreBLEU against the raw references.
# Usage: examples/quickstart.sh RAW_DIR SRC TGT WORK_DIR
#   RAW_DIR holds $TRAIN.SRC $TRAIN.TGT, $VALID.* and $TEST.*: raw (untokenized)
#   text, one sentence per line, aligned by line. Split names: TRAIN=train
#   VALID=valid TEST=test unless set (Multi30k's raw/: VALID=val
#   TEST=test_2016_flickr). ARCH (default transformer_hard_dec_prenorm_small),
#   EPOCHS (default 25), BPE_MERGES (default 10000), THREADS (default 2),
#   WARMUP (warmup updates; default: a quarter of the run's updates, at most 800,
#   so that a short run leaves warmup). A run of fewer than about 500 updates
#   learns too little to translate well: the script warns.
#   Runs on the CPU; FAIRSEQ_FLAGS=... adds fairseq-train options. A step that
#   fails prints the end of its log.
set -euo pipefail
USAGE="usage: quickstart.sh RAW_DIR SRC TGT WORK_DIR"
RAW=${1:?$USAGE}; SRC=${2:?$USAGE}; TGT=${3:?$USAGE}; WORK=${4:?$USAGE}
: "${ARCH:=transformer_hard_dec_prenorm_small}" "${EPOCHS:=25}" "${THREADS:=2}"
: "${TRAIN:=train}" "${VALID:=valid}" "${TEST:=test}"
for split in "$TRAIN" "$VALID" "$TEST"; do
  for lang in "$SRC" "$TGT"; do
    [ -s "$RAW/$split.$lang" ] || {
      echo "quickstart.sh: missing $RAW/$split.$lang (set TRAIN, VALID, TEST to your split names)" >&2
      exit 2; }
  done
done
USER_DIR=$(python -m fairseq_hardattn)  # the plugin, from any working directory
mkdir -p "$WORK/tok"

# run a step with its output in a log; on failure, show the log's end
step() {
  local what=$1 log=$2; shift 2
  echo "quickstart: $what (log: $log)" >&2
  if ! "$@" > "$log" 2>&1; then
    echo "quickstart.sh: $what failed; the end of $log:" >&2
    tail -n 15 "$log" >&2
    exit 1
  fi
}

for split in "$TRAIN" "$VALID" "$TEST"; do
  for lang in "$SRC" "$TGT"; do
    # escaped, with aggressive dash splits: what fairseq's --tokenizer moses does
    sacremoses -l "$lang" -j "$THREADS" tokenize -a < "$RAW/$split.$lang" > "$WORK/tok/$split.$lang"
  done
done
step "BPE and binarizing" "$WORK/prepare.log" \
  bash "$(dirname "$0")/bpe_binarize.sh" "$WORK/tok" "$SRC" "$TGT" "$WORK" "$TRAIN" "$VALID" "$TEST"

# the run's updates, estimated: batches of about 4096 tokens (padding included)
tokens=$(( $(cat "$WORK/bpe/$TRAIN.$SRC" "$WORK/bpe/$TRAIN.$TGT" | wc -w) * 3 / 4 \
           + $(wc -l < "$WORK/bpe/$TRAIN.$TGT") ))
updates=$(( EPOCHS * (tokens / 4096 + 1) ))
if [ -z "${WARMUP:-}" ]; then
  WARMUP=$(( updates / 4 < 800 ? updates / 4 : 800 ))
  WARMUP=$(( WARMUP < 1 ? 1 : WARMUP ))
fi
if [ "$updates" -lt 500 ]; then
  echo "quickstart: warning: about $updates updates ($EPOCHS epochs of $(wc -l < "$WORK/bpe/$TRAIN.$TGT") lines)" \
       "are too few to learn to translate well (expect a BLEU of a few points at most); Multi30k's" \
       "29,000 lines take about 1,000 updates (6 epochs) to a BLEU in the twenties" >&2
fi
# shellcheck disable=SC2086
step "training $ARCH for $EPOCHS epochs ($WARMUP warmup updates)" "$WORK/train.log" \
  fairseq-train "$WORK/data-bin" --user-dir "$USER_DIR" --arch "$ARCH" --cpu \
  --share-all-embeddings --dropout 0.3 --optimizer adam --adam-betas '(0.9,0.98)' \
  --lr 0.004 --lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 4096 --max-epoch "$EPOCHS" --save-dir "$WORK/checkpoints" \
  --no-progress-bar --log-format simple ${FAIRSEQ_FLAGS:-}

step "translating $TEST" "$WORK/test.gen" \
  fairseq-generate "$WORK/data-bin" --user-dir "$USER_DIR" --cpu \
  --path "$WORK/checkpoints/checkpoint_best.pt" --beam 4 --remove-bpe
grep '^H-' "$WORK/test.gen" | sed 's/^H-//' | sort -n | cut -f3 \
  | sacremoses -l "$TGT" -j "$THREADS" detokenize > "$WORK/test.hyp"
echo "quickstart: sacreBLEU of $WORK/test.hyp against $RAW/$TEST.$TGT" >&2
sacrebleu "$RAW/$TEST.$TGT" -i "$WORK/test.hyp" -m bleu -b
