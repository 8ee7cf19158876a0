"""Cross+self attention (Peitz, Garg et al. 2019): one multi-head attention
whose queries are the decoder states and whose keys/values are
concat(encoder states, decoder states); causal mask on the decoder part only,
source padding mask on the encoder part.

It replaces decoder self-attention inside fairseq's own decoder layer run with
``cross_self_attention=True`` (the layer concatenates the encoder output and
builds both masks). What fairseq's own version does not do, and this one does:
in incremental decoding the encoder part of K/V is projected once per
*sentence* (not per hypothesis) and kept apart from the decoder part, so beam
search neither stores it ``beam`` times nor copies it on every reorder; only
the decoder part grows and is reordered (under the plugin's search on a CPU
not even that: it lives on the search's lineage caches, and one kernel call
attends both parts: the engine's ``self_attention`` step). The full-sequence forward (training)
is one attention over the concatenation, as fairseq's.

``CrossSelfAttention`` is the soft kind, ``HardCrossSelfAttention`` the hard
retrieval kind (argmax over both parts in inference, sampling in training).

Alignment (``--print-alignment``): the layer has no separate cross-attention,
so when its decoder layer asks (``alignment_request``, in a teacher-forced
evaluation pass) the module also returns the attention probabilities over the
encoder part of [encoder; decoder]: its strongest encoder position per target
token (for the hard kind, the encoder key with the highest score).
"""

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from .cached_projection import CachedProjectionAttention, IncrementalState, one_copy_per_sentence
from .gather import retrieve
from .hard_retrieval_attention import HardRetrievalAttention
from . import decoding_step

_SOURCE_STATE = "cross_self_source"


class CrossSelfAttention(CachedProjectionAttention):
    """Soft cross+self attention; constructed with ``self_attention=False``."""

    kernel_mode = "soft"
    native_step = False  # (one attention over the source and the lineage)

    # set by the decoder layer for one call: None (no alignment), or whether
    # the alignment is wanted per head (True) or as the heads' mean (False)
    alignment_request: Optional[bool] = None

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: IncrementalState = None, **kwargs):
        """``MultiheadAttention.forward``'s signature (the rest in ``kwargs``)."""
        if incremental_state is None:
            # one attention over [encoder; decoder], as fairseq's layer built it
            out, _ = self.full_forward(query, key, value, key_padding_mask=key_padding_mask,
                                       **kwargs)
            if self.alignment_request is None:
                return out, None
            return out, self.source_alignment(query, key, key_padding_mask,
                                              kwargs.get("attn_mask"), self.alignment_request)
        attn_mask = kwargs.get("attn_mask")
        if self.training and isinstance(self, HardRetrievalAttention):
            raise RuntimeError("incremental decoding runs in eval mode; call model.eval()")
        tgt_len, bsz, _ = query.size()
        source = self._source_state(incremental_state)
        if "key" not in source:
            # first step: fairseq's layer passed key = value = [encoder; decoder]
            src_len = key.size(0) - tgt_len
            source_padding = None if key_padding_mask is None else key_padding_mask[:, :src_len]
            source = self._project_source(key[:src_len], source_padding,
                                          decoding_step.hypotheses_per_sentence(incremental_state))
            self.set_incremental_state(incremental_state, _SOURCE_STATE, source)
            target_padding = None if key_padding_mask is None else key_padding_mask[:, src_len:]
            if attn_mask is not None:
                attn_mask = attn_mask[:, src_len:]
            target = key[src_len:]
        else:
            target_padding, target = key_padding_mask, key
        lineage = decoding_step.lineage(incremental_state)
        if lineage is not None and tgt_len == 1 and lineage.usable(self, query):
            return self._lineage_step(query, lineage, source, incremental_state), None
        q, k, v, target_padding, *_ = self.project(
            query, target, target, target_padding, incremental_state, static_kv=False
        )
        if not isinstance(self, HardRetrievalAttention) or self.training:
            q = q * self.scaling
        source_kv_bsz = source["key"].size(0)
        heads, head_dim = self.num_heads, self.head_dim
        source_k = source["key"].view(source_kv_bsz * heads, -1, head_dim)
        source_v = source["value"].view(source_kv_bsz * heads, -1, head_dim)
        scores = torch.cat([
            self.mask_scores(self.attention_scores(q, source_k, source_kv_bsz), None,
                             source.get("padding_mask"), source_kv_bsz),
            self.mask_scores(self.attention_scores(q, k, bsz), attn_mask, target_padding, bsz),
        ], dim=-1)
        out = self.attend_parts(scores, source_v, v, source_kv_bsz, bsz)
        return self.merge_heads(out, tgt_len, bsz), None

    def _lineage_step(self, query: Tensor, lineage, source: Dict[str, Tensor],
                      incremental_state) -> Tensor:
        """A step of the plugin's search on a CPU: the decoder part on the
        search's lineage caches, attended with the encoder part in one kernel
        call. The search's tokens are never padding, so the step has none."""
        bsz, heads, head_dim = query.size(1), self.num_heads, self.head_dim
        saved_state = self._get_input_buffer(incremental_state)
        # fairseq's layer stops prepending the encoder states once "prev_key" is cached
        saved_state["prev_key"] = None
        out = lineage.self_attention(
            self, saved_state, self.q_proj(query).view(bsz * heads, 1, head_dim),
            self.k_proj(query), self.v_proj(query), bsz, source=source,
            group=decoding_step.hypotheses_per_sentence(incremental_state))
        self._set_input_buffer(incremental_state, saved_state)
        return self.merge_heads(out, 1, bsz)

    def full_forward(self, *args, **kwargs):
        """Soft: fairseq's own attention (and its fused training path)."""
        return MultiheadAttention.forward(self, *args, **kwargs)

    def source_alignment(self, query: Tensor, key: Tensor, key_padding_mask: Optional[Tensor],
                         attn_mask: Optional[Tensor], per_head: bool) -> Tensor:
        """Soft attention probabilities of the encoder part (heads, bsz, tgt, src),
        or their mean over heads."""
        projected = self.project(query, key, key, key_padding_mask, None, static_kv=False)
        probs = F.softmax(self.scores(projected, attn_mask).float(), dim=-1)
        weights = self.format_weights(probs, projected.bsz, True)[..., : key.size(0) - query.size(0)]
        return weights if per_head else weights.mean(dim=0)

    def _source_state(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        return self.get_incremental_state(incremental_state, _SOURCE_STATE) or {}

    def _project_source(self, source: Tensor, padding: Optional[Tensor], count: int):
        """Encoder part of K/V, one copy per sentence of ``count`` hypotheses."""
        source, padding = one_copy_per_sentence(source, padding, count)
        src_len, kv_bsz, _ = source.size()
        shape = (src_len, kv_bsz, self.num_heads, self.head_dim)
        state = {
            # cached as (kv_bsz, heads, src_len, head_dim), as fairseq caches K/V
            "key": self.k_proj(source).view(shape).permute(1, 2, 0, 3).contiguous(),
            "value": self.v_proj(source).view(shape).permute(1, 2, 0, 3).contiguous(),
        }
        if padding is not None:  # kept even when all False: asking would wait for the device
            state["padding_mask"] = padding.to(torch.bool)
        return state

    def attend_parts(self, scores: Tensor, source_v: Tensor, target_v: Tensor,
                     source_kv_bsz: int, bsz: int) -> Tensor:
        """Softmax over both parts; P_source·V_source (per sentence) + P_target·V_target."""
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        probs = self.dropout_module(probs)
        src_len = source_v.size(1)
        out = self.weighted_values(probs[..., :src_len], source_v, source_kv_bsz)
        return out.baddbmm_(probs[..., src_len:], target_v)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Decoder part per hypothesis; the encoder part per sentence, reordered
        only when the generator drops finished sentences."""
        super().reorder_incremental_state(incremental_state, new_order)
        source = self._source_state(incremental_state)
        count = decoding_step.hypotheses_per_sentence(incremental_state)
        static = decoding_step.fixed_shape(incremental_state)
        rows = static.active if static else (source["key"].size(0) * count if source else 0)
        if source and rows != new_order.size(0):
            order = decoding_step.sentence_order(new_order, count)
            for name, tensor in source.items():
                source[name] = decoding_step.reorder(tensor, order, static)
            self.set_incremental_state(incremental_state, _SOURCE_STATE, source)
        return incremental_state


class HardCrossSelfAttention(CrossSelfAttention, HardRetrievalAttention):
    """Hard retrieval over [encoder; decoder]: one key per head and query."""

    kernel_mode = "hard"

    def full_forward(self, *args, **kwargs):
        return CachedProjectionAttention.forward(self, *args, **kwargs)

    def attend_parts(self, scores: Tensor, source_v: Tensor, target_v: Tensor,
                     source_kv_bsz: int, bsz: int) -> Tensor:
        indices = scores.argmax(dim=-1)
        src_len = source_v.size(1)
        from_source = retrieve(source_v, self.value_rows(bsz, source_kv_bsz, scores.device),
                               indices.clamp(max=src_len - 1))
        from_target = retrieve(target_v, self.value_rows(bsz, bsz, scores.device),
                               (indices - src_len).clamp(min=0))
        return torch.where((indices < src_len).unsqueeze(-1), from_source, from_target)
