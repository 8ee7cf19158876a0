"""Flexible attention (Shu & Nakayama 2017, "Reducing Redundant Computations
with Flexible Attention"), as decoder cross-attention.

The attention centre p_t = sum_s a_t(s)·s is tracked per hypothesis and head;
scores are penalised by g_t (s - p_{t-1})² / (2σ²), with the strength
g_t = sigmoid(v_gᵀ tanh(W_g h_t + b_g)) computed, per head, from the decoder
state that queries the attention. The penalty is computed in float32.

Test time, threshold τ: attention covers only the band of positions whose
penalty is below τ, |s - p_{t-1}| < σ·sqrt(2τ/g_t) (plus the position
nearest p_{t-1}, so that no query is left without keys). On CPU in float32 a
C kernel scores only the bands, each where it lies in the K/V cache
(``kernels/flexible_band.c``, one call per step). Elsewhere the step runs as
PyTorch ops of static shape: every position is scored and those outside the
band are masked, so that no step waits for the device to size a window
(a band's width depends on the data; its only static bound is the source).
Either way the band positions are counted (CPS, score computations per
decoding step).

Training is parallel over target positions, so p_{t-1} cannot come from the
previous step's penalised attention. We use a fixed-point refinement: centres
of an unpenalised pass, shifted by one step, penalise the next pass, whose
centres, shifted again, penalise the next (``train_passes`` penalised passes,
default 2). Every pass reuses the same scores (only the penalty and a softmax
are recomputed), so refinement is cheap, and each pass's centres come closer
to those decoding uses, the real previous step's. Centres are constants to the
gradient. ``train_passes=0`` runs the exact recurrence in training as well (a
loop over target positions). Evaluation (validation included) always runs the
exact recurrence, so it scores the model that decoding runs. Decoding keeps
the real previous centre in incremental state under its own key, reordered
for beam search (fairseq's encoder-decoder attention skips reordering its own
buffer).

``train_threshold``: apply τ's band in training too (each pass attends only
within the band around its estimate of p_{t-1}). The paper trains and
fine-tunes without it; with it, fine-tuning adapts the model to the
positions decoding will skip.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import kernels
from ..kernels import gpu_ops
from . import decoding_step
from .cached_projection import CachedProjectionAttention
from .cps import CpsCounter
from .gate_networks import fast_tanh, gate_size
from .windows import (band_half_width, band_limits, band_threshold, first_key_positions, in_band,
                      unpadded_lengths)

_CENTRE_STATE = "flexible_centre"


class FlexibleAttention(CachedProjectionAttention):
    """Drop-in for fairseq's encoder-decoder ``MultiheadAttention``.

    Extra args: ``sigma`` (σ of the penalty); ``threshold`` (τ, a number; None
    or inf: no band; ``set_threshold`` changes it); ``train_passes`` and
    ``train_threshold`` (see module doc);
    ``gate_dim`` (hidden size of the gate network, default embed_dim).
    """

    new_parameter_prefixes = ("gate_",)
    batch_major_static_cache = True  # the C kernel reads each band as a contiguous block
    use_kernel = True  # False: PyTorch ops only (benchmarks and tests compare both)

    def __init__(self, embed_dim, num_heads, *args, sigma: float = 3.0,
                 threshold: Optional[float] = None, train_passes: int = 2,
                 train_threshold: bool = False, gate_dim: Optional[int] = None, **kwargs):
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        if not self.encoder_decoder_attention:
            raise ValueError("flexible attention replaces decoder cross-attention only")
        if not sigma > 0:
            raise ValueError(f"flexible attention: sigma must be > 0, got {sigma}")
        if train_passes < 0:
            raise ValueError(f"flexible attention: train_passes must be >= 0, got {train_passes}")
        self.sigma = sigma
        self.set_threshold(threshold)
        self.train_passes = train_passes
        self.train_threshold = train_threshold
        gate_dim = gate_size(gate_dim, embed_dim)
        self.gate_hidden = nn.Linear(embed_dim, gate_dim)  # W_g, b_g
        self.gate_out = nn.Linear(gate_dim, num_heads, bias=False)  # v_g, one per head
        nn.init.xavier_uniform_(self.gate_hidden.weight)
        nn.init.zeros_(self.gate_hidden.bias)
        nn.init.xavier_uniform_(self.gate_out.weight)
        self.cps = CpsCounter()
        self.last_gates: Optional[Tensor] = None  # (tgt_len, bsz, heads), for the criterion

    def set_threshold(self, threshold: Optional[float]):
        """τ for decoding (and for training with ``train_threshold``)."""
        self.threshold = band_threshold(threshold)

    def gates(self, query: Tensor) -> Tensor:
        """g_t per query position and head: (tgt_len, bsz, heads)."""
        return torch.sigmoid(self.gate_out(fast_tanh(self.gate_hidden(query))))

    def penalty(self, positions: Tensor, centres: Tensor, gates: Tensor) -> Tensor:
        """g (s - p)² / (2σ²) in float32; centres and gates (N, T); positions
        broadcast against (N, T, S)."""
        distance = positions.float() - centres.float().unsqueeze(-1)
        return gates.float().unsqueeze(-1) * distance.pow(2) / (2 * self.sigma ** 2)

    def attend(self, query, p, incremental_state, attn_mask, need_weights, need_head_weights):
        q, k, v, key_padding_mask, kv_bsz, tgt_len, bsz = p
        gates = self.gates(query)
        self.last_gates = gates  # read by the fine-tuning criterion after forward
        gates = gates.permute(1, 2, 0).reshape(bsz * self.num_heads, tgt_len)
        threshold = self.threshold if self.train_threshold or not self.training else None
        if self.training and self.train_threshold and threshold is None:
            # models refuse this when switched to training (decoding with τ = ∞ is fine)
            raise ValueError("flexible attention: train_threshold needs a finite threshold")

        def starts():  # each row's first unpadded key position: the first centre
            first = first_key_positions(key_padding_mask, kv_bsz, q.device)
            return first.repeat_interleave(bsz // kv_bsz * self.num_heads)

        if incremental_state is not None:
            if tgt_len != 1:
                raise ValueError("flexible attention decodes one target position per step")
            state = self.get_incremental_state(incremental_state, _CENTRE_STATE) or {}
            previous = state["centre"].view(-1, 1) if "centre" in state else starts().unsqueeze(1)
            if threshold is not None:
                out, centres = self._banded_step(q, k, v, key_padding_mask, kv_bsz, bsz,
                                                 previous, gates, threshold)
                result = (self.merge_heads(out, tgt_len, bsz), None)
            else:
                scores = self.scores(p, attn_mask)
                probs = self._penalised_softmax(scores, previous, gates)
                centres = self._centres(probs)
                visible = (~scores.isneginf()).sum(-1)
                self.cps.add(visible, visible)
                result = self._attend(probs, v, kv_bsz, bsz, need_weights, need_head_weights)
            centre = centres[:, -1].detach().view(bsz, self.num_heads)
            if "centre" in state and decoding_step.fixed_shape(incremental_state) is not None:
                state["centre"].copy_(centre)  # the fixed-shape step: the same tensor every step
            else:
                state["centre"] = centre
            self.set_incremental_state(incremental_state, _CENTRE_STATE, state)
            return result

        scores = self.scores(p, attn_mask)
        if self.training and self.train_passes > 0:
            probs = self._refined_probs(scores, gates, starts(), threshold)
        else:
            probs = self._recurrent_probs(scores, gates, starts(), threshold)
        return self._attend(probs, v, kv_bsz, bsz, need_weights, need_head_weights)

    def _refined_probs(self, scores, gates, starts, threshold):
        """Training, in parallel: p_{t-1} from the previous pass's centres
        (with a threshold: attending within each estimate's band)."""
        src_len = scores.size(-1)
        positions = torch.arange(src_len, device=scores.device)
        half = None if threshold is None else band_half_width(gates, self.sigma, threshold)
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)  # unpenalised pass
        for _ in range(self.train_passes):
            shifted = torch.cat([starts.unsqueeze(1), self._centres(probs)[:, :-1]], dim=1)
            band = None if half is None else in_band(positions, *band_limits(shifted, half, src_len))
            probs = self._penalised_softmax(scores, shifted, gates, band, positions)
        return probs

    def _recurrent_probs(self, scores, gates, starts, threshold):
        """The exact recurrence decoding runs, one target position after the
        other, on precomputed scores (evaluation, or ``train_passes=0``)."""
        src_len = scores.size(-1)
        positions = torch.arange(src_len, device=scores.device)
        previous = starts.unsqueeze(1)
        steps = []
        for t in range(scores.size(1)):
            band = None
            if threshold is not None:
                half = band_half_width(gates[:, t:t + 1], self.sigma, threshold)
                band = in_band(positions, *band_limits(previous.float(), half, src_len))
            probs = self._penalised_softmax(scores[:, t:t + 1], previous, gates[:, t:t + 1], band)
            previous = self._centres(probs)
            steps.append(probs)
        return torch.cat(steps, dim=1)

    def _penalised_softmax(self, scores, centres, gates, band=None, positions=None):
        if positions is None:
            positions = torch.arange(scores.size(-1), device=scores.device)
        logits = scores.float() - self.penalty(positions, centres, gates)
        if band is not None:
            logits = logits.masked_fill(~band, float("-inf"))
        return F.softmax(logits, dim=-1).type_as(scores)

    @staticmethod
    def _centres(probs, positions=None):
        """p = sum_s a(s)·s, (N, T), as constants to the gradient."""
        if positions is None:
            positions = torch.arange(probs.size(-1), device=probs.device)
        return (probs.detach().float() * positions).sum(-1)

    def _attend(self, probs, v, kv_bsz, bsz, need_weights, need_head_weights):
        out = self.weighted_values(self.dropout_module(probs), v, kv_bsz)
        weights = self.format_weights(probs, bsz, need_head_weights) if need_weights else None
        return self.merge_heads(out, probs.size(1), bsz), weights

    def _banded_step(self, q, k, v, key_padding_mask, kv_bsz, bsz, previous, gates, threshold):
        """Score only the bands (q unscaled, one target position). On GPU: the
        Triton kernel (``kernels.gpu_ops.flexible_band_step``); on CPU in
        float32: the C kernel, scoring each band in place in the cache
        (``kernels.flexible_band_step``). Elsewhere: all positions scored, the
        band masked (static shapes, no host synchronisation)."""
        src_len = k.size(1)
        centre = previous[:, 0].float()
        gate = gates[:, 0].float()
        if self.use_kernel and gpu_ops.available(q):  # the band kernel (Triton), on GPU
            out, centres, scored = gpu_ops.flexible_band_step(
                q[:, 0], k, v, self.value_rows(bsz, kv_bsz, q.device), key_padding_mask,
                self.num_heads, centre, gate, self.scaling, self.sigma, threshold)
            out = out.unsqueeze(1)
        elif self.use_kernel and kernels.can_run_flexible_band(q, k, v):
            out, centres, scored = kernels.flexible_band_step(
                q[:, 0], k, v, key_padding_mask, centre, gate, bsz // kv_bsz, self.num_heads,
                self.scaling, self.sigma, threshold)
            out = out.unsqueeze(1)
        else:
            out, centres, scored = self._masked_band_step(q, k, v, key_padding_mask, kv_bsz, bsz,
                                                          centre, gate, threshold)
        if self.cps.enabled:
            available = unpadded_lengths(key_padding_mask, kv_bsz, src_len, q.device)
            self.cps.add(scored, available.repeat_interleave(bsz // kv_bsz * self.num_heads))
        return out, centres.unsqueeze(1)

    def _masked_band_step(self, q, k, v, key_padding_mask, kv_bsz, bsz, centre, gate,
                          threshold):
        """Penalised attention of one step over every position, masked to each
        row's band [low, high] (``band_limits``: exactly the positions whose
        penalty is below τ): output (rows, 1, head_dim), new centres and the
        band sizes (CPS)."""
        src_len = k.size(1)
        low, high = band_limits(centre, band_half_width(gate, self.sigma, threshold), src_len)
        positions = torch.arange(src_len, device=q.device)
        band = in_band(positions, low, high)
        if key_padding_mask is not None:
            rows = self.value_rows(bsz, kv_bsz, q.device) // self.num_heads
            band &= ~key_padding_mask.index_select(0, rows)
        scores = self.attention_scores(q * self.scaling, k, kv_bsz)[:, 0].float()
        distance = positions - centre.unsqueeze(1)
        # scores - g (s - p)² / (2σ²), in float32
        logits = torch.addcmul(scores, distance.square(), gate.unsqueeze(1),
                               value=-0.5 / self.sigma ** 2)
        probs = F.softmax(logits.masked_fill_(~band, float("-inf")), dim=-1)
        out = self.weighted_values(probs.unsqueeze(1).type_as(v), v, kv_bsz)  # no dropout
        return out, (probs * positions).sum(-1), band.sum(-1)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        super().reorder_incremental_state(incremental_state, new_order)
        state = self.get_incremental_state(incremental_state, _CENTRE_STATE)
        if state:
            state["centre"] = decoding_step.reorder(state["centre"], new_order,
                                                    decoding_step.fixed_shape(incremental_state))
            self.set_incremental_state(incremental_state, _CENTRE_STATE, state)
        return incremental_state
