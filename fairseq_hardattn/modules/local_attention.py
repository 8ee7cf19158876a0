"""Luong et al. (2015) local-p attention, the baseline of flexible attention,
as multi-head decoder cross-attention.

Per query and head a centre is predicted, p_t = S·sigmoid(v_pᵀ tanh(W_p h_t))
(S: the sentence's unpadded source length, positions counted from its first
unpadded token); only the window [p_t - D, p_t + D] is attended, and the
softmax weights inside it are multiplied by exp(-(s - p_t)² / (2σ²)), σ = D/2
(outside the softmax, as in Luong et al.; they do not sum to 1).

Training scores everything and masks the rest (the gradient reaches p_t
through the Gaussian); decoding gathers, per hypothesis and head, the keys of
the 2D+2 candidate positions around p_t (a window of static width, so no step
waits for the device to size it), scores only those and sums their values
where they lie in the cache (``windows``); under the plugin's search on a
CPU one kernel call does the same (the engine's ``window_attention``).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import decoding_step
from .cached_projection import CachedProjectionAttention
from .cps import CpsCounter
from .gate_networks import fast_tanh
from .windows import first_key_positions, gather_windows, unpadded_lengths, weighted_window_values


class LocalAttention(CachedProjectionAttention):
    """Drop-in for fairseq's encoder-decoder ``MultiheadAttention``.

    Extra args: ``window`` (D: the window is 2D+1 positions), ``centre_dim``
    (hidden size of the centre predictor, default embed_dim).
    """

    new_parameter_prefixes = ("centre_",)
    batch_major_static_cache = True  # windows are contiguous blocks
    kernel_mode = "local"  # the plugin's search on a CPU: one kernel call a step

    def __init__(self, embed_dim, num_heads, *args, window: int = 10,
                 centre_dim: Optional[int] = None, **kwargs):
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        if not self.encoder_decoder_attention:
            raise ValueError("local attention replaces decoder cross-attention only")
        if window < 1:
            raise ValueError(f"local attention: window D must be >= 1, got {window}")
        self.window = window
        self.sigma = window / 2
        centre_dim = centre_dim or embed_dim
        self.centre_hidden = nn.Linear(embed_dim, centre_dim, bias=False)  # W_p
        self.centre_out = nn.Linear(centre_dim, num_heads, bias=False)  # v_p, per head
        nn.init.xavier_uniform_(self.centre_hidden.weight)
        nn.init.xavier_uniform_(self.centre_out.weight)
        self.cps = CpsCounter()

    def centres(self, query: Tensor, starts: Tensor, lengths: Tensor, bsz: int) -> Tensor:
        """Absolute predicted centres (bsz*heads, tgt_len)."""
        relative = torch.sigmoid(self.centre_out(fast_tanh(self.centre_hidden(query))))
        relative = relative.permute(1, 2, 0).reshape(bsz * self.num_heads, -1).float()
        return starts.unsqueeze(1) + lengths.unsqueeze(1) * relative

    def attend(self, query, p, incremental_state, attn_mask, need_weights, need_head_weights):
        q, k, v, key_padding_mask, kv_bsz, tgt_len, bsz = p
        src_len = k.size(1)
        rows_per_sentence = bsz // kv_bsz * self.num_heads
        starts = first_key_positions(key_padding_mask, kv_bsz, q.device)
        lengths = unpadded_lengths(key_padding_mask, kv_bsz, src_len, q.device)
        centres = self.centres(query, starts.repeat_interleave(rows_per_sentence),
                               lengths.repeat_interleave(rows_per_sentence), bsz)

        if incremental_state is not None and not self.training:
            lineage = decoding_step.lineage(incremental_state)
            if (lineage is not None and tgt_len == 1 and not self.cps.enabled
                    and lineage.usable(self, q, ("local",))):
                out = lineage.window_attention(self, q, k, v, key_padding_mask,
                                                          centres[:, -1], kv_bsz)
                return self.merge_heads(out, tgt_len, bsz), None
            out = self._window_step(q * self.scaling, k, v, key_padding_mask, kv_bsz, bsz,
                                    centres, lengths)
            return self.merge_heads(out, tgt_len, bsz), None

        scores = self.scores(p, attn_mask)
        positions = torch.arange(src_len, device=q.device).float()
        distance = positions - centres.unsqueeze(-1)  # (rows, T, S)
        logits = scores.float().masked_fill(distance.abs() > self.window, float("-inf"))
        logits = logits.masked_fill(logits.isneginf().all(-1, keepdim=True), 0.0)
        probs = F.softmax(logits, dim=-1) * torch.exp(-distance.pow(2) / (2 * self.sigma ** 2))
        probs = probs.masked_fill(scores.isneginf(), 0.0).type_as(scores)
        out = self.weighted_values(self.dropout_module(probs), v, kv_bsz)
        weights = self.format_weights(probs, bsz, need_head_weights) if need_weights else None
        return self.merge_heads(out, tgt_len, bsz), weights

    def _window_step(self, q, k, v, key_padding_mask, kv_bsz, bsz, centres, lengths):
        """Gaussian-weighted attention of one step over |s - p| <= D: keys
        gathered from windows of 2D+2 positions (``gather_windows``), values
        summed where they lie (``weighted_window_values``)."""
        src_len = k.size(1)
        centre = centres[:, -1]
        width = min(2 * self.window + 2, src_len)
        # |s - p| <= D lies in [floor(p) - D, floor(p) + D + 1]
        start = (torch.floor(centre) - self.window).clamp(min=0, max=src_len - width).long()
        kv_rows = self.value_rows(bsz, kv_bsz, q.device)
        positions = start.unsqueeze(1) + torch.arange(width, device=q.device)
        distance = positions - centre.unsqueeze(1)
        inside = distance.abs() <= self.window
        if key_padding_mask is not None:
            inside &= ~key_padding_mask.index_select(0, kv_rows // self.num_heads).gather(1, positions)
        keys = gather_windows(k, kv_rows, start, width)
        scores = torch.bmm(q, keys.transpose(1, 2)).squeeze(1)
        logits = scores.float().masked_fill(~inside, float("-inf"))
        probs = F.softmax(logits, dim=-1) * torch.exp(-distance.pow(2) / (2 * self.sigma ** 2))
        out = weighted_window_values(probs, positions + (kv_rows * src_len).unsqueeze(1), v)
        if self.cps.enabled:
            self.cps.add(inside.sum(-1), lengths.repeat_interleave(bsz // kv_bsz * self.num_heads))
        return out  # decoding: no dropout
