#!/usr/bin/env bash
# Regenerate every results table and plot: train every run of
# examples/multi30k/experiments.py (the one list of runs, fine-tunings,
# decoding variants and benchmarks) on Multi30k en-de with one budget
# (examples/multi30k/common.sh), average checkpoints, score test2016 and the
# validation set (tokenized lowercased BLEU and sacreBLEU with its
# signature), run the benchmarks, and write results/ (Markdown, JSON, PNG),
# which the README includes. The score records join the committed ones in
# results/scores.json, from which the tables are built: a work dir of a few runs
# adds its rows to the others. Resumable: every finished step is skipped
# (delete its output to redo it).
#
# Usage: scripts/results.sh DATA_DIR [WORK_DIR]
#   DATA_DIR  the multi30k folder (../shared/data/multi30k here)
#   WORK_DIR  BPE, binarized data, checkpoints (default: work/multi30k)
# Environment: ONLY="soft hard ..." to restrict the runs; SKIP_BENCH=1;
#   PARALLEL=2 trains and scores two runs at a time (one thread each: 1.7x the
#   throughput of one two-thread run on 2 cores; PARALLEL=12 on one GPU); budget knobs in common.sh
#   (EPOCHS, WARMUP, AVERAGE_LAST, ...); REFERENCE=OTHER_WORK_DIR adds that
#   work dir's scores (e.g. a longer budget) to the README as a second table.
#   A work dir trained with another budget than results/scores.json's budget
#   leaves the tables as they are and prints its scores.
# Never time while anything else runs on the machine: the benchmarks here
# run after all training has finished.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
M30K="$REPO/examples/multi30k"
source "$M30K/common.sh"
DATA_DIR=${1:?usage: results.sh DATA_DIR [WORK_DIR]}
WORK_DIR=$(mkdir -p "${2:-work/multi30k}" && cd "${2:-work/multi30k}" && pwd)
RESULTS="$REPO/results"
PARALLEL=${PARALLEL:-1}
mkdir -p "$RESULTS"

bash "$M30K/prepare.sh" "$DATA_DIR" "$WORK_DIR"
# the budget every run of this work dir is trained with, for the tables' notes
printf '{"epochs": %s, "warmup_updates": %s, "max_tokens": %s, "average_last": %s, "seed": %s, "beam": %s}\n' \
  "$EPOCHS" "$WARMUP" "$MAX_TOKENS" "$AVERAGE_LAST" "$SEED" "$BEAM" > "$WORK_DIR/budget.json"

EXPERIMENTS=("$PYTHON" "$M30K/experiments.py")  # the list of runs, fine-tunings, decodes, benchmarks
trained() { [ -f "$WORK_DIR/runs/$1/checkpoint_avg.pt" ]; }
selected() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

# --- training (resumable; PARALLEL at a time) ------------------------------------
# runs first, then fine-tunings, each as soon as what it needs is there: a
# fine-tuning continues a trained run at its peak lr (fixed, or inverse-sqrt
# after a warmup), e.g. one epoch with the gate loss, or a soft checkpoint
# converted to hard retrieval, distilled from a teacher where one is named; a
# run or fine-tuning with a corpus trains on that run's translations of the
# training sources (sequence-level distillation, made once per run as soon as
# it is trained). A failed job is logged and leaves its run untrained; the rest go on.
JOB_THREADS=$(( PARALLEL > 1 ? 1 : THREADS ))
wait_for_slot() { while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n || true; done; }
corpus_dir() { echo "$WORK_DIR/distilled/$1"; }
distilled() { [ "$1" = - ] || [ -f "$(corpus_dir "$1")/data-bin/.done" ]; }
data_of() { if [ "$1" = - ]; then echo "$WORK_DIR/data-bin"; else echo "$(corpus_dir "$1")/data-bin"; fi; }
distill() {
  log "$1: translating the training set (sequence-level distillation, $(corpus_dir "$1"))"
  OMP_NUM_THREADS=$JOB_THREADS "$PYTHON" -m hardattn_tools.distillation "$WORK_DIR/data-bin" \
    "$WORK_DIR/runs/$1/checkpoint_avg.pt" "$(corpus_dir "$1")" --beam "$BEAM" -- "${DEVICE_FLAGS[@]}" \
    || log "$1: distillation failed (see $(corpus_dir "$1"))"
}
train_run() {
  local name arch corpus flags
  IFS=$'\t' read -r name arch corpus flags <<< "$1"
  # shellcheck disable=SC2086
  DATA_BIN=$(data_of "$corpus") THREADS=$JOB_THREADS bash "$M30K/train.sh" "$WORK_DIR" "$name" "$arch" $flags \
    || log "$name: training failed (see $WORK_DIR/runs/$name/train.log)"
}
finetune() {
  local name start arch epochs average warmup lr teacher corpus flags schedule distill=()
  IFS=$'\t' read -r name start arch epochs average warmup lr teacher corpus flags <<< "$1"
  schedule=(LR_SCHEDULER=fixed)
  [ "$warmup" -gt 0 ] && schedule=(LR_SCHEDULER=inverse_sqrt WARMUP="$warmup")
  [ "$teacher" != - ] && distill=(--distill-teacher "$WORK_DIR/runs/$teacher/checkpoint_avg.pt")
  # shellcheck disable=SC2086
  env DATA_BIN="$(data_of "$corpus")" THREADS="$JOB_THREADS" EPOCHS="$epochs" AVERAGE_LAST="$average" \
    "${schedule[@]}" bash "$M30K/train.sh" "$WORK_DIR" "$name" "$arch" \
    --finetune-from-model "$WORK_DIR/runs/$start/checkpoint_avg.pt" --lr "$lr" "${distill[@]}" $flags \
    || log "$name: fine-tuning failed (see $WORK_DIR/runs/$name/train.log)"
}
mapfile -t RUNS < <("${EXPERIMENTS[@]}" runs)
mapfile -t FINETUNES < <("${EXPERIMENTS[@]}" finetunes)
# each job: its kind, then its manifest line
pending=()
for line in "${RUNS[@]}"; do selected "${line%%$'\t'*}" && pending+=("run"$'\t'"$line"); done
for line in "${FINETUNES[@]}"; do selected "${line%%$'\t'*}" && pending+=("finetune"$'\t'"$line"); done
distilling=" "  # runs whose translations have been started (once each)
while [ "${#pending[@]}" -gt 0 ]; do
  waiting=()
  for job in "${pending[@]}"; do
    kind=${job%%$'\t'*} line=${job#*$'\t'}
    if [ "$kind" = run ]; then
      IFS=$'\t' read -r _ _ corpus _ <<< "$line"; needs=()
    else
      IFS=$'\t' read -r _ start _ _ _ _ _ teacher corpus _ <<< "$line"; needs=("$start" "$teacher")
    fi
    [ "$corpus" != - ] && needs+=("$corpus")
    ready=1
    for run in "${needs[@]}"; do [ "$run" = - ] || trained "$run" || ready=0; done
    if [ "$ready" = 1 ] && ! distilled "$corpus"; then
      ready=0
      if [[ "$distilling" != *" $corpus "* ]]; then
        distilling+="$corpus "; wait_for_slot; distill "$corpus" &
      fi
    fi
    if [ "$ready" = 1 ]; then
      wait_for_slot
      if [ "$kind" = run ]; then train_run "$line" & else finetune "$line" & fi
    else
      waiting+=("$job")
    fi
  done
  if [ "${#waiting[@]}" -eq "${#pending[@]}" ]; then
    if [ -z "$(jobs -rp)" ]; then  # nothing left that could train or translate what they need
      for job in "${waiting[@]}"; do
        line=${job#*$'\t'}
        log "${line%%$'\t'*}: skipped (its start run, teacher or distilled corpus is not ready)"
      done
      break
    fi
    sleep 5
  fi
  pending=("${waiting[@]}")
done
wait

# --- BLEU: test2016 (reported) and the validation set (for selecting) -----------
# (one thread each when PARALLEL > 1, as in training: more oversubscribe the cores)
evaluate() { THREADS=$JOB_THREADS bash "$M30K/evaluate.sh" "$DATA_DIR" "$WORK_DIR" "$@" > /dev/null || log "$2: scoring failed"; }
for name in "${RUNS[@]%%$'\t'*}" "${FINETUNES[@]%%$'\t'*}"; do
  trained "$name" || continue
  wait_for_slot; evaluate "$name" "$name" &
  wait_for_slot; SUBSET=valid evaluate "$name" "$name" &
done
# decodes (other options or search settings) on both sets too: settings are chosen on valid
while IFS=$'\t' read -r name run overrides search; do
  trained "$run" || continue
  [ "$search" = - ] && search=""
  # shellcheck disable=SC2086
  for subset in test valid; do
    wait_for_slot; SUBSET=$subset evaluate "$run" "$name" --model-overrides "$overrides" $search &
  done
done < <("${EXPERIMENTS[@]}" decodes)
wait

# the tables: this work dir's scores join results/scores.json unless it was trained
# with another budget (a longer one's pair, say): then they are printed instead
write_tables() {
  local status=0
  "$PYTHON" "$REPO/scripts/results_table.py" "$WORK_DIR" "$RESULTS" ${REFERENCE:+--reference "$REFERENCE"} \
    || status=$?
  [ "$status" = 3 ] || return "$status"  # 3: another budget (results_table.py); any other failure stops
  log "tables not written ($WORK_DIR has another budget than results/scores.json); its scores:"
  "$PYTHON" "$REPO/scripts/results_table.py" "$WORK_DIR" --print
}
[ "${SKIP_BENCH:-0}" = 1 ] && { write_tables; exit 0; }

# --- benchmarks (nothing else may run now) --------------------------------------
export OMP_NUM_THREADS=1
for name in $("${EXPERIMENTS[@]}" benchmarks); do
  [ -s "$RESULTS/$name.json" ] && continue
  log "benchmark: $name"
  mapfile -t ARGS < <("${EXPERIMENTS[@]}" benchmark "$name" "$WORK_DIR")
  "$PYTHON" "$REPO/scripts/benchmark_decoding.py" --json "$RESULTS/$name.json.tmp" \
    --markdown "$RESULTS/$name.md" "${ARGS[@]}" >&2 && mv "$RESULTS/$name.json.tmp" "$RESULTS/$name.json"
done
# one decoding step of cross-attention alone, per mechanism (Base dims)
[ -s "$RESULTS/attention_step_costs.json" ] || "$PYTHON" "$REPO/research/attention_step_costs.py" \
  --src-len 50 100 200 400 --reps 15 --threads 1 --json "$RESULTS/attention_step_costs.json" \
  --markdown "$RESULTS/attention_step_costs.md" >&2
# the same at the small preset's dims (d = 128, 4 heads): Multi30k's ~15-token
# sources, and longer ones
[ -s "$RESULTS/attention_step_costs_small.json" ] || "$PYTHON" "$REPO/research/attention_step_costs.py" \
  --embed-dim 128 --heads 4 --src-len 15 30 100 --reps 15 --threads 1 \
  --json "$RESULTS/attention_step_costs_small.json" \
  --markdown "$RESULTS/attention_step_costs_small.md" >&2
[ -s "$RESULTS/op_costs_cpu.json" ] || "$PYTHON" "$REPO/research/op_costs.py" --threads 1 \
  --json "$RESULTS/op_costs_cpu.json" --markdown "$RESULTS/op_costs_cpu.md" >&2
# the Linear per kernel at a step's shapes (which layers float32 packs for oneDNN, which engine int8 packs for)
[ -s "$RESULTS/linear_engines.json" ] || "$PYTHON" "$REPO/research/linear_engines.py" --threads 1 \
  --json "$RESULTS/linear_engines.json" --markdown "$RESULTS/linear_engines.md" >&2
[ -s "$RESULTS/memory.json" ] || "$PYTHON" "$REPO/research/memory_profile.py" \
  --arch transformer_soft_small --arch transformer_hard_dec_small --arch transformer_cross_self_small \
  --arch transformer_hard_cross_self_small --arch transformer_aan_small \
  --arch transformer_local_small --arch transformer_flexible_small \
  --json "$RESULTS/memory.json" --markdown "$RESULTS/memory.md" >&2
[ -s "$RESULTS/speed_vs_length.json" ] || "$PYTHON" "$REPO/research/plot_speed_vs_length.py" \
  --arch soft=transformer_soft --arch hard=transformer_hard_dec \
  --arch cross_self=transformer_cross_self --arch aan=transformer_aan \
  --arch flexible=transformer_flexible --arch local=transformer_local \
  --lengths 10 30 100 --num-sentences 16 --batch-size 16 --reps 1 \
  --out "$RESULTS/speed_vs_length.png" --json "$RESULTS/speed_vs_length.json" >&2
CURVES=()
trained flexible_ft && \
  CURVES+=(--checkpoint "fine-tuned (gate loss)=$WORK_DIR/runs/flexible_ft/checkpoint_avg.pt")
trained flexible_band_ft && \
  CURVES+=(--checkpoint "fine-tuned within the bands of τ (auto)=$WORK_DIR/runs/flexible_band_ft/checkpoint_avg.pt")
if [ "${#CURVES[@]}" -gt 0 ] && [ ! -s "$RESULTS/bleu_vs_cps.json" ]; then
  "$PYTHON" "$REPO/research/bleu_vs_cps.py" --data "$WORK_DIR/data-bin" "${CURVES[@]}" \
    --tok-ref "$DATA_DIR/tok/test_2016_flickr.de" --thresholds 0.1 0.25 0.5 0.75 1 auto 2 4 inf \
    --out "$RESULTS/bleu_vs_cps.png" --json "$RESULTS/bleu_vs_cps.json" >&2
fi
# the d/4 gate network, band-fine-tuned, between tau = 0.75 and the paper's rule
if trained flexible_gate32_band_ft && [ ! -s "$RESULTS/bleu_vs_cps_gate32.json" ]; then
  "$PYTHON" "$REPO/research/bleu_vs_cps.py" --data "$WORK_DIR/data-bin" --threads 2 \
    --checkpoint "gate32=$WORK_DIR/runs/flexible_gate32_band_ft/checkpoint_avg.pt" \
    --tok-ref "$DATA_DIR/tok/test_2016_flickr.de" --thresholds 0.75 0.9 1 1.25 \
    --out "$RESULTS/bleu_vs_cps_gate32.png" --json "$RESULTS/bleu_vs_cps_gate32.json" >&2
fi
for run in soft hard flexible_ft; do
  trained "$run" && [ ! -s "$RESULTS/attention_$run.png" ] && \
    "$PYTHON" "$REPO/scripts/plot_attention.py" --data "$WORK_DIR/data-bin" \
      --checkpoint "$WORK_DIR/runs/$run/checkpoint_avg.pt" --index 7 \
      --out "$RESULTS/attention_$run.png" \
      $( [ "$run" = flexible_ft ] && echo --gate-out "$RESULTS/flexible_gate.png" ) >&2
done
write_tables
