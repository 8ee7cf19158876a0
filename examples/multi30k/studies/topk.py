"""Top-k retrieval attention: each decoder head attends softly to
its k best keys, k = 1 being hard retrieval. Trained with the parity
recipe's settings beside soft_pre and hard_pre_argmax (seeds 1 and 2), and
those two decoded with k in TOPK_DECODE_KS."""

from .manifest import Benchmark, Decode, Run, reseeded

TOPK_DECODE_KS = (1, 2, 4, 8)
TOPK_TRAIN_KS = (2, 4)


def decoded_with_topk(run: str, k: int) -> Decode:
    """``run`` decoded with top-k retrieval (``k`` keys per head) in decoder self- and cross-attention."""
    return Decode(f"{run}_decoded_top{k}", run,
                  {"dec_self_attn_kind": "topk", "dec_cross_attn_kind": "topk", "retrieval_k": k},
                  f"the `{run}` checkpoint decoded with top-{k} retrieval in decoder attention")


def topk_run(k: int) -> Run:
    """The parity recipe's settings (pre-norm) with top-k retrieval in decoder self- and cross-attention."""
    return Run(f"topk{k}_pre", "transformer_topk_dec_small", f"--retrieval-k {k}",
               f"top-{k} retrieval attention in decoder self- and cross-attention, pre-norm layers "
               "(soft_pre's and hard_pre_argmax's recipe)")


# trained as soft_pre / hard_pre_argmax and their seed-2 runs, beside them
def seeds(k: int) -> tuple:
    """topk_run(k) with seeds 1 and 2, as soft_pre and soft_pre_s2."""
    return topk_run(k), reseeded(topk_run(k), 2)


RUNS = tuple(run for k in TOPK_TRAIN_KS for run in seeds(k))
# each trained k's seed-1 run (the end-to-end speed and int8 decodes take these)
SEED1_RUNS = tuple(topk_run(k).name for k in TOPK_TRAIN_KS)
# the preset transformer_topk_dec_small's k (the plugin's PRESET_K: a test pins them equal),
# the trained k best on valid, and the run behind it
PRESET_K = 4
PRESET_RUN = topk_run(PRESET_K).name
# each k's seeds beside the soft runs trained alike (soft_pre: seed 1, soft_pre_s2: seed 2)
SOFT_ALIKE = ("soft_pre", "soft_pre_s2")
PAIRS = {k: tuple(zip((run.name for run in seeds(k)), SOFT_ALIKE)) for k in TOPK_TRAIN_KS}

# decoding-time k on models trained soft and hard (Table 4, one step further)
DECODES = tuple(decoded_with_topk(run, k) for run in ("soft_pre", "hard_pre_argmax") for k in TOPK_DECODE_KS)


# k = 1, 2, 4, 8 against soft attention and hard retrieval on the plugin's search
# (CPU, random weights, one thread): sources of SRC tokens decoded to SRC tokens
TOPK_SPEED_KS = (1, 2, 4, 8)


def topk_speed(name: str, dims: str, src_len: int, sentences: int, batch: int) -> Benchmark:
    ks = " ".join(f"--arch top{k}=transformer_topk_dec --override top{k}={{'retrieval_k':{k}}}"
                  for k in TOPK_SPEED_KS)
    return Benchmark(name, f"top-k retrieval, k in {TOPK_SPEED_KS}, against soft and hard, {dims} dims, "
                     f"{src_len} tokens", f"--arch soft=transformer_soft_prenorm --arch hard=transformer_hard_dec_prenorm "
                     f"{ks} --dims {dims} --vocab 10000 --src-len {src_len} --num-sentences {sentences} "
                     f"--batch-size {batch} --fixed-output-len {src_len} --beam 4 --reps 3 --threads 1 "
                     "--baseline soft")


BENCHMARKS = (topk_speed("speed_topk_small", "small", 30, 256, 64),
              topk_speed("speed_topk_small_100tok", "small", 100, 128, 64),
              topk_speed("speed_topk_base_100tok", "preset", 100, 32, 32))
