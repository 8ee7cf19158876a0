# Settings shared by the Multi30k en-de scripts: every architecture is
# trained and decoded with exactly these, so only the architecture differs.
# Override any of them from the environment (e.g. EPOCHS=10 for a quick run).

: "${BPE_MERGES:=10000}"   # joint BPE, as the published anchor
: "${EPOCHS:=25}"
: "${WARMUP:=800}"       # warmup updates of the inverse-sqrt schedule
: "${LR_SCHEDULER:=inverse_sqrt}"  # e.g. fixed for fine-tuning
: "${SEED:=1}"
: "${MAX_TOKENS:=4096}"
: "${AVERAGE_LAST:=5}"     # average the last N epoch checkpoints
: "${KEEP_EPOCHS:=$AVERAGE_LAST}"  # epoch checkpoints kept (-1: all, for budget_view.sh)
: "${BEAM:=4}"             # the hard-attention paper's beam
: "${THREADS:=2}"
: "${PYTHON:=python3}"       # the interpreter of the tools (python3: every venv and GPU image has it)
: "${DEVICE:=cpu}"          # cuda: train and decode on the GPU (FP16=1: half precision)
export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
case "$DEVICE" in
  cpu) DEVICE_FLAGS=(--cpu) ;;
  cuda) DEVICE_FLAGS=(); [ "${FP16:-0}" = 1 ] && DEVICE_FLAGS=(--fp16) ;;
  *) echo "DEVICE must be cpu or cuda, not $DEVICE" >&2; exit 2 ;;
esac

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
USER_DIR="$REPO_DIR/fairseq_hardattn"

# the published small Transformer setting for Multi30k (README of the data:
# shared embeddings, dropout 0.3, lr 0.005, warmup 2000, 8000 updates of 8k
# tokens), resized for a 2-core CPU budget of 25 epochs (~3350 updates of 4k
# tokens): shorter warmup, slightly lower peak learning rate
if [ "$LR_SCHEDULER" = inverse_sqrt ]; then
  SCHEDULE=(--lr-scheduler inverse_sqrt --warmup-updates "$WARMUP" --warmup-init-lr 1e-07)
else  # fixed has no warmup-init-lr (and its warmup would span a short fine-tuning)
  SCHEDULE=(--lr-scheduler "$LR_SCHEDULER")
fi
TRAIN_FLAGS=(
  --user-dir "$USER_DIR" "${DEVICE_FLAGS[@]}" --seed "$SEED" --num-workers 0
  --share-all-embeddings --dropout 0.3 --weight-decay 0.0001
  --optimizer adam --adam-betas '(0.9,0.98)' --clip-norm 0.0
  --lr 0.004 "${SCHEDULE[@]}"
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1
  --max-tokens "$MAX_TOKENS" --max-epoch "$EPOCHS"
  --no-progress-bar --log-format simple --log-interval 50
)

# Table 4's train/decode switch for this plugin's checkpoints, which name their
# kinds (the `_name` override only switches plain fairseq `transformer`
# checkpoints, which name none)
SOFT_KINDS="{'dec_self_attn_kind': 'soft', 'dec_cross_attn_kind': 'soft'}"
HARD_KINDS="{'dec_self_attn_kind': 'hard', 'dec_cross_attn_kind': 'hard'}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
