#!/usr/bin/env bash
# The prepared GPU run, for a GPU machine with a short time budget:
# the GPU tests, then the speed cells that matter most, then bf16 on the
# machine's CPU where it has AMX, into $OUT (or results/gpu_check/), in
# under 10 minutes on one H100/H200.
#
# Usage: scripts/gpu_check.sh OUT_DIR
# Prepare on this machine (network): bash scripts/gpu_prepare.sh .gpu
# Run with the device tool: carry [".gpu"], command
#   source .gpu/device_env.sh && bash scripts/gpu_check.sh "$OUT"
# GPU_CHECK_DEVICE=cpu GPU_CHECK_QUICK=1 runs the same steps on a CPU, tiny, to check the script.
set -uo pipefail
OUT_DIR=${1:?usage: scripts/gpu_check.sh OUT_DIR (on the device: \$OUT)}
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
log() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$OUT_DIR/log.txt" >&2; }
nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1 || true

# Triton's interpreter test checks the kernels on a CPU: not part of the GPU verdict
log "1/3 GPU tests (equality of the captured engine, the search and the kernels)"
"$PYTHON" -m pytest -q -p no:cacheprovider tests/unit/test_beam_search.py tests/unit/test_decoding_engine.py \
  tests/unit/test_gpu_kernels.py -k "(gpu or cuda or triton) and not interpreter" -rs > "$OUT_DIR/tests.txt" 2>&1
log "tests: $(tail -n 1 "$OUT_DIR/tests.txt")"
# the verdict: on CUDA, every GPU test ran and passed. Recorded in results/gpu_check/,
# it lets CUDA_SEARCH_PASSED_AT (decoding/engines.py) name its commit, which makes
# the plugin's search the CUDA default
COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
"$PYTHON" - "$OUT_DIR/tests.txt" "$DEVICE" "$COMMIT" > "$OUT_DIR/verdict.json" <<'PY'
import json, re, sys
import torch
summary = open(sys.argv[1]).read().strip().splitlines()[-1]
count = lambda word: int((re.search(rf"(\d+) {word}", summary) or [0, 0])[1])
passed, failed, errors, skipped = count("passed"), count("failed"), count("error"), count("skipped")
on_gpu = sys.argv[2] == "cuda" and torch.cuda.is_available()
# every test ran: none of them skips on a GPU with Triton
print(json.dumps({"passed": on_gpu and passed > 0 and failed + errors + skipped == 0, "commit": sys.argv[3],
                  "device": sys.argv[2], "gpu": torch.cuda.get_device_name() if on_gpu else None,
                  "torch": torch.__version__, "tests_passed": passed, "tests_failed": failed + errors, "tests_skipped": skipped,
                  "summary": summary}, indent=1))
PY
log "verdict: $(tr -d '\n' < "$OUT_DIR/verdict.json")"

# the speed cells: Base dims, random weights, beam 4, every sentence decoded to its
# source length; fairseq's transformer with fairseq's generator is the peer; the
# plugin's rows name their engine (the plugin's search, fairseq's generator over
# fairseq's step or over the captured one), whatever auto is at this version
if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
  CELLS=("8 1 2 fp32"); SIZE=(--dims small --vocab 1000)
else
  CELLS=("30 64 5 fp32" "100 128 3 fp16" "30 128 5 fp16" "100 64 3 fp32"); SIZE=(--vocab 10000)
fi
for cell in "${CELLS[@]}"; do
  read -r len batch reps dtype <<< "$cell"
  name="speed_gpu_engine_${len}tok_batch${batch}_${dtype}"
  log "2/3 $name"
  "$PYTHON" scripts/benchmark_decoding.py --device "$DEVICE" --dtype "$dtype" "${SIZE[@]}" \
    --arch fairseq=transformer \
    --arch soft_search=transformer_soft --override "soft_search={'decoding_engine':'search'}" \
    --arch hard_search=transformer_hard_dec --override "hard_search={'decoding_engine':'search'}" \
    --arch topk2_search=transformer_topk_dec --override "topk2_search={'retrieval_k':2,'decoding_engine':'search'}" \
    --arch soft_fairseq=transformer_soft --override "soft_fairseq={'decoding_engine':'fairseq'}" \
    --arch soft_fairseq_graph=transformer_soft --override "soft_fairseq_graph={'decoding_engine':'graph'}" \
    --src-len "$len" --num-sentences $((2 * batch)) --batch-size "$batch" --fixed-output-len "$len" \
    --beam 4 --reps "$reps" --baseline fairseq \
    --json "$OUT_DIR/$name.json" --markdown "$OUT_DIR/$name.md" >> "$OUT_DIR/bench.log" 2>&1 \
    && log "$(grep -E '^\| (soft_search|hard_search|topk2_search|soft_fairseq) ' "$OUT_DIR/$name.md" | cut -d'|' -f2,6 | tr '\n' ' ')" \
    || log "$name failed (bench.log)"
done
# the cells' records in one file, by cell name (results/ keeps few files)
"$PYTHON" - "$OUT_DIR" <<'MERGE'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
cells = sorted(out.glob("speed_gpu_engine_*.json"))
if cells:
    (out / "speed.json").write_text(json.dumps({p.stem: json.loads(p.read_text()) for p in cells}, indent=1) + "\n")
    for p in cells:
        p.unlink()
        p.with_suffix(".md").unlink(missing_ok=True)
MERGE
# bf16 on this machine's CPU where it has AMX (bf16_decoding; a GPU machine's host CPU
# is often a Xeon with AMX): Transformer Base dims, one thread, against float32
lscpu > "$OUT_DIR/lscpu.txt" 2>&1 || true
if grep -qw amx_tile /proc/cpuinfo || [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
  name=speed_cpu_bf16_30tok_batch32
  log "3/3 $name"
  "$PYTHON" scripts/benchmark_decoding.py --device cpu --threads 1 "${SIZE[@]}" \
    --arch fp32=transformer_soft --arch bf16=transformer_soft --override "bf16={'bf16_decoding':True}" \
    --src-len 30 --num-sentences 64 --batch-size 32 --fixed-output-len 30 --beam 4 --reps 3 --baseline fp32 \
    --json "$OUT_DIR/$name.json" --markdown "$OUT_DIR/$name.md" >> "$OUT_DIR/bench.log" 2>&1 \
    && log "$(grep -E '^\| bf16 ' "$OUT_DIR/$name.md" | cut -d'|' -f2,6)" || log "$name failed (bench.log)"
else
  log "3/3 this CPU has no AMX: bf16 on a CPU not measured"
fi
log "done"
