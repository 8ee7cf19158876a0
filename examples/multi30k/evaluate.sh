#!/usr/bin/env bash
# Translate test2016 with a trained run's averaged checkpoint and score it:
# tokenized lowercased BLEU (comparable with published numbers) and
# sacreBLEU on detokenized output. Writes RESULT_DIR/NAME.{gen,json}.
# SUBSET=valid scores the validation set instead (NAME.valid.{gen,json}):
# select models and recipes there, report test2016.
# Usage: evaluate.sh DATA_DIR WORK_DIR RUN NAME [extra fairseq-generate flags...]
#   e.g. evaluate.sh ../shared/data/multi30k work soft soft
#        evaluate.sh ... work soft soft_decoded_hard --model-overrides "{'_name': 'transformer_hard_dec_small'}"
set -euo pipefail
source "$(dirname "$0")/common.sh"
USAGE="usage: evaluate.sh DATA_DIR WORK_DIR RUN NAME [flags...]"
DATA_DIR=${1:?$USAGE}; WORK_DIR=${2:?$USAGE}; RUN=${3:?$USAGE}; NAME=${4:?$USAGE}
shift 4
CKPT="$WORK_DIR/runs/$RUN/checkpoint_avg.pt"
[ -f "$CKPT" ] || { echo "evaluate.sh: $CKPT not found; train $RUN first" >&2; exit 2; }
OUT="$WORK_DIR/results"
mkdir -p "$OUT"
case "${SUBSET:-test}" in
  test) REF=test_2016_flickr; FILE=$NAME ;;
  valid) REF=val; FILE=$NAME.valid ;;
  *) echo "evaluate.sh: SUBSET must be test or valid, not $SUBSET" >&2; exit 2 ;;
esac
if [ -s "$OUT/$FILE.json" ]; then log "$FILE: already scored"; cat "$OUT/$FILE.json"; exit 0; fi

log "$FILE: translating ${SUBSET:-test} (beam $BEAM${*:+, flags: $*})"
fairseq-generate "$WORK_DIR/data-bin" --user-dir "$USER_DIR" --path "$CKPT" "${DEVICE_FLAGS[@]}" \
  --gen-subset "${SUBSET:-test}" --beam "$BEAM" --batch-size 128 --remove-bpe "$@" \
  > "$OUT/$FILE.gen" 2> "$OUT/$FILE.gen.log"
"$PYTHON" -m hardattn_tools.scoring "$OUT/$FILE.gen" --json \
  --tok-ref "$DATA_DIR/tok/$REF.de" \
  --raw-ref "$DATA_DIR/raw/$REF.de" --detok-lang de > "$OUT/$FILE.json.tmp"
mv "$OUT/$FILE.json.tmp" "$OUT/$FILE.json"
cat "$OUT/$FILE.json"
