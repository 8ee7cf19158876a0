#!/usr/bin/env bash
# The GPU result set: every benchmark of examples/multi30k/experiments.py's
# GPU_BENCHMARKS ({30, 100, 200}-token sources x batch {64, 128, 256} x
# {fp32, fp16}, beam 4, Transformer Base dims, fairseq's own transformer as
# the peer) into results/speed_gpu_*.{json,md}, and the op counts beside them.
# Resumable: a finished benchmark is skipped (delete its JSON to redo it).
#
# Usage: scripts/gpu_results.sh RESULTS_DIR [NAME...]   (results/ for the committed set)
#   NAME...: only these benchmarks, in this order (a short lease: the main
#   table's cell first); default: all of them, then the step costs
#   On a GPU machine without network (../shared/gpu/README.md):
#   source .gpu/device_env.sh && scripts/gpu_results.sh results
# Nothing else may run on the GPU meanwhile.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
RESULTS=${1:?usage: scripts/gpu_results.sh RESULTS_DIR [NAME...] (e.g. results)}
shift
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_results.sh: no CUDA GPU here (torch finds none): the GPU result set needs one" >&2
  exit 2
fi
mkdir -p "$RESULTS"
EXPERIMENTS=("$PYTHON" "$REPO/examples/multi30k/experiments.py")
NAMES=("$@")
[ "${#NAMES[@]}" -gt 0 ] || mapfile -t NAMES < <("${EXPERIMENTS[@]}" gpu-benchmarks)
for name in "${NAMES[@]}"; do
  [ -s "$RESULTS/$name.json" ] && continue
  echo "[gpu_results] $name" >&2
  args=$("${EXPERIMENTS[@]}" benchmark "$name" "$RESULTS")  # stops at a name it does not know
  mapfile -t ARGS <<< "$args"
  "$PYTHON" "$REPO/scripts/benchmark_decoding.py" --json "$RESULTS/$name.json.tmp" \
    --markdown "$RESULTS/$name.md" "${ARGS[@]}" >&2 && mv "$RESULTS/$name.json.tmp" "$RESULTS/$name.json"
done
[ "$#" -gt 0 ] && exit 0  # only the named benchmarks
[ -s "$RESULTS/op_costs_gpu.json" ] || "$PYTHON" "$REPO/research/op_costs.py" --device cuda \
  --json "$RESULTS/op_costs_gpu.json" --markdown "$RESULTS/op_costs_gpu.md" >&2
[ -s "$RESULTS/attention_step_costs_gpu.json" ] || "$PYTHON" "$REPO/research/attention_step_costs.py" \
  --device cuda --src-len 30 100 200 --json "$RESULTS/attention_step_costs_gpu.json" \
  --markdown "$RESULTS/attention_step_costs_gpu.md" >&2
