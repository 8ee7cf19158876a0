"""The decoder's step of the plugin's search on a CPU as direct calls.

A step through fairseq's ``TransformerDecoderLayer.forward`` and the
attention modules' ``forward`` passes through code for every use of them:
``nn.Module.__call__``'s hooks, the branches for training, alignment and
cross+self attention, the cache's generic bookkeeping. When few hypotheses
are left (the tail of every batch, one sentence at a time) that costs more
than the step's arithmetic at the small preset's dims. Here a step is the
same operations on the same parameters and caches, called directly: the
Linear layers' own products (float32, oneDNN's packed, int8 or bfloat16),
``F.layer_norm``, the layer's activation, and the lineage's attention steps
(``lineage.Lineage``), which are the kernel calls the modules make.

Where a sublayer's Linear layers are plain float32 ones (the small
preset's; larger ones run on oneDNN's packed kernels, int8 or bfloat16)
and its activation ReLU, the whole sublayer (its products, the attention
kernel, the residual sum) is one kernel call (``kernels/decoder_sublayers.c``):
the BLAS calls PyTorch's Linear makes, through PyTorch's own BLAS, and the
same attention kernel, so the same bits, checked once per weight shape in
the process (``_gives_torchs_bits``); the layer norms stay PyTorch's. A
step of one hypothesis then makes a dozen calls where it made a hundred.
Where every sublayer is so and every layer norm's rows ``layer_norm.c``
computes with PyTorch's bits (``kernels.layer_norm_variant``), the layers
and the norms between them are one call (``kernels.decoder_step``,
``_NativeLayers``): the same operations, so the same bits again.

It runs steps after the first of a decoder whose every layer is fairseq's
``TransformerDecoderLayerBase`` as built (its ``forward`` not overridden,
none of its optional parts: head scaling, the attention and feed-forward
norms, residual weights, cross+self attention) with self- and cross-attention
the lineage's kinds (soft, hard, top-k), and no forward hooks. The first step, which projects the
encoder's keys and values into the caches, and any other decoder, take the
modules' path (``supports`` says why not). The outputs are the modules'
path's, bit for bit (the same operations on the same tensors, in the same
order): ``tests/unit/test_direct_step.py`` compares both.
"""

from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

from .. import kernels
from . import packed_linear
from .int8 import Int8Linear
from ..models.attention_kind_base import AttentionKindDecoder
from ..modules import decoding_step
from ..modules.cached_projection import CachedProjectionAttention

_OPTIONAL_PARTS = ("c_attn", "attn_ln", "ffn_layernorm", "w_resid")


def supports(decoder, modules=None) -> Optional[str]:
    """None where ``decoder``'s steps can run here; else what keeps them on
    the modules' path (``modules``: its modules, where the caller has them listed)."""
    kind = type(decoder)
    if (kind.forward is not AttentionKindDecoder.forward
            or kind.extract_features is not AttentionKindDecoder.extract_features
            or kind.extract_features_scriptable is not TransformerDecoderBase.extract_features_scriptable):
        return f"{kind.__name__} steps its own way"
    if decoder.quant_noise is not None or decoder.cross_self_attention:
        return "quant-noise or cross+self attention"
    if has_hooks(decoder.modules() if modules is None else modules):  # (direct calls would skip them)
        return "forward hooks on the decoder's modules"
    norms = [decoder.layernorm_embedding, decoder.layer_norm]
    for layer in decoder.layers:
        if type(layer).forward is not TransformerDecoderLayerBase.forward:
            return f"{type(layer).__name__} steps its own way"
        if any(getattr(layer, part, None) is not None for part in _OPTIONAL_PARTS) \
                or layer.cross_self_attention or layer.encoder_attn is None:
            return "a layer with optional parts or without cross-attention"
        for attention in (layer.self_attn, layer.encoder_attn):
            if not (isinstance(attention, CachedProjectionAttention) and type(attention).native_step):
                return f"{type(attention).__name__} attention"
        norms += [layer.self_attn_layer_norm, layer.encoder_attn_layer_norm, layer.final_layer_norm]
    if any(norm is not None and type(norm) is not nn.LayerNorm for norm in norms):
        return "a norm other than nn.LayerNorm"
    return None


def has_hooks(modules) -> bool:
    """Forward hooks on any of ``modules``, or global ones (direct calls would skip them)."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def _product(layer: Optional[nn.Module]) -> Optional[Callable[[Tensor], Tensor]]:
    """The layer's product on 2-D features, without ``nn.Module.__call__``:
    a plain Linear's ``F.linear``; otherwise the forward it has (oneDNN's
    packed one, set on the instance; int8's; bfloat16's)."""
    if layer is None:
        return None
    if type(layer) is nn.Linear and "forward" not in vars(layer):
        weight, bias = layer.weight, layer.bias
        return lambda x: F.linear(x, weight, bias)
    return layer.forward


def _norm(norm: Optional[nn.LayerNorm]) -> Optional[Callable[[Tensor], Tensor]]:
    if norm is None:
        return None
    shape, weight, bias, eps = norm.normalized_shape, norm.weight, norm.bias, norm.eps
    return lambda x: F.layer_norm(x, shape, weight, bias, eps)


_linear_bits: Dict[tuple, bool] = {}


def _gives_torchs_bits(weight: Tensor) -> bool:
    """Whether the sublayer kernels' products of a weight of this shape give
    ``F.linear``'s bits here (the BLAS PyTorch calls, called as it calls it):
    tried once per shape, thread count and matmul precision, on rows from 1."""
    key = (tuple(weight.shape), torch.get_num_threads(), torch.get_float32_matmul_precision())
    if key not in _linear_bits:
        generator = torch.Generator().manual_seed(0)  # (the process's own generator untouched)
        out, inputs = weight.shape
        w, b = torch.randn(out, inputs, generator=generator), torch.randn(out, generator=generator)
        _linear_bits[key] = all(
            torch.equal(kernels.linear_product(x, w, b), F.linear(x, w, b))
            for x in (torch.randn(rows, inputs, generator=generator) for rows in (1, 2, 3, 8, 13, 64, 130)))
    return _linear_bits[key]


def _plain_weights(*linears) -> Optional[list]:
    """The (weight, bias) of each of ``linears`` where each is a plain
    float32 Linear with a bias on the CPU (not packed, int8 or bfloat16;
    without a bias PyTorch multiplies another way) whose products the
    kernels compute with PyTorch's bits; else None."""
    for linear in linears:
        if (type(linear) is not nn.Linear or "forward" in vars(linear) or linear.weight.dtype != torch.float32
                or linear.weight.device.type != "cpu" or not linear.weight.is_contiguous()
                or linear.bias is None or not linear.bias.is_contiguous()
                or not _gives_torchs_bits(linear.weight)):
            return None
    # (the parameters themselves: PyTorch's products of a tensor that requires a
    # gradient may take another path, even where no gradient is recorded)
    return [(linear.weight, linear.bias) for linear in linears]


def _specs(packed: bool, *linears) -> Optional[list]:
    """``linears`` as the kernels take them: plain float32 ones
    (``_plain_weights``), int8 ones (``int8``'s kernel), and with
    ``packed`` those on oneDNN's packed kernel (``packed_linear``: the
    native search pads their rows); else None."""
    found = []
    for linear in linears:
        if isinstance(linear, Int8Linear) and linear.native is not None:
            found.append(linear.native)
            continue
        product = packed_linear.packed_of(linear) if packed else None
        spec = (kernels.packed_linear(product, linear.in_features, linear.out_features) if product is not None
                else _plain_weights(linear))
        if spec is None:
            return None
        found.append(spec if product is not None else spec[0])
    return found


def _native_attention(module, self_attention: bool, packed: bool = False):
    """``module``'s sublayer as the kernels read it (its projections and how
    its class attends), or None where a projection is not the kernels'."""
    if self_attention:
        weights = _specs(packed, module.q_proj, module.k_proj, module.v_proj, module.out_proj)
    else:
        weights = _specs(packed, module.q_proj, module.out_proj)
        weights = weights and [weights[0], None, None, weights[1]]
    if weights is None:
        return None
    return kernels.attention_sublayer(*weights, heads=module.num_heads, head_dim=module.head_dim,
                                      scale=module.scaling, mode=module.kernel_mode, top_k=module.kernel_keys)


class _Layer:
    """One layer's parts, bound once per decoding call: each sublayer's
    products as the layers' own calls, and where their Linear layers allow,
    the whole sublayer as one kernel call (``native_*``)."""

    def __init__(self, layer, native: bool, packed: bool = False):
        self.self_attn, self.encoder_attn = layer.self_attn, layer.encoder_attn
        self.q, self.k, self.v, self.self_out = (_product(getattr(layer.self_attn, name)) for name in
                                                 ("q_proj", "k_proj", "v_proj", "out_proj"))
        self.cross_q, self.cross_out = _product(layer.encoder_attn.q_proj), _product(layer.encoder_attn.out_proj)
        self.fc1, self.fc2 = _product(layer.fc1), _product(layer.fc2)
        self.activation = layer.activation_fn
        self.self_norm, self.cross_norm, self.final_norm = (
            _norm(layer.self_attn_layer_norm), _norm(layer.encoder_attn_layer_norm), _norm(layer.final_layer_norm))
        self.pre_norm = layer.normalize_before
        self.native_self = _native_attention(layer.self_attn, True, packed) if native else None
        self.native_cross = _native_attention(layer.encoder_attn, False, packed) if native else None
        feed_forward = _specs(packed, layer.fc1, layer.fc2) if native and layer.activation_fn is F.relu else None
        self.native_feed_forward = None if feed_forward is None else kernels.feed_forward(*feed_forward)


class _NativeLayers:
    """The decoder's layers (and its last norm) for one step as one kernel
    call, ``kernels.decoder_step``: each layer's weights, sizes and norms
    read once per decoding call, its caches each step."""

    def __init__(self, layers: List[_Layer], modules, last_norm: Optional[nn.LayerNorm], variant, embed: int):
        self.layers = layers
        self.native = kernels.decoder_layers(layers[0].pre_norm, variant, _norm_weights(last_norm), embed)
        for layer, module in zip(layers, modules):
            self.native.add(self_attention=layer.native_self, cross_attention=layer.native_cross,
                            feed_forward=layer.native_feed_forward,
                            self_norm=_norm_weights(module.self_attn_layer_norm),
                            cross_norm=_norm_weights(module.encoder_attn_layer_norm),
                            final_norm=_norm_weights(module.final_layer_norm))

    @classmethod
    def of(cls, decoder, layers: List[_Layer]) -> Optional["_NativeLayers"]:
        """The layers as one call, or None where a part is not a kernel's."""
        if any(layer.native_self is None or layer.native_cross is None or layer.native_feed_forward is None
               or layer.pre_norm != layers[0].pre_norm for layer in layers):
            return None
        norms = [norm for module in decoder.layers
                 for norm in (module.self_attn_layer_norm, module.encoder_attn_layer_norm, module.final_layer_norm)]
        if decoder.layer_norm is not None:
            norms.append(decoder.layer_norm)
        embed = decoder.layers[0].embed_dim
        variants = {kernels.layer_norm_variant(embed, norm.eps) if _native_norm(norm, embed) else None
                    for norm in norms}
        if len(variants) != 1 or None in variants:
            return None
        return cls(layers, decoder.layers, decoder.layer_norm, variants.pop(), embed)

    def __call__(self, x: Tensor, incremental_state, lineage) -> Optional[Tensor]:
        """The layers' output of ``x`` (rows, embed_dim) and the last norm;
        None before the self-attention caches exist."""
        caches, sources = [], []
        rows = x.size(0)
        for layer in self.layers:
            saved_state = layer.self_attn._get_input_buffer(incremental_state)
            keys = saved_state.get("lineage_keys")
            if keys is None:
                return None
            caches.append((keys, saved_state["lineage_values"]))
            cross_state = layer.encoder_attn._get_input_buffer(incremental_state)
            sources.append(lineage.cached_source(cross_state, _source_padding(cross_state), rows))
        return kernels.decoder_step(self.native, x.contiguous(), caches, sources, lineage.ancestors, lineage.length)


def native_layers(decoder) -> Optional[_NativeLayers]:
    """The layers of ``decoder`` (``supports`` it) as the native search
    reads them (oneDNN's packed Linear layers among them), or None where a
    part is not a kernel's here."""
    if not kernels.has_blas():
        return None
    return _NativeLayers.of(decoder, [_Layer(layer, True, packed=True) for layer in decoder.layers])


def linear_spec(linear: nn.Module):
    """``linear`` as the native search takes it (plain float32 or packed), or None."""
    found = _specs(True, linear)
    return None if found is None else found[0]


def _norm_weights(norm: Optional[nn.LayerNorm]):
    return None if norm is None else (norm.weight, norm.bias, norm.eps)


def _native_norm(norm, embed: int) -> bool:
    """An nn.LayerNorm over the last dim of ``embed`` features with a float32 weight and bias on the CPU."""
    return (type(norm) is nn.LayerNorm and tuple(norm.normalized_shape) == (embed,) and norm.weight is not None
            and norm.bias is not None and all(t.dtype == torch.float32 and t.device.type == "cpu"
                                              and t.is_contiguous() for t in (norm.weight, norm.bias)))


class DirectStep:
    """A decoding call's steps of ``decoder`` (``supports`` it) after its
    first: features (rows, embed_dim) of each hypothesis's last token."""

    def __init__(self, decoder, capacity: int):
        self.decoder, self.capacity = decoder, capacity  # (the call's steps at most)
        native = kernels.has_blas()
        self.layers: List[_Layer] = [_Layer(layer, native) for layer in decoder.layers]
        self.native = _NativeLayers.of(decoder, self.layers) if native else None
        self.project_in, self.project_out = _product(decoder.project_in_dim), _product(decoder.project_out_dim)
        self.embedding_norm, self.last_norm = _norm(decoder.layernorm_embedding), _norm(decoder.layer_norm)
        self.positions: Optional[Tensor] = None  # of every step up to its length (_position)

    def _position(self, step: int, prefix: Tensor) -> Optional[Tensor]:
        """The position embedding of step ``step`` (embed_dim,): the decoder's
        positions of a whole prefix of the call's length, computed once (the
        table rows an incremental step reads)."""
        embed_positions = self.decoder.embed_positions
        if embed_positions is None:
            return None
        if self.positions is None or step >= self.positions.size(0):
            tokens = prefix.new_full((1, max(self.capacity, step + 1)), self.decoder.padding_idx + 1)
            self.positions = embed_positions(tokens)[0]
        return self.positions[step]

    def usable(self, incremental_state, lineage) -> bool:
        """Whether this step can run now: the caches of the first step made,
        and every attention module on the lineage's kernel."""
        if lineage is None or decoding_step.fixed_shape(incremental_state) is not None:
            return False
        probe = self.decoder.embed_tokens.weight
        for layer in self.layers:
            if ("prev_key" not in layer.encoder_attn._get_input_buffer(incremental_state)
                    or not lineage.usable(layer.self_attn, probe) or not lineage.usable(layer.encoder_attn, probe)):
                return False
        return True

    def __call__(self, prefix: Tensor, encoder_out, incremental_state) -> Tensor:
        """``decoder(prefix, encoder_out, incremental_state, features_only=True)[0][:, -1]``."""
        decoder = self.decoder
        decoding_step.start_step(incremental_state, encoder_out)
        lineage = decoding_step.lineage(incremental_state)
        x = decoder.embed_scale * decoder.embed_tokens(prefix[:, -1])
        positions = self._position(prefix.size(1) - 1, prefix)
        if self.project_in is not None:
            x = self.project_in(x)
        if positions is not None:
            x += positions
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        layers_out = None if self.native is None else self.native(x, incremental_state, lineage)
        if layers_out is not None:
            x = layers_out
        else:
            rows = x.size(0)
            for layer in self.layers:
                x = _residual_block(layer.pre_norm, layer.self_norm, x, _self_attention, layer, rows,
                                    incremental_state, lineage)
                x = _residual_block(layer.pre_norm, layer.cross_norm, x, _cross_attention, layer, rows,
                                    incremental_state, lineage)
                x = _residual_block(layer.pre_norm, layer.final_norm, x, _feed_forward, layer)
            if self.last_norm is not None:
                x = self.last_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return x


def _residual_block(pre_norm: bool, norm, x: Tensor, body, *args) -> Tensor:
    """fairseq's sublayer: ``x + body(x)``, normalised before the body
    (pre-norm) or after the sum (post-norm); ``body(input, x, ...)`` returns
    the sum."""
    summed = body(norm(x) if pre_norm else x, x, *args)
    return summed if pre_norm else norm(summed)


def _self_attention(x: Tensor, residual: Tensor, layer: _Layer, rows: int, incremental_state, lineage) -> Tensor:
    module = layer.self_attn
    saved_state = module._get_input_buffer(incremental_state)
    if layer.native_self is not None:
        summed = lineage.self_attention_sublayer(saved_state, x, residual, layer.native_self)
        if summed is not None:
            return summed
    out = lineage.self_attention(module, saved_state, layer.q(x).view(rows * module.num_heads, 1, module.head_dim),
                                 layer.k(x), layer.v(x), rows)
    return residual + layer.self_out(out.view(rows, module.embed_dim))


def _cross_attention(x: Tensor, residual: Tensor, layer: _Layer, rows: int, incremental_state, lineage) -> Tensor:
    module = layer.encoder_attn
    saved_state = module._get_input_buffer(incremental_state)
    padding = _source_padding(saved_state)
    if layer.native_cross is not None:
        return lineage.source_attention_sublayer(saved_state, x, residual, padding, layer.native_cross)
    out = lineage.source_attention(module, saved_state,
                                   layer.cross_q(x).view(rows * module.num_heads, 1, module.head_dim), padding)
    return residual + layer.cross_out(out.view(rows, module.embed_dim))


def _feed_forward(x: Tensor, residual: Tensor, layer: _Layer) -> Tensor:
    if layer.native_feed_forward is not None:
        return kernels.feed_forward_sublayer(layer.native_feed_forward, x, residual)
    return residual + layer.fc2(layer.activation(layer.fc1(x)))


def _source_padding(saved_state) -> Optional[Tensor]:
    """Cross-attention's cached padding of the source positions, as bool (None: none padded)."""
    padding = saved_state.get("prev_key_padding_mask")
    return None if padding is None or padding.dim() == 0 else padding.to(torch.bool)
