"""Hard retrieval attention (Xu et al. 2021, "Learning Hard Retrieval Decoder
Attention for Transformers"): every head attends to exactly one key.

Training: softmax probabilities P (float32, after masking and attention
dropout); one key index per (batch, head, query) sampled from P; the output is
V[index], and the backward pass is straight-through: dL/dP = dL/dO · Vᵀ as if
O = P·V, dL/dV by index-add. Inference (``model.eval()``, so validation too):
argmax over the raw masked scores q·k (no scaling, no softmax), then a gather.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .cached_projection import CachedProjectionAttention, IncrementalState

# All-dropped rows fall back to sampling from the undropped P: adding
# EPS * P keeps every other row's distribution unchanged to ~1e-12.
_ALL_DROPPED_FALLBACK_EPS = 1e-12


def gather_rows(values: Tensor, indices: Tensor) -> Tensor:
    """values (N, S, D), indices (N, T) -> (N, T, D) with out[n, t] = values[n, indices[n, t]]."""
    expanded = indices.unsqueeze(-1).expand(-1, -1, values.size(-1))
    return torch.gather(values, 1, expanded)


class StraightThroughRetrieval(torch.autograd.Function):
    """O = V[indices] forward; backward as if O = P·V (straight-through).

    probs (N, T, S) enters only to receive its gradient; values (N, S, D);
    indices (N, T). Nothing of size (N, T, S) is saved for backward.
    """

    @staticmethod
    def forward(ctx, probs: Tensor, values: Tensor, indices: Tensor) -> Tensor:
        ctx.save_for_backward(values, indices)
        ctx.probs_dtype = probs.dtype
        return gather_rows(values, indices)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        values, indices = ctx.saved_tensors
        grad_probs = grad_values = None
        if ctx.needs_input_grad[0]:
            # dense, exactly the gradient P·V would give
            grad_probs = torch.bmm(
                grad_out.to(values.dtype), values.transpose(1, 2)
            ).to(ctx.probs_dtype)
        if ctx.needs_input_grad[1]:
            n, src_len, dim = values.shape
            row_offsets = torch.arange(n, device=indices.device).unsqueeze(1) * src_len
            flat_indices = (indices + row_offsets).reshape(-1)
            grad_values = values.new_zeros(n * src_len, dim)
            grad_values.index_add_(
                0, flat_indices, grad_out.reshape(-1, dim).to(values.dtype)
            )
            grad_values = grad_values.view(n, src_len, dim)
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


class HardRetrievalAttention(CachedProjectionAttention):
    """Drop-in replacement for fairseq's ``MultiheadAttention``.

    Returned weights: in training, the sampling distribution P (free, already
    computed); in inference, a one-hot matrix of the retrieved keys, built only
    when asked for by ``make_generation_fast_(need_attn=True)`` (fairseq does
    that for ``--print-alignment``) or by setting ``build_alignment = True``:
    fairseq's decoder requests weights from its last layer on every step, and a
    dense one-hot would cost what hard attention saves.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.build_alignment = False

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.build_alignment = need_attn

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: IncrementalState = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, _ = query.size()
        q, k, v, key_padding_mask, kv_bsz = self.project(
            query, key, value, key_padding_mask, incremental_state, static_kv
        )
        may_have_empty_rows = attn_mask is not None or key_padding_mask is not None
        if self.training or before_softmax:
            q = q * self.scaling
        scores = self.mask_scores(
            self.attention_scores(q, k, kv_bsz), attn_mask, key_padding_mask, kv_bsz
        )
        if before_softmax:
            return scores, v

        weights = None
        if self.training:
            out, probs = self._sample_and_retrieve(scores, v, may_have_empty_rows)
            if need_weights:
                weights = self.format_weights(probs, bsz, need_head_weights)
        else:
            best, indices = scores.max(dim=-1)
            out = self._retrieve(v, indices, kv_bsz)
            if may_have_empty_rows:
                # a query with no unmasked key attends to nothing
                empty = best.eq(float("-inf")).unsqueeze(-1)
                out = out.masked_fill(empty, 0.0)
            if need_weights and self.build_alignment:
                weights = self.format_weights(
                    self._one_hot(indices, scores), bsz, need_head_weights
                )
        return self.merge_heads(out, tgt_len, bsz), weights

    def _sample_and_retrieve(
        self, scores: Tensor, v: Tensor, may_have_empty_rows: bool
    ) -> Tuple[Tensor, Tensor]:
        """Returns the retrieved values and the (detached) sampling distribution."""
        if scores.size(0) != v.size(0):
            raise RuntimeError(
                "hard retrieval attention: sentence-grouped (beamable) keys are "
                "an inference-only layout; call model.eval() before generation"
            )
        scores = scores.float()
        empty = None
        if may_have_empty_rows:
            # all-masked rows would make softmax NaN (and its gradient NaN):
            # give them finite scores and zero their output instead
            empty = scores.detach().amax(dim=-1, keepdim=True).eq(float("-inf"))
            scores = scores.masked_fill(empty, 0.0)
        probs = F.softmax(scores, dim=-1)
        dropped = self.dropout_module(probs)
        sampling_weights = dropped.detach()
        if dropped is not probs:
            sampling_weights = sampling_weights + _ALL_DROPPED_FALLBACK_EPS * probs.detach()
        indices = sample_key_indices(sampling_weights)
        out = StraightThroughRetrieval.apply(dropped, v, indices)
        probs = probs.detach()
        if empty is not None:
            out = out.masked_fill(empty, 0.0)
            probs = probs.masked_fill(empty, 0.0)
        return out, probs

    def _retrieve(self, v: Tensor, indices: Tensor, kv_bsz: int) -> Tensor:
        """Gather V rows; with beamable keys, hypotheses share their sentence's V."""
        if indices.size(0) == v.size(0):
            return gather_rows(v, indices)
        heads = self.num_heads
        src_len, head_dim = v.shape[-2:]
        v_by_sentence = v.view(kv_bsz, 1, heads, src_len, head_dim)
        indices = indices.view(kv_bsz, -1, heads, indices.size(-1), 1)
        out = torch.gather(
            v_by_sentence.expand(-1, indices.size(1), -1, -1, -1),
            3,
            indices.expand(-1, -1, -1, -1, head_dim),
        )
        return out.view(-1, indices.size(3), head_dim)

    @staticmethod
    def _one_hot(indices: Tensor, scores: Tensor) -> Tensor:
        one_hot = torch.zeros_like(scores, dtype=torch.float32)
        one_hot.scatter_(-1, indices.unsqueeze(-1), 1.0)
        return one_hot.masked_fill_(scores.eq(float("-inf")), 0.0)
