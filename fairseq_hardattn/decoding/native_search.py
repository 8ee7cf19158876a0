"""The plugin's beam search as one native call per batch
(``kernels/search.cpp``): on a CPU, every step of one model's search (the
decoder's layers, the output projection, the candidates, the beams' update,
the finished hypotheses, the lineage's reorders) runs without returning to
Python, the GIL released. A step of the Python search is a few dozen
operator calls around the kernels, which cost more than the arithmetic
when few hypotheses are left: one sentence at a time, the tail of every
batch.

It runs beam search, and sampling with one sample a sentence (``--beam 1``,
top-k or every token: back-translation's), with one model whose decoder the direct step takes
(``direct_step``: fairseq's layers, attention kinds with a native step,
every norm ``layer_norm.c``'s, every Linear layer plain float32 or on
oneDNN's packed kernel) and whose output projection is oneDNN's packed
Linear or a plain one without a bias; not several samples a sentence, a
nucleus, an ensemble, a prefix, n-gram blocking or a shortlist (``why_not`` says what keeps a call on the Python
search; logged at debug). The same hypotheses and scores as the Python
search, bit for bit: the same operations on the same tensors.
"""

import logging
import weakref
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerEncoderBase
from fairseq.modules import MultiheadAttention
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor, nn

from .. import kernels
from ..modules.soft_attention import SoftAttention
from . import direct_step, engines, sampling
from .int8 import Int8Linear
from .packed_linear import onednn_linear_available, packable, packed_of
from .read_ahead import sentence_ids
from .row_shapes import padded_rows

logger = logging.getLogger(__name__)


def why_not(generator, models, src_tokens: Tensor, prefix_tokens: Optional[Tensor]) -> Optional[str]:
    """None where the native search may run this call of ``generator``
    (``PluginBeamSearch``; ``NativeModel.of`` checks the layers' parts);
    else what keeps it on the Python search."""
    if generator.sampling:
        if generator.beam_size != 1:
            return "sampling several samples a sentence (--beam above 1)"
        if generator.search.sampling_topp > 0:
            return "nucleus sampling (--sampling-topp)"
        if not sampling.kernel_draws_available():
            return "sampling without the native generators (their draws are not this PyTorch's)"
    if len(models) != 1:
        return "an ensemble"
    if prefix_tokens is not None:
        return "a prefix (--prefix-size)"
    if generator.repeat_ngram_blocker is not None:
        return "n-gram blocking (--no-repeat-ngram-size)"
    model = models[0]
    if getattr(model, "shortlist", None) is not None:
        return "a shortlist"
    if src_tokens.is_cuda:
        return "a GPU"
    decoder = model.decoder
    step = engines.step_of(getattr(decoder, "decoding_engine", "fairseq"), src_tokens)
    if step != engines.LINEAGE_STEP:
        return f"the {step} step"
    if not kernels.has_blas():
        return "no native library here (or PyTorch exports no BLAS)"
    if direct_step.has_hooks(_listed(model)[0]):  # (native calls would skip them)
        return "forward hooks on the model's modules"
    return None


def takes(model) -> bool:
    """Whether the native search takes ``model``'s parts (a call's options
    aside: ``why_not``) where it is now: its encoder and decoder."""
    decoder = model.decoder
    device = next(model.parameters()).device
    return (engines.step_of(getattr(decoder, "decoding_engine", "fairseq"), torch.empty(0, device=device))
            == engines.LINEAGE_STEP and getattr(model, "shortlist", None) is None and kernels.has_blas()
            and _structure_why_not(decoder) is None
            and _encoder_why_not(model.encoder) is None)


def _structure_why_not(decoder) -> Optional[str]:
    """None where the native search takes ``decoder``'s kinds of parts; else
    what it does not take."""
    reason = direct_step.supports(decoder)
    if reason is not None:
        return reason
    if any(part is not None for part in (decoder.project_in_dim, decoder.project_out_dim, decoder.layernorm_embedding,
                                         decoder.adaptive_softmax)):
        return "an embedding projection, norm or adaptive softmax"
    projection = decoder.output_projection
    if not (isinstance(projection, Int8Linear) or type(projection) is nn.Linear
            and projection.weight.dtype == torch.float32
            and (projection.bias is None or packable(projection) and onednn_linear_available())):
        return "an output projection that is not float32 or int8 (bfloat16), or has a bias"
    return None


class NativeModel:
    """One model as the native search reads it: its decoder's layers and
    norms (``direct_step``'s), its cross-attention's key and value
    projections, its embeddings and output projection, and its encoder's
    layers where ``_encoder_why_not`` takes them. Made within the call's
    ``packed_linears`` block (``packed_layers``: its layers on oneDNN's
    packed kernel)."""

    def __init__(self, model, layers, source_weights, packed_layers, block: int):
        decoder = model.decoder
        self.layers, self.source_weights = layers.native, source_weights
        self.embed_weight = decoder.embed_tokens.weight.detach()
        self.embed_scale = float(decoder.embed_scale)
        self.positions: Optional[Tensor] = None
        projection, made = decoder.output_projection, kernels.native().Projection
        if isinstance(projection, Int8Linear):
            self.projection = made(transposed=None, packed=None, int8=projection.native, block=block)
        elif projection in packed_layers and packed_of(projection) is not None:
            self.projection = made(transposed=None, packed=direct_step.linear_spec(projection), int8=None, block=block)
        else:
            transposed = projection.weight.detach().t().contiguous()
            self.projection = made(transposed=transposed, packed=None, int8=None, block=block)
        self.encoder = _NativeEncoder.of(model.encoder)
        self.projection_block = block

    @classmethod
    def of(cls, model, packed_layers, block: int):
        """(the ``NativeModel`` of ``model``, None), kept for its next calls
        as the module says; or (None, what of its decoder the native search
        does not take)."""
        made = kept(model, block) if getattr(model, "prepared_for_inference", False) else None
        if made is None:
            reason = _structure_why_not(model.decoder)
            if reason is not None:
                return None, reason
            layers = direct_step.native_layers(model.decoder)
            sources = [(direct_step.linear_spec(layer.encoder_attn.k_proj),
                        direct_step.linear_spec(layer.encoder_attn.v_proj)) for layer in model.decoder.layers]
            if layers is None or any(None in pair for pair in sources):
                return None, "a sublayer or norm the kernels do not compute with PyTorch's bits here"
            made = cls(model, layers, sources, packed_layers, block)
            if getattr(model, "prepared_for_inference", False):
                _models[model] = (_marks(model), made)
        return made, None

    def positions_for(self, decoder, capacity: int) -> Optional[Tensor]:
        """The position embedding of each step up to ``capacity`` (the
        decoder's positions of a whole prefix, the rows an incremental step
        reads), computed once for the longest call."""
        if decoder.embed_positions is None:
            return None
        if self.positions is None or self.positions.size(0) < capacity:
            tokens = torch.full((1, capacity), decoder.padding_idx + 1, dtype=torch.long)
            self.positions = decoder.embed_positions(tokens)[0].detach().contiguous()
        return self.positions

    def search(self, generator, model, sample: Dict[str, Dict[str, Tensor]],
               bos_token: Optional[int]) -> List[List[Dict[str, Tensor]]]:
        """``generator._search``'s hypotheses for ``sample``, each sentence's
        in the order found."""
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        bsz, src_len = src_tokens.size()[:2]
        max_len = min(int(generator.max_len_a * src_len + generator.max_len_b), generator.max_len - 1)
        assert generator.min_len <= max_len, "min_len cannot be larger than max_len, please adjust these!"
        padded = _padded_rows_table(max(bsz * generator.beam_size, self.projection_block, bsz * src_len))
        encoder_out = encode(model, self.encoder, net_input, padded)
        padding = encoder_out["encoder_padding_mask"]
        generators = None
        if generator.sampling:
            generators = kernels.sentence_generators(
                [sampling.sentence_seed(generator.seed, i) for i in sentence_ids(sample)])
        found = kernels.native().beam_search(
            decoder=self.layers, source_weights=self.source_weights, encoder_out=encoder_out["encoder_out"][0],
            encoder_padding=padding[0] if padding else None, embed_weight=self.embed_weight,
            embed_scale=self.embed_scale, positions=self.positions_for(model.decoder, max_len + 1),
            projection=self.projection, padded_rows=padded, beam=generator.beam_size, max_len=max_len,
            min_len=generator.min_len, bos=generator.eos if bos_token is None else bos_token, eos=generator.eos,
            pad=generator.pad, pad_column=generator.pad, unk=generator.unk, vocab=generator.vocab_size,
            unk_penalty=float(generator.unk_penalty), temperature=float(generator.temperature),
            len_penalty=float(generator.len_penalty), normalize_scores=bool(generator.normalize_scores),
            sampling=generator.sampling, topk=max(int(generator.search.sampling_topk), 0) if generator.sampling else 0,
            generators=generators)
        empty = torch.empty(0)
        return [[{"tokens": tokens, "score": score, "attention": empty, "alignment": empty,
                  "positional_scores": scores} for tokens, score, scores in hypotheses] for hypotheses in found]


# each prepared model's NativeModel: (its parameters' marks, it)
_models: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()
# a prepared model's modules and parameters, listed once
_lists: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _listed(model):
    """(the modules, the parameters) of ``model``: listed once for a model
    prepared for decoding, whose structure fairseq's tools do not change
    (walking a module tree is much of a sentence's Python time); else now."""
    if not getattr(model, "prepared_for_inference", False):
        return list(model.modules()), list(model.parameters())
    found = _lists.get(model)
    if found is None:
        found = _lists[model] = (list(model.modules()), list(model.parameters()))
    return found


def _marks(model) -> tuple:
    return tuple((p.data_ptr(), p._version) for p in _listed(model)[1])


def kept(model, block: int) -> Optional[NativeModel]:
    """A prepared model's ``NativeModel`` from an earlier call (its output
    projection ``block`` rows at a time), where its parameters are the same
    tensors at the same versions; else None."""
    found = _models.get(model)
    if found is None or found[1].projection_block != block or found[0] != _marks(model):
        return None
    return found[1]


class _NativeEncoder:
    """fairseq's encoder layers (and last norm) as one native call
    (``kernels/encoder.cpp``): the operators its Python calls, on the same
    tensors in the same order."""

    def __init__(self, encoder):
        self.layers = kernels.native().Encoder(pre_norm=encoder.layers[0].normalize_before,
                                               last_norm=_norm_weights(encoder.layer_norm))
        for layer in encoder.layers:
            attention = layer.self_attn
            self.layers.add(q=_weights(attention.q_proj), k=_weights(attention.k_proj), v=_weights(attention.v_proj),
                            out=_weights(attention.out_proj), fc1=direct_step.linear_spec(layer.fc1),
                            fc2=direct_step.linear_spec(layer.fc2), self_norm=_norm_weights(layer.self_attn_layer_norm),
                            final_norm=_norm_weights(layer.final_layer_norm), heads=attention.num_heads)

    @classmethod
    def of(cls, encoder) -> Optional["_NativeEncoder"]:
        return cls(encoder) if _encoder_why_not(encoder) is None else None


def _weights(linear: nn.Linear):
    # (the parameters themselves, as fairseq's calls take them: see direct_step._plain_weights)
    return linear.weight, linear.bias


def _norm_weights(norm: Optional[nn.LayerNorm]):
    return None if norm is None else (norm.weight, norm.bias, norm.eps)


def _encoder_why_not(encoder) -> Optional[str]:
    """None where ``_NativeEncoder`` computes ``encoder``'s layers; else why not."""
    kind = type(encoder)
    if (not isinstance(encoder, TransformerEncoderBase) or kind.forward is not TransformerEncoderBase.forward
            or kind.forward_scriptable is not TransformerEncoderBase.forward_scriptable
            or encoder.return_fc or not encoder.layers):
        return f"{kind.__name__} encodes its own way"
    if direct_step.has_hooks(encoder.modules()):
        return "forward hooks on the encoder's modules"
    for layer in encoder.layers:
        attention = layer.self_attn
        if (type(layer).forward is not TransformerEncoderLayerBase.forward or layer.return_fc
                or layer.activation_fn is not F.relu or layer.normalize_before != encoder.layers[0].normalize_before):
            return "an encoder layer of its own"
        projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj)
        if any(type(p) is not nn.Linear or p.weight.dtype != torch.float32 for p in projections):
            return "encoder attention projections that are not plain float32 (int8, bfloat16)"
        # fairseq's attention as it runs a whole sequence (torch's multi-head attention)
        if (type(attention) not in (MultiheadAttention, SoftAttention) or attention.onnx_trace
                or attention.skip_embed_dim_check or attention.use_xformers or attention.bias_k is not None
                or attention.add_zero_attn or attention.q_proj.bias is None):
            return f"{type(attention).__name__} encoder attention"
        if direct_step.linear_spec(layer.fc1) is None or direct_step.linear_spec(layer.fc2) is None:
            return "an encoder Linear layer that is not plain float32"
        for norm in (layer.self_attn_layer_norm, layer.final_layer_norm):
            if type(norm) is not nn.LayerNorm or norm.weight is None or norm.bias is None:
                return "an encoder norm other than nn.LayerNorm"
    if encoder.layer_norm is not None and (type(encoder.layer_norm) is not nn.LayerNorm
                                           or encoder.layer_norm.weight is None):
        return "an encoder norm other than nn.LayerNorm"
    return None


def encode(model, native: Optional[_NativeEncoder], net_input: Dict[str, Tensor],
           padded: List[int]) -> Dict[str, List[Tensor]]:
    """``model.encoder.forward_torchscript(net_input)``'s output and padding:
    fairseq's embedding, then the layers in one native call (``native``);
    fairseq's forward without one."""
    encoder = model.encoder
    if native is None:
        return encoder.forward_torchscript(net_input)
    src_tokens = net_input["src_tokens"]
    padding = src_tokens.eq(encoder.padding_idx)
    has_pads = padding.any()
    x, _ = encoder.forward_embedding(src_tokens)
    x = x * (1 - padding.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
    x = native.layers(x.transpose(0, 1), padding if has_pads else None, padded)
    return {"encoder_out": [x], "encoder_padding_mask": [padding]}


_padded: List[int] = []


def _padded_rows_table(rows: int) -> List[int]:
    """``padded_rows(r)`` for r in 0..rows."""
    while len(_padded) <= rows:
        _padded.append(padded_rows(len(_padded)))
    return _padded[:rows + 1]


