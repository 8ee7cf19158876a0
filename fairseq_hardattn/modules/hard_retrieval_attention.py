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


class EntropyPenalty(torch.autograd.Function):
    """Identity on P forward; backward adds ``weight`` times the gradient of
    the summed row entropies H(P) = -Σ P log P, as if ``weight · ΣH`` were
    added to the (summed) training loss. It pushes P toward one key, where
    V[argmax] (the forward) and P·V (what the straight-through gradient
    assumes) agree."""

    @staticmethod
    def forward(ctx, probs: Tensor, weight: float) -> Tensor:
        ctx.save_for_backward(probs)
        ctx.weight = weight
        return probs.view_as(probs)

    @staticmethod
    def backward(ctx, grad_probs: Tensor):
        (probs,) = ctx.saved_tensors
        # dH/dP = -(log P + 1); the clamp keeps masked keys (P = 0) finite,
        # and the softmax's backward gives them zero gradient anyway
        grad_entropy = -(probs.clamp_min(torch.finfo(probs.dtype).tiny).log() + 1.0)
        return grad_probs + ctx.weight * grad_entropy, None


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


def tempered(weights: Tensor, temperature: float) -> Tensor:
    """Non-negative ``weights`` (..., S) raised to 1/``temperature``, each row
    rescaled to a maximum of 1 (in log space: small temperatures would
    underflow every weight). Zero weights (masked keys) stay zero; every row
    needs a positive weight."""
    if temperature == 1.0:
        return weights
    log_weights = weights.log() / temperature
    return (log_weights - log_weights.amax(dim=-1, keepdim=True)).exp()


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
    the start. ``cooling_updates`` M (with ``train_retrieval="argmax"``): over
    the first M updates keys are sampled from P at a temperature falling
    linearly from 1 (the paper's sampling) to 0 (the argmax), a curriculum from
    sampling to the argmax that decoding takes; 0: the argmax from the start.
    ``sharpening_updates`` K: over the first K updates every training query
    row attends softly, with exact gradients, to P taken at a softmax
    temperature falling linearly from 1 to 0, whose limit is the argmax that
    hard retrieval takes; ``train_retrieval`` from then on. A curriculum from
    soft to hard in which the forward pass itself approaches retrieval (the
    anneal mixes soft and hard rows instead), so it replaces ``anneal_updates``
    and ``cooling_updates``; 0: none. ``entropy_penalty`` W: adds W times the
    entropy of every training query row's P to the loss (``EntropyPenalty``);
    0: none. All leave inference unchanged.

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

    def __init__(self, *args, train_retrieval: str = "sample", anneal_updates: int = 0,
                 cooling_updates: int = 0, sharpening_updates: int = 0,
                 entropy_penalty: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        if train_retrieval not in TRAIN_RETRIEVALS:
            raise ValueError(f"hard retrieval attention: train_retrieval must be one of "
                             f"{TRAIN_RETRIEVALS}, got {train_retrieval!r}")
        if anneal_updates < 0:
            raise ValueError(f"hard retrieval attention: anneal_updates must be >= 0, "
                             f"got {anneal_updates}")
        if cooling_updates < 0:
            raise ValueError(f"hard retrieval attention: cooling_updates must be >= 0, "
                             f"got {cooling_updates}")
        if cooling_updates and train_retrieval != "argmax":
            raise ValueError("hard retrieval attention: cooling_updates cools sampling into "
                             "the argmax: it needs train_retrieval='argmax'")
        if sharpening_updates < 0:
            raise ValueError(f"hard retrieval attention: sharpening_updates must be >= 0, "
                             f"got {sharpening_updates}")
        if sharpening_updates and (anneal_updates or cooling_updates):
            raise ValueError("hard retrieval attention: sharpening_updates replaces the "
                             "anneal_updates and cooling_updates curricula: set those to 0")
        if not entropy_penalty >= 0.0:
            raise ValueError(f"hard retrieval attention: entropy_penalty must be >= 0, "
                             f"got {entropy_penalty}")
        self.train_retrieval = train_retrieval
        self.entropy_penalty = entropy_penalty
        self.anneal_updates = anneal_updates
        self.cooling_updates = cooling_updates
        self.sharpening_updates = sharpening_updates
        self.num_updates = 0

    def set_num_updates(self, num_updates: int):
        """fairseq's trainer calls this on every module before each update."""
        self.num_updates = num_updates

    def _progress(self, span: int) -> float:
        """How far training is through a curriculum of ``span`` updates, from
        0 to 1; a curriculum of 0 updates is over from the start."""
        return min(1.0, self.num_updates / span) if span else 1.0

    def hard_share(self) -> float:
        """Probability that a training query row is retrieved hard."""
        return self._progress(self.anneal_updates)

    def sampling_temperature(self) -> float:
        """Temperature of the training draw from P: 1 samples as the paper,
        0 takes the argmax."""
        if self.train_retrieval == "sample":
            return 1.0
        return 1.0 - self._progress(self.cooling_updates)

    def sharpening_temperature(self) -> float:
        """Softmax temperature of the sharpening curriculum's soft attention;
        0 once it is over (or without it): training retrieves hard."""
        return 1.0 - self._progress(self.sharpening_updates)

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
        sharpening = self.sharpening_temperature()
        probs = F.softmax(scores / sharpening if sharpening else scores, dim=-1)
        if self.entropy_penalty:
            probs = EntropyPenalty.apply(probs, self.entropy_penalty)
        dropped = self.dropout_module(probs)
        if sharpening:
            # the sharpening curriculum: every row soft, with exact gradients
            return self._masked(torch.bmm(dropped.type_as(v), v), probs.detach(), empty)
        sampling_weights = dropped.detach()
        if dropped is not probs:
            sampling_weights = sampling_weights + _ALL_DROPPED_FALLBACK_EPS * probs.detach()
        temperature = self.sampling_temperature()
        if temperature == 0.0:
            indices = scores.argmax(dim=-1)
        else:
            indices = sample_key_indices(tempered(sampling_weights, temperature))
        out = StraightThroughRetrieval.apply(dropped, v, indices)
        share = self.hard_share()
        if share < 1.0:
            # the curriculum: the other rows attend softly, with exact gradients
            soft = torch.bmm(dropped.type_as(v), v)
            hard_rows = torch.rand(out.shape[:-1] + (1,), device=out.device) < share
            out = torch.where(hard_rows, out, soft)
        return self._masked(out, probs.detach(), empty)

    @staticmethod
    def _masked(out: Tensor, probs: Tensor, empty: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """Zeroes the outputs and weights of queries without keys."""
        if empty is not None:
            out = out.masked_fill(empty, 0.0)
            probs = probs.masked_fill(empty, 0.0)
        return out, probs
