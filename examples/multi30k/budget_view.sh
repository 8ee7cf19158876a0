#!/usr/bin/env bash
# Score a shorter budget of a long training without training again: with the
# inverse-sqrt schedule (which does not depend on --max-epoch) the epochs up to
# EPOCH of a 60-epoch run are those of an EPOCH-epoch run, so averaging the
# last AVERAGE_LAST checkpoints up to EPOCH gives the model that budget trains.
# VIEW_DIR gets the long run's data (linked), each run's average at EPOCH and
# its valid and test2016 scores, like a work dir of scripts/results.sh (read it
# with scripts/results_table.py VIEW_DIR --print). The long run must keep its
# epoch checkpoints: train it with KEEP_EPOCHS=-1 (common.sh).
# Usage: budget_view.sh DATA_DIR LONG_WORK_DIR EPOCH VIEW_DIR [RUN...]
#   (default: every run of LONG_WORK_DIR that has reached EPOCH)
#   e.g. budget_view.sh ../shared/data/multi30k work/m30k_60ep 25 work/m30k_60ep_at25
set -euo pipefail
source "$(dirname "$0")/common.sh"
USAGE="usage: budget_view.sh DATA_DIR LONG_WORK_DIR EPOCH VIEW_DIR [RUN...]"
DATA_DIR=${1:?$USAGE}; LONG=$(cd "${2:?$USAGE}" && pwd); EPOCH=${3:?$USAGE}; VIEW=${4:?$USAGE}
shift 4
[[ "$EPOCH" =~ ^[1-9][0-9]*$ ]] || { echo "budget_view.sh: EPOCH must be a positive number, not $EPOCH" >&2; exit 2; }
[ -d "$LONG/data-bin" ] || { echo "budget_view.sh: $LONG/data-bin not found (is it a work dir of results.sh?)" >&2; exit 2; }
mkdir -p "$VIEW/runs"
for dir in bpe data-bin; do ln -sfn "$LONG/$dir" "$VIEW/$dir"; done
RUNS=("$@")
if [ "${#RUNS[@]}" -eq 0 ]; then
  for ckpt in "$LONG"/runs/*/checkpoint"$EPOCH".pt; do
    [ -f "$ckpt" ] && RUNS+=("$(basename "$(dirname "$ckpt")")")
  done
fi
[ "${#RUNS[@]}" -gt 0 ] || { echo "budget_view.sh: no run of $LONG has reached epoch $EPOCH" >&2; exit 2; }
# the long run's budget with this number of epochs, for the tables' notes
"$PYTHON" - "$LONG/budget.json" "$VIEW/budget.json" "$EPOCH" <<'EOF'
import json, sys
budget = json.load(open(sys.argv[1]))
budget["epochs"] = int(sys.argv[3])
json.dump(budget, open(sys.argv[2], "w"))
EOF
for run in "${RUNS[@]}"; do
  # a run that reached EPOCH but deleted the epochs before it (the averaging
  # tool names a run that has not reached EPOCH)
  for ((epoch = EPOCH - AVERAGE_LAST + 1; epoch < EPOCH; epoch++)); do
    if [ "$epoch" -ge 1 ] && [ -f "$LONG/runs/$run/checkpoint$EPOCH.pt" ] \
        && [ ! -f "$LONG/runs/$run/checkpoint$epoch.pt" ]; then
      echo "budget_view.sh: $run: checkpoint$epoch.pt was not kept (train the long run with KEEP_EPOCHS=-1)" >&2
      exit 2
    fi
  done
  if [ ! -f "$VIEW/runs/$run/checkpoint_avg.pt" ]; then
    mkdir -p "$VIEW/runs/$run"
    log "$run: averaging the last $AVERAGE_LAST epoch checkpoints up to epoch $EPOCH"
    "$PYTHON" -m hardattn_tools.average_checkpoints --inputs "$LONG/runs/$run" \
      --num-epoch-checkpoints "$AVERAGE_LAST" --checkpoint-upper-bound "$EPOCH" \
      --output "$VIEW/runs/$run/checkpoint_avg.pt.tmp"
    mv "$VIEW/runs/$run/checkpoint_avg.pt.tmp" "$VIEW/runs/$run/checkpoint_avg.pt"
  fi
  for subset in valid test; do
    SUBSET=$subset bash "$(dirname "$0")/evaluate.sh" "$DATA_DIR" "$VIEW" "$run" "$run" > /dev/null
  done
done
log "scores in $VIEW/results"
