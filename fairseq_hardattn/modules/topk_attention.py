"""Top-k retrieval attention: each head keeps its k largest scores and
attends softly over those k keys (Zhao et al. 2019, "Explicit Sparse
Transformer"). k = 1 is hard retrieval with an argmax; k = the number of
keys is soft attention.

Scores are ranked unscaled (the scale is positive, so the order is q·k's;
with k = 1 the key is hard retrieval's argmax, bit for bit), then the k kept
scores are scaled by 1/√d and normalised by a softmax, dropped out in
training, and weigh a gather of k value rows (``gather.retrieve``): the P·V
product over every key becomes a weighted sum of k rows. Gradients are exact
through the kept scores and the gathered values, in training as at
inference. Masked keys are never kept; a row with fewer than k visible keys
attends to those it has, and a row with none attends to nothing (zero
output before the output projection).

Returned weights (a forward over whole sequences: training, validation, the
teacher-forced pass that computes alignments) are the softmax over the kept
keys, zero elsewhere; incremental decoding steps build none, as hard
retrieval's.
"""

import torch
import torch.nn.functional as F

from .cached_projection import CachedProjectionAttention
from .gather import retrieve


class TopKAttention(CachedProjectionAttention):
    """Drop-in replacement for fairseq's ``MultiheadAttention`` that attends
    to each query's ``k`` highest-scoring keys."""

    kernel_mode = "topk"
    native_step = True

    def __init__(self, *args, k: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"top-k attention: k must be an integer >= 1, got {k!r}")
        self.k = k

    @property
    def kernel_keys(self) -> int:
        return self.k

    def attend(self, query, p, incremental_state, attn_mask, need_weights, need_head_weights):
        scores = self.scores(p, attn_mask, scaled=False)  # ranked unscaled: see the module
        rows, tgt_len, src_len = scores.shape
        k = min(self.k, src_len)  # a shape, not a value: no host sync
        top, keys = scores.topk(k, dim=-1, sorted=True)
        # a row whose best key is masked has no key at all: its softmax (and
        # that softmax's gradient) would be NaN, so it is taken over zeros
        empty = top[..., :1].isneginf()
        logits = top.float().masked_fill(empty, 0.0) * self.scaling
        probs = F.softmax(logits, dim=-1).masked_fill(empty, 0.0)
        dropped = self.dropout_module(probs).type_as(p.v)
        # k value rows per query row, time-major (T, k, rows, D) as retrieve lays them out
        values = retrieve(p.v, self.value_rows(p.bsz, p.kv_bsz, p.v.device),
                          keys.reshape(rows, tgt_len * k)).transpose(0, 1)
        out = torch.einsum("rtk,tkrd->trd", dropped, values.view(tgt_len, k, rows, -1))
        weights = None
        if need_weights and incremental_state is None:
            dense = torch.zeros_like(scores, dtype=torch.float32).scatter_(-1, keys, probs)
            weights = self.format_weights(dense, p.bsz, need_head_weights)
        return self.merge_heads(out.transpose(0, 1), tgt_len, p.bsz), weights
