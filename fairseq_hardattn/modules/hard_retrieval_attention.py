"""Hard retrieval attention (Xu et al. 2021, "Learning Hard Retrieval Decoder
Attention for Transformers"): every head attends to exactly one key.

Training: softmax probabilities P (float32, after masking and attention
dropout); one key index per (batch, head, query) sampled from P; the output is
V[index], and the backward pass is straight-through: dL/dP = dL/dO · Vᵀ as if
O = P·V, dL/dV by index-add. Inference (``model.eval()``, so validation too):
argmax over the raw masked scores q·k (no scaling, no softmax), then a gather
of one value row per head (``gather.retrieve``).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..kernels import gpu_ops
from .cached_projection import CachedProjectionAttention
from .gather import retrieve, table_positions, value_table

# All-dropped rows fall back to sampling from the undropped P: adding
# EPS * P keeps every other row's distribution unchanged to ~1e-12.
_ALL_DROPPED_FALLBACK_EPS = 1e-12


class StraightThroughRetrieval(torch.autograd.Function):
    """O = V[indices] forward; backward as if O = P·V (straight-through).

    probs (N, T, S) enters only to receive its gradient; values (N, S, D);
    indices (N, T). Returns (N, T, D). Nothing of size (N, T, S) is saved for
    backward, and no one-hot matrix is built.
    """

    @staticmethod
    def forward(ctx, probs: Tensor, values: Tensor, indices: Tensor) -> Tensor:
        ctx.save_for_backward(values, indices)
        ctx.probs_dtype = probs.dtype
        rows = torch.arange(values.size(0), device=values.device)
        return retrieve(values, rows, indices)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        values, indices = ctx.saved_tensors
        grad_out = grad_out.to(values.dtype)
        grad_probs = grad_values = None
        if ctx.needs_input_grad[0]:
            # dense, exactly the gradient P·V would give
            grad_probs = torch.bmm(grad_out, values.transpose(1, 2)).to(ctx.probs_dtype)
        if ctx.needs_input_grad[1]:
            n, src_len, dim = values.shape
            rows = torch.arange(n, device=values.device)
            table, time_major = value_table(values)
            positions = table_positions(values, time_major, rows, indices)
            grad_table = torch.zeros_like(table)
            grad_table.index_add_(0, positions.reshape(-1),
                                  grad_out.transpose(0, 1).reshape(-1, dim))
            grad_values = (grad_table.view(src_len, n, dim).transpose(0, 1)
                           if time_major else grad_table.view(n, src_len, dim))
        return grad_probs, grad_values, None


def sample_key_indices(weights: Tensor) -> Tensor:
    """One index per row of ``weights`` (..., S), drawn with probability
    proportional to the (unnormalised, non-negative) weights.

    Inverse-CDF sampling: one uniform number per row and a binary search.
    Zero-weight positions (masked keys) are never drawn: u is in (0, 1], so the
    target u·total is positive and at most the last cumulative sum.
    """
    cdf = weights.detach().cumsum(dim=-1)
    total = cdf[..., -1:]
    u = 1.0 - torch.rand(total.shape, dtype=cdf.dtype, device=cdf.device)
    indices = torch.searchsorted(cdf, u * total).squeeze(-1)
    return indices.clamp_(max=weights.size(-1) - 1)


def queries_without_keys(
    attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor]
) -> Optional[Tensor]:
    """Bool (bsz or 1, tgt_len or 1): queries whose every key is masked (None
    without masks). Computed from the masks, which are heads times smaller
    than the scores; never asked whether any row is empty, which would wait
    for the device (a host sync on every step)."""
    if attn_mask is None and key_padding_mask is None:
        return None
    if attn_mask is not None:
        visible = ~attn_mask if attn_mask.dtype == torch.bool else ~torch.isneginf(attn_mask)
    if key_padding_mask is None:
        has_key = visible.any(-1).unsqueeze(0)
    elif attn_mask is None:
        has_key = (~key_padding_mask).any(-1, keepdim=True)
    else:
        has_key = ((~key_padding_mask).float() @ visible.t().float()) > 0
    return ~has_key


# how training picks the retrieved key: drawn from P (the paper), or P's
# argmax as at inference (straight-through argmax)
TRAIN_RETRIEVALS = ("sample", "argmax")


class HardRetrievalAttention(CachedProjectionAttention):
    """Drop-in replacement for fairseq's ``MultiheadAttention``.

    Training options: ``train_retrieval`` (``TRAIN_RETRIEVALS``) and
    ``anneal_updates`` N: over the first N updates each query row (per head)
    is retrieved hard with probability num_updates / N and attends softly
    (P·V) otherwise, a curriculum from soft to hard attention; 0: hard from
    the start. Both leave inference unchanged. (Three more curricula, cooling
    sampling into the argmax, sharpening the softmax and an entropy penalty,
    made hard retrieval worse in every measured use and were removed:
    HARD_PARITY.md names the commit that ran them.)

    A query with no unmasked key (all-masked row) attends to nothing: its
    output is zero before the output projection, in training and inference.

    Returned weights: in training, the sampling distribution P (free, already
    computed); in a forward over whole sequences in inference (validation, the
    teacher-forced pass that computes alignments), a one-hot matrix of the
    retrieved keys; in incremental decoding none: fairseq's decoder asks its
    last layer for weights on every step, and a dense one-hot per step would
    cost what hard attention saves (alignments come from the teacher-forced
    pass instead: ``full_context_alignment`` of the models).
    """

    kernel_mode = "hard"
    native_step = True

    def __init__(self, *args, train_retrieval: str = "sample", anneal_updates: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        if train_retrieval not in TRAIN_RETRIEVALS:
            raise ValueError(f"hard retrieval attention: train_retrieval must be one of "
                             f"{TRAIN_RETRIEVALS}, got {train_retrieval!r}")
        if anneal_updates < 0:
            raise ValueError(f"hard retrieval attention: anneal_updates must be >= 0, "
                             f"got {anneal_updates}")
        self.train_retrieval = train_retrieval
        self.anneal_updates = anneal_updates
        self.num_updates = 0

    def set_num_updates(self, num_updates: int):
        """fairseq's trainer calls this on every module before each update."""
        self.num_updates = num_updates

    def hard_share(self) -> float:
        """Probability that a training query row is retrieved hard."""
        if not self.anneal_updates:
            return 1.0
        return min(1.0, self.num_updates / self.anneal_updates)

    def attend(self, query, p, incremental_state, attn_mask, need_weights, need_head_weights):
        q, k, v, key_padding_mask, kv_bsz, tgt_len, bsz = p
        if (incremental_state is not None and not self.training and tgt_len == 1
                and attn_mask is None and gpu_ops.available(q)):
            # one fused kernel: scores, argmax and the one value row, per query row
            out = gpu_ops.hard_retrieval_step(q[:, 0], k, v, self.value_rows(bsz, kv_bsz, q.device),
                                              key_padding_mask, self.num_heads)
            return self.merge_heads(out.unsqueeze(1), tgt_len, bsz), None
        scores = self.scores(p, attn_mask, scaled=self.training)  # argmax needs no scale
        empty = queries_without_keys(attn_mask, key_padding_mask)
        if empty is not None and empty.size(0) > 1:
            # per sentence -> per query row (hypothesis and head) of the scores
            empty = empty[:, None, None, :].expand(
                -1, bsz // kv_bsz, self.num_heads, -1
            ).reshape(bsz * self.num_heads, -1)
        if empty is not None:
            empty = empty.unsqueeze(-1)  # broadcasts over keys / head dims

        weights = None
        if self.training:
            out, probs = self._sample_and_retrieve(scores, v, empty)
            if need_weights:
                weights = self.format_weights(probs, bsz, need_head_weights)
        else:
            indices = scores.argmax(dim=-1)
            out = retrieve(v, self.value_rows(bsz, kv_bsz, v.device), indices)
            if empty is not None:
                out = out.masked_fill(empty, 0.0)
            if need_weights and incremental_state is None:
                one_hot = torch.zeros_like(scores, dtype=torch.float32)
                one_hot.scatter_(-1, indices.unsqueeze(-1), 1.0)
                if empty is not None:
                    one_hot.masked_fill_(empty, 0.0)
                weights = self.format_weights(one_hot, bsz, need_head_weights)
        return self.merge_heads(out, tgt_len, bsz), weights

    def _sample_and_retrieve(
        self, scores: Tensor, v: Tensor, empty: Optional[Tensor]
    ) -> Tuple[Tensor, Tensor]:
        """Returns the retrieved values and the (detached) sampling distribution."""
        if scores.size(0) != v.size(0):
            raise RuntimeError(
                "hard retrieval attention: sentence-grouped (beamable) keys are "
                "an inference-only layout; call model.eval() before generation"
            )
        scores = scores.float()
        if empty is not None:
            # softmax of an all -inf row is NaN, and so is its gradient
            scores = scores.masked_fill(empty, 0.0)
        probs = F.softmax(scores, dim=-1)
        dropped = self.dropout_module(probs)
        if self.train_retrieval == "argmax":
            indices = scores.argmax(dim=-1)
        else:
            sampling_weights = dropped.detach()
            if dropped is not probs:
                sampling_weights = sampling_weights + _ALL_DROPPED_FALLBACK_EPS * probs.detach()
            indices = sample_key_indices(sampling_weights)
        out = StraightThroughRetrieval.apply(dropped, v, indices)
        share = self.hard_share()
        if share < 1.0:
            # the curriculum: the other rows attend softly, with exact gradients
            soft = torch.bmm(dropped.type_as(v), v)
            hard_rows = torch.rand(out.shape[:-1] + (1,), device=out.device) < share
            out = torch.where(hard_rows, out, soft)
        probs = probs.detach()
        if empty is not None:  # queries without keys attend to nothing
            out = out.masked_fill(empty, 0.0)
            probs = probs.masked_fill(empty, 0.0)
        return out, probs
