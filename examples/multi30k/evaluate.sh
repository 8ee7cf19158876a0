#!/usr/bin/env bash
# Translate test2016 with a trained run's averaged checkpoint and score it:
# tokenized lowercased BLEU (comparable with published numbers) and
# sacreBLEU on detokenized output. Writes RESULT_DIR/NAME.{gen,json}.
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
if [ -s "$OUT/$NAME.json" ]; then log "$NAME: already scored"; cat "$OUT/$NAME.json"; exit 0; fi

log "$NAME: translating test2016 (beam $BEAM)"
fairseq-generate "$WORK_DIR/data-bin" --user-dir "$USER_DIR" --path "$CKPT" --cpu \
  --gen-subset test --beam "$BEAM" --batch-size 128 --remove-bpe "$@" \
  > "$OUT/$NAME.gen" 2> "$OUT/$NAME.gen.log"
python -m fairseq_hardattn.tools.scoring "$OUT/$NAME.gen" --json \
  --tok-ref "$DATA_DIR/tok/test_2016_flickr.de" \
  --raw-ref "$DATA_DIR/raw/test_2016_flickr.de" --detok-lang de > "$OUT/$NAME.json.tmp"
mv "$OUT/$NAME.json.tmp" "$OUT/$NAME.json"
cat "$OUT/$NAME.json"
