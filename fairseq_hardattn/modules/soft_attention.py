"""Soft (scaled dot-product) attention, the baseline kind.

Training and any forward without an incremental state run fairseq's own
``MultiheadAttention.forward`` (its fused path, so training is exactly
fairseq's), unless the projections are int8 (``--int8-decoding``). Incremental decoding goes through ``CachedProjectionAttention``,
which keeps encoder K/V once per sentence of a beam, as every other kind of
this plugin does: the soft baseline is compared with them on equal terms.
"""

import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import nn

from .cached_projection import CachedProjectionAttention


class SoftAttention(CachedProjectionAttention):
    """Drop-in for fairseq's ``MultiheadAttention`` (same parameters)."""

    kernel_mode = "soft"
    native_step = True

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None,
                **kwargs):
        if incremental_state is None and isinstance(self.q_proj, nn.Linear):
            # (int8 projections, --int8-decoding, have no weight for fairseq's fused path)
            return MultiheadAttention.forward(self, query, key, value,
                                              key_padding_mask=key_padding_mask, **kwargs)
        return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                               incremental_state=incremental_state, **kwargs)

    def attend(self, query, p, incremental_state, attn_mask, need_weights, need_head_weights):
        scores = self.scores(p, attn_mask)
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = self.weighted_values(self.dropout_module(probs), p.v, p.kv_bsz)
        weights = self.format_weights(probs, p.bsz, need_head_weights) if need_weights else None
        return self.merge_heads(out, p.tgt_len, p.bsz), weights
