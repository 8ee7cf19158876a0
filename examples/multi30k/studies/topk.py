"""Top-k retrieval attention (issue 61): each decoder head attends softly to
its k best keys, k = 1 being hard retrieval. Trained with the parity
recipe's settings beside soft_pre and hard_pre_argmax (seeds 1 and 2), and
those two decoded with k in TOPK_DECODE_KS."""

from .manifest import Decode, Run, reseeded

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
RUNS = tuple(run for k in TOPK_TRAIN_KS for run in (topk_run(k), reseeded(topk_run(k), 2)))

# decoding-time k on models trained soft and hard (Table 4, one step further)
DECODES = tuple(decoded_with_topk(run, k) for run in ("soft_pre", "hard_pre_argmax") for k in TOPK_DECODE_KS)
