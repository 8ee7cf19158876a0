#!/usr/bin/env bash
# Regenerate every results table and plot: train every architecture of
# examples/multi30k/runs.tsv on Multi30k en-de with one budget
# (examples/multi30k/common.sh), average checkpoints, score test2016
# (tokenized lowercased BLEU and sacreBLEU with its signature), run the
# benchmarks, and write results/ (Markdown, JSON, PNG), which the README
# includes. Resumable: every finished step is skipped (delete its output to
# redo it).
#
# Usage: scripts/results.sh DATA_DIR [WORK_DIR]
#   DATA_DIR  the multi30k folder (../shared/data/multi30k here)
#   WORK_DIR  BPE, binarized data, checkpoints (default: work/multi30k)
# Environment: ONLY="soft hard ..." to restrict the runs; SKIP_BENCH=1;
#   PARALLEL=2 trains two runs at a time (one thread each: 1.7x the
#   throughput of one two-thread run on 2 cores); budget knobs in common.sh
#   (EPOCHS, WARMUP, AVERAGE_LAST, ...); REFERENCE=OTHER_WORK_DIR adds that
#   work dir's scores (e.g. a longer budget) to the README as a second table.
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

# --- training (resumable; PARALLEL runs at a time) ----------------------------
mapfile -t RUNS < <(grep -v '^#' "$M30K/runs.tsv" | cut -f1-3)
selected() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
train_run() {  # name arch [flags]
  local name=$1 arch=$2; shift 2
  THREADS=$(( PARALLEL > 1 ? 1 : THREADS )) bash "$M30K/train.sh" "$WORK_DIR" "$name" "$arch" "$@"
}
for line in "${RUNS[@]}"; do
  IFS=$'\t' read -r name arch flags <<< "$line"
  selected "$name" || continue
  # shellcheck disable=SC2086
  train_run "$name" "$arch" $flags &
  while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ]; do wait -n; done
done
wait
# one more epoch at a fixed lr of 1e-3, no warmup (Adam moves the gates ~lr per
# step): flexible attention fine-tuned with the gate loss (beta 0.1), and the
# soft baseline given the same epoch (plain loss) as its control
finetune() {  # name from arch [flags]
  local name=$1 from=$2 arch=$3; shift 3
  if selected "$name" && [ -f "$WORK_DIR/runs/$from/checkpoint_avg.pt" ]; then
    EPOCHS=1 AVERAGE_LAST=1 LR_SCHEDULER=fixed bash "$M30K/train.sh" "$WORK_DIR" "$name" "$arch" \
      --finetune-from-model "$WORK_DIR/runs/$from/checkpoint_avg.pt" --lr 0.001 "$@"
  fi
}
GATE_LOSS=(--criterion label_smoothed_cross_entropy_with_gate --gate-beta 0.1)
finetune flexible_ft flexible transformer_flexible_small "${GATE_LOSS[@]}"
# the same fine-tuning attending only within the bands of tau (the paper's
# rule), where decoding will look: the model adapts to the positions skipped
finetune flexible_band_ft flexible transformer_flexible_small "${GATE_LOSS[@]}" \
  --flexible-train-threshold
# (--finetune-from-model builds the model from these options: repeat the gate size)
finetune flexible_gate32_band_ft flexible_gate32 transformer_flexible_small --flexible-gate-dim 32 \
  "${GATE_LOSS[@]}" --flexible-train-threshold
finetune soft_ft soft transformer_soft_small

# --- test2016 BLEU ------------------------------------------------------------
evaluate() { bash "$M30K/evaluate.sh" "$DATA_DIR" "$WORK_DIR" "$@" > /dev/null; }
for name in $(printf '%s\n' "${RUNS[@]}" | cut -f1) soft_ft flexible_ft flexible_band_ft \
    flexible_gate32_band_ft; do
  [ -f "$WORK_DIR/runs/$name/checkpoint_avg.pt" ] && evaluate "$name" "$name"
done
[ -f "$WORK_DIR/runs/soft/checkpoint_avg.pt" ] && evaluate soft soft_decoded_hard --model-overrides "$HARD_KINDS"
[ -f "$WORK_DIR/runs/hard/checkpoint_avg.pt" ] && evaluate hard hard_decoded_soft --model-overrides "$SOFT_KINDS"
# fairseq's own cross+self decodes the cross_self checkpoint (identical training, see README)
[ -f "$WORK_DIR/runs/cross_self/checkpoint_avg.pt" ] && \
  evaluate cross_self fairseq_cross_self --model-overrides "{'_name': 'transformer'}"
for run in flexible flexible_ft flexible_band_ft flexible_gate32 flexible_gate32_band_ft; do
  if [ -f "$WORK_DIR/runs/$run/checkpoint_avg.pt" ]; then
    evaluate "$run" "${run}_inf" --model-overrides "{'flexible_threshold': 'inf', 'print_cps': True}"
    evaluate "$run" "${run}_auto" --model-overrides "{'print_cps': True}"
    [[ "$run" == *_ft ]] && evaluate "$run" "${run}_tau075" \
      --model-overrides "{'flexible_threshold': 0.75, 'print_cps': True}"
  fi
done
[ -f "$WORK_DIR/runs/local/checkpoint_avg.pt" ] && \
  evaluate local local_cps --model-overrides "{'print_cps': True}"

write_tables() {
  python "$REPO/scripts/results_table.py" "$WORK_DIR" "$RESULTS" ${REFERENCE:+--reference "$REFERENCE"}
}
[ "${SKIP_BENCH:-0}" = 1 ] && { write_tables; exit 0; }

# --- benchmarks (nothing else may run now) --------------------------------------
export OMP_NUM_THREADS=1
bench() {  # output-name args...
  local out=$1; shift
  [ -s "$RESULTS/$out.json" ] && return 0
  log "benchmark: $out"
  python "$REPO/scripts/benchmark_decoding.py" --json "$RESULTS/$out.json.tmp" \
    --markdown "$RESULTS/$out.md" "$@" >&2 && mv "$RESULTS/$out.json.tmp" "$RESULTS/$out.json"
}
checkpoints() {  # run names -> "--model NAME=CHECKPOINT" for each one trained
  local name
  for name in "$@"; do
    if [ -f "$WORK_DIR/runs/$name/checkpoint_avg.pt" ]; then
      printf '%s\n' --model "$name=$WORK_DIR/runs/$name/checkpoint_avg.pt"
    fi
  done
}
mapfile -t MODELS < <(checkpoints $(printf '%s\n' "${RUNS[@]}" | cut -f1) flexible_ft flexible_band_ft \
  flexible_gate32_band_ft)
[ -f "$WORK_DIR/runs/cross_self/checkpoint_avg.pt" ] && MODELS+=(--model "fairseq_cross_self=$WORK_DIR/runs/cross_self/checkpoint_avg.pt" --override "fairseq_cross_self={'_name': 'transformer'}")
# small preset, the trained checkpoints, the test set, beam 4, 20 output tokens for
# every model: the cost of the mechanisms, not of how long each model's (short
# budget: often degenerate) translations are
bench speed_small --data "$WORK_DIR/data-bin" "${MODELS[@]}" --baseline soft --beam 4 \
  --batch-size 64 --max-sentences 384 --fixed-output-len 20 --reps 5 --threads 1 \
  --train-batches 6 --sublayer-times
# the flexible family at the small preset, with the band-trained models also at
# tau = 0.75 (their 55%-fewer-scores points): where short sources leave little to skip
mapfile -t FLEXIBLE < <(checkpoints soft soft_ft local flexible flexible_ft flexible_band_ft \
  flexible_gate32 flexible_gate32_band_ft)
for run in flexible_band_ft flexible_gate32_band_ft; do
  [ -f "$WORK_DIR/runs/$run/checkpoint_avg.pt" ] && FLEXIBLE+=(
    --model "${run}_tau075=$WORK_DIR/runs/$run/checkpoint_avg.pt"
    --override "${run}_tau075={'flexible_threshold': 0.75}")
done
bench speed_small_flexible --data "$WORK_DIR/data-bin" "${FLEXIBLE[@]}" --baseline soft --beam 4 \
  --batch-size 64 --max-sentences 384 --fixed-output-len 20 --reps 5 --threads 1 --sublayer-times
# the same trained checkpoints on 100-token sources (random tokens): trained
# gates and centres, where skipping source positions can pay
mapfile -t SKIPPING < <(checkpoints soft local flexible flexible_ft flexible_band_ft \
  flexible_gate32_band_ft hard)
bench speed_small_long_sources --data "$WORK_DIR/data-bin" "${SKIPPING[@]}" --baseline soft \
  --src-len 100 --num-sentences 128 --batch-size 64 --fixed-output-len 20 --beam 4 --reps 5 \
  --threads 1 --sublayer-times
# Transformer Base dims, random weights, the test sources, 20 generated tokens each
bench speed_base --data "$WORK_DIR/data-bin" --arch soft=hard_retrieval_transformer \
  --arch hard=transformer_hard_dec --arch cross_self=transformer_cross_self \
  --arch fairseq_cross_self=transformer \
  --override "fairseq_cross_self={'cross_self_attention': True, 'no_cross_attention': True}" \
  --arch hard_cross_self=transformer_hard_cross_self --arch aan=transformer_aan \
  --arch aan_no_ffn=transformer_aan --override "aan_no_ffn={'aan_ffn_dim': 0}" \
  --arch local=transformer_local --arch flexible=transformer_flexible \
  --override "flexible={'flexible_mean_source_length': 14.4}" \
  --baseline soft --beam 4 --batch-size 64 --max-sentences 128 --fixed-output-len 20 \
  --reps 3 --threads 1 --sublayer-times
# Base dims with long sources (100 tokens), where skipping source positions matters
bench speed_base_long_sources --arch soft=hard_retrieval_transformer \
  --arch local=transformer_local --arch flexible=transformer_flexible \
  --override "flexible={'flexible_mean_source_length': 100.0}" \
  --arch flexible_gate128=transformer_flexible \
  --override "flexible_gate128={'flexible_mean_source_length': 100.0, 'flexible_gate_dim': 128}" \
  --arch hard=transformer_hard_dec \
  --vocab 10000 --src-len 100 --num-sentences 64 --batch-size 32 --fixed-output-len 20 \
  --baseline soft --beam 4 --reps 5 --threads 1 --sublayer-times
# Base dims, 200-token sources and 40 output tokens: the per-step cost of
# cross-attention grows with the source for soft attention, not for the bands
bench speed_base_200_token_sources --arch soft=hard_retrieval_transformer \
  --arch local=transformer_local --arch flexible=transformer_flexible \
  --override "flexible={'flexible_mean_source_length': 200.0}" --arch hard=transformer_hard_dec \
  --vocab 10000 --src-len 200 --num-sentences 32 --batch-size 32 --fixed-output-len 40 \
  --baseline soft --beam 4 --reps 3 --threads 1 --sublayer-times
# the same sources translated to 160 tokens: outputs as long as translations of
# such sources are, so the per-step cost outweighs caching the encoder states
bench speed_base_200_token_sources_160_outputs --arch soft=hard_retrieval_transformer \
  --arch local=transformer_local --arch flexible=transformer_flexible \
  --override "flexible={'flexible_mean_source_length': 200.0}" \
  --vocab 10000 --src-len 200 --num-sentences 32 --batch-size 32 --fixed-output-len 160 \
  --baseline soft --beam 4 --reps 3 --threads 1 --sublayer-times
# Base dims, 400-token sources, 100 output tokens: soft attention's step keeps
# growing with the source, the bands' hardly does
bench speed_base_400_token_sources --arch soft=hard_retrieval_transformer \
  --arch local=transformer_local --arch flexible=transformer_flexible \
  --override "flexible={'flexible_mean_source_length': 400.0}" \
  --vocab 10000 --src-len 400 --num-sentences 16 --batch-size 16 --fixed-output-len 100 \
  --baseline soft --beam 4 --reps 3 --threads 1 --sublayer-times
# Base dims, 60 output tokens: self-attention's cost grows with the target
# prefix, the average attention network's does not
bench speed_base_long_outputs --data "$WORK_DIR/data-bin" --arch soft=hard_retrieval_transformer \
  --arch aan=transformer_aan --arch aan_no_ffn=transformer_aan \
  --override "aan_no_ffn={'aan_ffn_dim': 0}" --arch cross_self=transformer_cross_self \
  --arch hard=transformer_hard_dec --baseline soft --beam 4 --batch-size 64 --max-sentences 64 \
  --fixed-output-len 60 --reps 3 --threads 1 --sublayer-times
# one decoding step of cross-attention alone, per mechanism (Base dims)
[ -s "$RESULTS/attention_step_costs.json" ] || python "$REPO/scripts/attention_step_costs.py" \
  --src-len 50 100 200 400 --reps 15 --threads 1 --json "$RESULTS/attention_step_costs.json" \
  --markdown "$RESULTS/attention_step_costs.md" >&2
# the same at the small preset's dims (d = 128, 4 heads): Multi30k's ~15-token
# sources, and longer ones
[ -s "$RESULTS/attention_step_costs_small.json" ] || python "$REPO/scripts/attention_step_costs.py" \
  --embed-dim 128 --heads 4 --src-len 15 30 100 --reps 15 --threads 1 \
  --json "$RESULTS/attention_step_costs_small.json" \
  --markdown "$RESULTS/attention_step_costs_small.md" >&2
[ -s "$RESULTS/op_costs_cpu.json" ] || python "$REPO/scripts/op_costs.py" --threads 1 \
  --json "$RESULTS/op_costs_cpu.json" --markdown "$RESULTS/op_costs_cpu.md" >&2
[ -s "$RESULTS/memory.json" ] || python "$REPO/scripts/memory_profile.py" \
  --arch transformer_soft_small --arch transformer_hard_dec_small --arch transformer_cross_self_small \
  --arch transformer_hard_cross_self_small --arch transformer_aan_small \
  --arch transformer_local_small --arch transformer_flexible_small \
  --json "$RESULTS/memory.json" --markdown "$RESULTS/memory.md" >&2
[ -s "$RESULTS/speed_vs_length.json" ] || python "$REPO/scripts/plot_speed_vs_length.py" \
  --arch soft=hard_retrieval_transformer --arch hard=transformer_hard_dec \
  --arch cross_self=transformer_cross_self --arch aan=transformer_aan \
  --arch flexible=transformer_flexible --arch local=transformer_local \
  --lengths 10 30 100 --num-sentences 16 --batch-size 16 --reps 1 \
  --out "$RESULTS/speed_vs_length.png" --json "$RESULTS/speed_vs_length.json" >&2
CURVES=()
[ -f "$WORK_DIR/runs/flexible_ft/checkpoint_avg.pt" ] && \
  CURVES+=(--checkpoint "fine-tuned (gate loss)=$WORK_DIR/runs/flexible_ft/checkpoint_avg.pt")
[ -f "$WORK_DIR/runs/flexible_band_ft/checkpoint_avg.pt" ] && \
  CURVES+=(--checkpoint "fine-tuned within the bands of τ (auto)=$WORK_DIR/runs/flexible_band_ft/checkpoint_avg.pt")
if [ "${#CURVES[@]}" -gt 0 ] && [ ! -s "$RESULTS/bleu_vs_cps.json" ]; then
  python "$REPO/scripts/bleu_vs_cps.py" --data "$WORK_DIR/data-bin" "${CURVES[@]}" \
    --tok-ref "$DATA_DIR/tok/test_2016_flickr.de" --thresholds 0.1 0.25 0.5 0.75 1 auto 2 4 inf \
    --out "$RESULTS/bleu_vs_cps.png" --json "$RESULTS/bleu_vs_cps.json" >&2
fi
# the d/4 gate network, band-fine-tuned, between tau = 0.75 and the paper's rule
if [ -f "$WORK_DIR/runs/flexible_gate32_band_ft/checkpoint_avg.pt" ] && \
    [ ! -s "$RESULTS/bleu_vs_cps_gate32.json" ]; then
  python "$REPO/scripts/bleu_vs_cps.py" --data "$WORK_DIR/data-bin" --threads 2 \
    --checkpoint "gate32=$WORK_DIR/runs/flexible_gate32_band_ft/checkpoint_avg.pt" \
    --tok-ref "$DATA_DIR/tok/test_2016_flickr.de" --thresholds 0.75 0.9 1 1.25 \
    --out "$RESULTS/bleu_vs_cps_gate32.png" --json "$RESULTS/bleu_vs_cps_gate32.json" >&2
fi
for run in soft hard flexible_ft; do
  [ -f "$WORK_DIR/runs/$run/checkpoint_avg.pt" ] && [ ! -s "$RESULTS/attention_$run.png" ] && \
    python "$REPO/scripts/plot_attention.py" --data "$WORK_DIR/data-bin" \
      --checkpoint "$WORK_DIR/runs/$run/checkpoint_avg.pt" --index 7 \
      --out "$RESULTS/attention_$run.png" \
      $( [ "$run" = flexible_ft ] && echo --gate-out "$RESULTS/flexible_gate.png" ) >&2
done
write_tables
