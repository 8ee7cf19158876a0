"""The projection and key/value-cache half of fairseq's ``MultiheadAttention``.

fairseq's ``MultiheadAttention.forward`` is one monolithic function, and in
training it takes a fast path (``F.multi_head_attention_forward``) that would
silently run soft attention. Mechanisms in this package therefore override
``forward`` completely; this base class gives them the part they share with
fairseq unchanged: Q/K/V projections, the incremental-decoding cache
(self-attention appends one K/V per step, encoder-decoder attention projects
the encoder once with ``static_kv``), "beamable" encoder-decoder attention
(one K/V copy per sentence instead of per hypothesis, the grouping read from
the decoding call: ``decoding_step``), and score masking. Where the decoding
engine steps a module (the plugin's search on a CPU, the fixed-shape step),
``forward`` hands it the step (``decoding_step``).
"""

from typing import ClassVar, Dict, NamedTuple, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from . import decoding_step

IncrementalState = Optional[Dict[str, Dict[str, Optional[Tensor]]]]


class Projected(NamedTuple):
    """What ``project`` returns: q (bsz*heads, tgt_len, head_dim), unscaled;
    k and v (kv_bsz*heads, src_len, head_dim); the key padding mask
    (kv_bsz, src_len) as bool or None; kv_bsz, smaller than bsz when
    encoder-decoder attention keeps one K/V copy per sentence of a beam."""

    q: Tensor
    k: Tensor
    v: Tensor
    key_padding_mask: Optional[Tensor]
    kv_bsz: int
    tgt_len: int
    bsz: int


def one_copy_per_sentence(states: Tensor, padding: Optional[Tensor], count: int):
    """Encoder states (T, sentences*count, C) repeated per hypothesis, and their
    padding (sentences*count, T), as one copy per sentence."""
    if count == 1:
        return states, padding
    states = states.view(states.size(0), -1, count, states.size(2))[:, :, 0]
    if padding is not None:
        padding = padding.view(-1, count, padding.size(1))[:, 0]
    return states, padding


class CachedProjectionAttention(MultiheadAttention):
    """Base for attention mechanisms that replace only the scoring/attending part.

    Same constructor and parameters as fairseq's ``MultiheadAttention`` (so
    checkpoints load across mechanisms), minus the options no mechanism here
    supports.
    """

    # parameters a mechanism adds to MultiheadAttention's: a checkpoint
    # trained with another kind lacks them, and loading starts them fresh
    new_parameter_prefixes: Tuple[str, ...] = ()
    # cache encoder K/V batch-major (fairseq: time-major, as projected), for
    # mechanisms that gather windows of consecutive source positions
    batch_major_static_cache = False
    # how the search's attention kernel attends for this mechanism on a CPU
    # (soft, hard, topk, local; None: it does not), and whether the engine's
    # native decoder step may take the place of its forward (a step that is
    # its projections, then the kernel's attention over the caches: nothing more)
    kernel_mode: ClassVar[Optional[str]] = None
    native_step: ClassVar[bool] = False

    def __init__(self, embed_dim, num_heads, *args, **kwargs):
        unsupported = [
            name
            for name in ("add_bias_kv", "add_zero_attn", "xformers_att_config")
            if kwargs.get(name)
        ]
        if unsupported:
            raise ValueError(
                f"{type(self).__name__} does not support {', '.join(unsupported)}"
            )
        super().__init__(embed_dim, num_heads, *args, **kwargs)

    @property
    def kernel_keys(self) -> int:
        """The keys the kernel keeps of a step's scores (top-k's k; 0: the mode says)."""
        return 0

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
        """fairseq's ``MultiheadAttention.forward`` signature and semantics:
        project and cache (``project``), then the mechanism's ``attend``; a
        step of the plugin's search on a CPU is the engine's
        (``decoding_step.lineage``): self-attention over caches that are never
        reordered, the encoder's keys and values read in place."""
        lineage = decoding_step.lineage(incremental_state)
        stepping = (lineage is not None and not self.training and not before_softmax
                    and lineage.usable(self, query))
        if stepping and self.self_attention:
            if key_padding_mask is not None or query.size(0) != 1:
                raise ValueError(f"{type(self).__name__}: a lineage decoding step takes one "
                                 "token per hypothesis and no padding")
            bsz, heads, head_dim = query.size(1), self.num_heads, self.head_dim
            saved_state = self._get_input_buffer(incremental_state)
            out = lineage.self_attention(
                self, saved_state, self.q_proj(query).view(bsz * heads, 1, head_dim),
                self.k_proj(query), self.v_proj(query), bsz)
            self._set_input_buffer(incremental_state, saved_state)
            return self.merge_heads(out, 1, bsz), None
        projected = self.project(query, key, value, key_padding_mask, incremental_state, static_kv)
        if (stepping and self.encoder_decoder_attention and attn_mask is None
                and query.size(0) == 1):
            # the search reads no step's weights (alignments come from a teacher-forced pass)
            out = lineage.source_attention(self, self._get_input_buffer(incremental_state),
                                           projected.q, projected.key_padding_mask)
            return self.merge_heads(out, 1, projected.bsz), None
        if before_softmax:  # fairseq's contract: the scaled, masked scores and the values
            return self.scores(projected, attn_mask), projected.v
        return self.attend(query, projected, incremental_state, attn_mask,
                           need_weights or need_head_weights, need_head_weights)

    def attend(self, query: Tensor, p: Projected, incremental_state: IncrementalState,
               attn_mask: Optional[Tensor], need_weights: bool,
               need_head_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """Scores, weights and output of the mechanism: (out, weights or None)."""
        raise NotImplementedError

    def scores(self, p: Projected, attn_mask: Optional[Tensor], scaled: bool = True) -> Tensor:
        """q·kᵀ (bsz*heads, tgt_len, src_len), q scaled by 1/√d unless ``scaled``
        is False (an argmax needs no scale), with ``attn_mask`` added and padded
        keys at -inf: the opening of every mechanism's ``attend``."""
        q = p.q * self.scaling if scaled else p.q
        return self.mask_scores(self.attention_scores(q, p.k, p.kv_bsz), attn_mask,
                                p.key_padding_mask, p.kv_bsz)

    def project(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        incremental_state: IncrementalState,
        static_kv: bool,
    ) -> Projected:
        """Project Q/K/V and update the incremental cache (see ``Projected``)."""
        tgt_len, bsz, embed_dim = query.size()
        if embed_dim != self.embed_dim:
            raise ValueError(f"query dim {embed_dim} != {self.embed_dim}")

        saved_state = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if "prev_key" in saved_state and static_kv:
                # encoder K/V were projected on the first step
                key = value = None

        q = self.q_proj(query)
        k = v = None
        if self.self_attention:
            k = self.k_proj(query)
            v = self.v_proj(query)
        elif key is not None:
            if self.encoder_decoder_attention:
                key, key_padding_mask = one_copy_per_sentence(
                    key, key_padding_mask, decoding_step.hypotheses_per_sentence(incremental_state))
                value = key
            k = self.k_proj(key)
            v = self.v_proj(value)

        heads, head_dim = self.num_heads, self.head_dim
        q = q.contiguous().view(tgt_len, bsz * heads, head_dim).transpose(0, 1)
        kv_bsz = bsz
        if k is not None:
            kv_bsz = k.size(1)
            k = k.contiguous().view(-1, kv_bsz * heads, head_dim).transpose(0, 1)
            v = v.contiguous().view(-1, kv_bsz * heads, head_dim).transpose(0, 1)

        static = decoding_step.fixed_shape(incremental_state)
        if static is not None and not static_kv:
            # the engine's preallocated cache, written in place at static.position
            k, v, key_padding_mask = self._write_step(saved_state, static, k, v, key_padding_mask)
            self._set_input_buffer(incremental_state, saved_state)
        elif saved_state is not None:
            # cached as (kv_bsz, heads, seq_len, head_dim)
            if "prev_key" in saved_state:
                prev_key = saved_state["prev_key"]
                prev_value = saved_state["prev_value"]
                kv_bsz = prev_key.size(0)
                prev_key = prev_key.view(kv_bsz * heads, -1, head_dim)
                prev_value = prev_value.view(kv_bsz * heads, -1, head_dim)
                if static_kv:
                    k, v = prev_key, prev_value
                else:
                    k = torch.cat([prev_key, k], dim=1)
                    v = torch.cat([prev_value, v], dim=1)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
                batch_size=kv_bsz,
                src_len=k.size(1),
                static_kv=static_kv,
            )
            if static_kv and self.batch_major_static_cache:
                # one copy per sentence, on the first step (later: no-ops)
                k, v = k.contiguous(), v.contiguous()
            saved_state["prev_key"] = k.view(kv_bsz, heads, -1, head_dim)
            saved_state["prev_value"] = v.view(kv_bsz, heads, -1, head_dim)
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)

        if k is None:
            raise ValueError(
                f"{type(self).__name__}: no keys given and none cached "
                "(encoder-decoder attention needs `key` on its first step)"
            )
        if key_padding_mask is not None:
            if key_padding_mask.dim() == 0:
                key_padding_mask = None
            else:
                key_padding_mask = key_padding_mask.to(torch.bool)
                if key_padding_mask.shape != (kv_bsz, k.size(1)):
                    raise ValueError(
                        f"key_padding_mask has shape {tuple(key_padding_mask.shape)}, "
                        f"expected {(kv_bsz, k.size(1))}"
                    )
        return Projected(q, k, v, key_padding_mask, kv_bsz, tgt_len, bsz)

    def _write_step(self, saved_state, static, k, v, step_padding):
        """Write this step's K/V (and padding) at ``static.position`` of the
        preallocated cache; returns the whole cache (positions not written yet
        are masked) as (rows*heads, capacity, head_dim) and its padding."""
        rows, heads, head_dim = k.size(0) // self.num_heads, self.num_heads, self.head_dim
        if "prev_key" not in saved_state:
            shape = (rows, heads, static.capacity, head_dim)
            saved_state["prev_key"], saved_state["prev_value"] = k.new_zeros(shape), v.new_zeros(shape)
            saved_state["prev_key_padding_mask"] = torch.ones(
                rows, static.capacity, dtype=torch.bool, device=k.device)
        key, value = saved_state["prev_key"], saved_state["prev_value"]
        padding = saved_state["prev_key_padding_mask"]
        key.index_copy_(2, static.position, k.reshape(rows, heads, 1, head_dim))
        value.index_copy_(2, static.position, v.reshape(rows, heads, 1, head_dim))
        if step_padding is None:
            step_padding = torch.zeros(rows, 1, dtype=torch.bool, device=k.device)
        padding.index_copy_(1, static.position, step_padding.to(torch.bool))
        return (key.view(rows * heads, -1, head_dim), value.view(rows * heads, -1, head_dim),
                padding)

    def grow_static_cache(self, incremental_state, capacity: int):
        """Extend the engine's self-attention cache to ``capacity`` positions."""
        buffer = self._get_input_buffer(incremental_state)
        if self.encoder_decoder_attention or "prev_key" not in buffer:
            return
        for name in ("prev_key", "prev_value"):
            buffer[name] = decoding_step.grown(buffer[name], 2, capacity, 0)
        buffer["prev_key_padding_mask"] = decoding_step.grown(
            buffer["prev_key_padding_mask"], 1, capacity, True)
        self._set_input_buffer(incremental_state, buffer)

    def set_beam_size(self, beam_size):
        """Ignored: the hypotheses per sentence come from each decoding call
        (``decoding_step``), never from state left by an earlier one."""

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Self-attention caches per hypothesis; encoder-decoder attention per
        sentence, reordered only when the generator drops finished sentences
        (its table of sentences only, where a reader keeps one:
        ``decoding_step.SOURCE_SENTENCES``)."""
        buffer = self._get_input_buffer(incremental_state)
        if not buffer:
            return incremental_state
        static = decoding_step.fixed_shape(incremental_state)
        order = new_order
        if self.encoder_decoder_attention:
            count = decoding_step.hypotheses_per_sentence(incremental_state)
            sentences = buffer.get(decoding_step.SOURCE_SENTENCES)
            rows = static.active if static else (
                sentences if sentences is not None else next(t for t in buffer.values() if t is not None)
            ).size(0) * count
            if rows == new_order.numel():
                return incremental_state
            order = decoding_step.sentence_order(new_order, count)
            if sentences is not None:  # (its reader finds each sentence's caches through it)
                buffer[decoding_step.SOURCE_SENTENCES] = sentences.index_select(0, order)
                self._set_input_buffer(incremental_state, buffer)
                return incremental_state
        for name, tensor in buffer.items():
            if tensor is None or name.startswith("lineage_"):
                continue  # (lineage buffers are never reordered: their ancestors are)
            written = None
            if static is not None and tensor.dim() == 4 and not self.encoder_decoder_attention:
                written = static.filled + 1  # K/V: the positions written, this step's included
            buffer[name] = decoding_step.reorder(tensor, order, static, written)
        self._set_input_buffer(incremental_state, buffer)
        return incremental_state

    def attention_scores(self, q: Tensor, k: Tensor, kv_bsz: int) -> Tensor:
        """q·kᵀ as (bsz*heads, tgt_len, src_len), grouping hypotheses by sentence."""
        if q.size(0) == k.size(0):
            return torch.bmm(q, k.transpose(1, 2))
        heads = self.num_heads
        scores = torch.einsum(
            "bxhtd,bhsd->bxhts",
            q.view((kv_bsz, -1, heads) + q.size()[1:]),
            k.view((kv_bsz, heads) + k.size()[1:]),
        )
        return scores.reshape((-1,) + scores.size()[-2:])

    def weighted_values(self, probs: Tensor, v: Tensor, kv_bsz: int) -> Tensor:
        """P·V as (bsz*heads, tgt_len, head_dim), grouping hypotheses by sentence."""
        if probs.size(0) == v.size(0):
            return torch.bmm(probs, v)
        heads = self.num_heads
        out = torch.einsum(
            "bxhts,bhsd->bxhtd",
            probs.reshape((kv_bsz, -1, heads) + probs.shape[1:]),
            v.view((kv_bsz, heads) + v.shape[1:]),
        )
        return out.reshape(-1, probs.size(1), v.size(-1))

    def value_rows(self, bsz: int, kv_bsz: int, device) -> Tensor:
        """Row of K/V (kv_bsz*heads rows) for each query row (bsz*heads rows):
        the hypotheses of a beam share their sentence's rows when
        encoder-decoder attention keeps one copy per sentence."""
        rows = torch.arange(bsz * self.num_heads, device=device)
        if kv_bsz == bsz:
            return rows
        beam = bsz // kv_bsz
        return (rows // (beam * self.num_heads)) * self.num_heads + rows % self.num_heads

    def mask_scores(
        self,
        scores: Tensor,
        attn_mask: Optional[Tensor],
        key_padding_mask: Optional[Tensor],
        kv_bsz: int,
    ) -> Tensor:
        """Add the additive ``attn_mask`` and set padded keys to -inf."""
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(attn_mask.unsqueeze(0), float("-inf"))
            else:
                scores = scores + attn_mask.unsqueeze(0)
        if key_padding_mask is not None:
            tgt_len, src_len = scores.shape[-2:]
            scores = scores.view(kv_bsz, -1, self.num_heads, tgt_len, src_len)
            scores = scores.masked_fill(
                key_padding_mask[:, None, None, None, :], float("-inf")
            )
            scores = scores.view(-1, tgt_len, src_len)
        return scores

    def merge_heads(self, attn: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """(bsz*heads, tgt_len, head_dim) -> out_proj((tgt_len, bsz, embed_dim))."""
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim)
        return self.out_proj(attn)

    def format_weights(
        self, weights: Tensor, bsz: int, need_head_weights: bool
    ) -> Tensor:
        """fairseq's layout for returned weights: (heads, bsz, T, S) or head mean."""
        tgt_len, src_len = weights.shape[-2:]
        weights = weights.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)
        return weights if need_head_weights else weights.mean(dim=0)

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        for param_name, param in self.named_parameters():
            if (param_name.startswith(self.new_parameter_prefixes)
                    and prefix + param_name not in state_dict):
                state_dict[prefix + param_name] = param.detach().clone()
