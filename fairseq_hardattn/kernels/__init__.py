"""The native library for CPUs: C kernels declared in one header
(``native.h``) and a Python module around them (``bindings.cpp``; the
native search, ``search.cpp``), built as one PyTorch C++ extension
(``build``): flexible attention's band (``flexible_band.c``), the search's
candidates and read-back (``beam_candidates.c``), attention steps over keys
read in place: the encoder's, and lineage caches (``step_attention.c``), a
decoder layer's sublayers and a step's layers as one call, its products
through PyTorch's own BLAS (``decoder_sublayers.c``), PyTorch's LayerNorm
operation for operation (``layer_norm.c``), sampling's generators, PyTorch's
bit for bit (``sentence_draws.c``), int8 Linear layers (``int8_linear.c``).

The module checks every tensor it is given and releases the GIL while a
kernel runs. Kernels split their rows over torch's intra-op threads with
OpenMP (``parallel_rows.h``). Where the library cannot be built (no
compiler, a failed build) the callers fall back to their PyTorch ops, after
one warning; ``FAIRSEQ_HARDATTN_KERNELS=0`` turns it off. The functions
here are the callers' side: tensors in, tensors out, the header's
constants read from the module (``attention_mode``, ``step_max_k``).
"""

import logging
import os
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from . import build as _build

logger = logging.getLogger(__name__)

_state: Dict[str, object] = {}


def enabled() -> bool:
    return os.environ.get("FAIRSEQ_HARDATTN_KERNELS", "1") != "0"


def native():
    """The native module, or None (turned off, or it could not be built:
    warned once per process). A cached library that does not load
    (truncated, damaged) is built again, in this process's own directory."""
    if not enabled():
        return None
    if "module" not in _state:
        try:
            try:
                _state["module"] = _build.load_module(_build.build())
            except ImportError as error:
                logger.warning("fairseq-hardattn: the cached native kernels do not load (%s); building them again",
                               error)
                _state["module"] = _build.load_module(_build.build(cached=False))
        except (RuntimeError, OSError, ImportError) as error:
            logger.warning("fairseq-hardattn: the native kernels are unavailable (%s); using PyTorch ops instead "
                           "(slower decoding)", error)
            _state["module"] = None
    return _state["module"]


def available() -> bool:
    """Whether the native kernels run here."""
    return native() is not None


def attention_mode(name: str) -> int:
    """The header's constant of an attention class's kernel mode (``soft``, ``hard``, ``topk``, ``local``)."""
    return native().ATTENTION_MODES[name]


def step_max_k() -> int:
    """The most keys top-k attention's step kernel keeps (0 without the library)."""
    module = native()
    return 0 if module is None else module.STEP_MAX_K


# --- flexible attention's band -------------------------------------------------------


def can_run_flexible_band(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether ``flexible_band_step`` applies: CPU float32 tensors, the
    batch-major caches contiguous, no gradient needed."""
    return (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32
            and k.is_contiguous() and v.is_contiguous() and not torch.is_grad_enabled() and available())


def flexible_band_step(q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor],
                       centre: Tensor, gate: Tensor, beam: int, heads: int, scaling: float,
                       sigma: float, threshold: float) -> Tuple[Tensor, Tensor, Tensor]:
    """One banded step (see flexible_band.c): q (rows, head_dim) unscaled;
    k, v (kv_bsz*heads, src_len, head_dim) contiguous; padding (kv_bsz,
    src_len) bool or None; centre and gate (rows,). Returns the output
    (rows, head_dim), the new centres (rows,) and the band sizes (rows,)."""
    rows, head_dim = q.shape
    q = q.contiguous()
    centre = centre.float().contiguous()
    out, new_centre = q.new_empty(rows, head_dim), centre.new_empty(rows)
    scored = torch.empty(rows, dtype=torch.int64)
    native().flexible_band_step(q=q, k=k, v=v, padding=padding, centre=centre, gate=gate.float().contiguous(),
                                beam=beam, heads=heads, scaling=scaling, sigma=sigma, two_tau=2.0 * threshold,
                                penalty_coef=-0.5 / sigma ** 2, out=out, new_centre=new_centre, scored=scored)
    return out, new_centre, scored


# --- the search's passes over the vocabulary -------------------------------------------


def can_run_beam_candidates(logits: Tensor) -> bool:
    """Whether ``beam_candidates`` applies: CPU float32 logits whose rows are
    contiguous, no gradient needed."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.stride(1) == 1 and not torch.is_grad_enabled() and available())


def beam_candidates(logits: Tensor, special_columns: Tensor, special_adds: Tensor, k: int,
                    out: Optional[Tuple[Tensor, Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(see beam_candidates.c) logits (rows, vocab) float32; special_columns
    (S,) int64 and special_adds (S,) float32 (NaN: never chosen). Returns the
    best ``k`` adjusted values and their tokens (rows, k), descending, and
    each row's log-normaliser of the raw logits (rows, 1); into ``out``
    (three such tensors, contiguous) where given."""
    rows = logits.size(0)
    if out is None:
        out = logits.new_empty(rows, k), torch.empty(rows, k, dtype=torch.int64), logits.new_empty(rows, 1)
    native().beam_candidates(logits, special_columns, special_adds, k, *out)
    return out


def read_back(step_tokens: Tensor, step_scores: Tensor, step_parents: Tensor, rows: Tensor, step: int,
              tokens: Tensor, scores: Tensor) -> bool:
    """(see beam_candidates.c) positions 0..step-1 of ``tokens`` (n, step + 1)
    int64 and of ``scores`` (n, step + 1) float32, the latter's position
    ``step`` already the final score, for the hypotheses continuing ``rows``
    (n,) int64; False where the kernel does not apply (not CPU, float32 and
    contiguous, or no library) and nothing was written."""
    buffers = (step_tokens, step_scores, step_parents, rows, tokens, scores)
    if (any(b.device.type != "cpu" or not b.is_contiguous() for b in buffers)
            or step_scores.dtype != torch.float32 or scores.dtype != torch.float32 or not available()):
        return False
    native().read_back(step_tokens, step_scores, step_parents, rows, step, tokens, scores)
    return True


def can_run_ensemble_log_probs(logits) -> bool:
    """Whether ``ensemble_log_probs`` applies to these models' logits."""
    return all(can_run_beam_candidates(x) for x in logits) and len({x.shape for x in logits}) == 1


def ensemble_log_probs(logits) -> Tensor:
    """(see beam_candidates.c) fairseq's EnsembleModel's log-probabilities of
    the models' float32 logits, each (rows, vocab) with contiguous rows: the
    log of the mean of their probabilities, (rows, vocab)."""
    out = logits[0].new_empty(logits[0].shape)
    native().ensemble_log_probs(list(logits), out)
    return out


# --- sampling's generators -------------------------------------------------------------


def sentence_generators(seeds) -> Optional[Tensor]:
    """(see sentence_draws.c) a generator's state per seed, (len(seeds),
    GENERATOR_STATE_WORDS) int32, seeded as ``torch.Generator().manual_seed``
    seeds one; None without the library."""
    module = native()
    return None if module is None else module.sentence_generators([int(seed) & 0xFFFFFFFF for seed in seeds])


def exponential_draws(states: Tensor, out: Tensor):
    """Row i of ``out`` (n rows; float32 or float64, contiguous) filled as
    ``out[i].exponential_(generator=i's)`` fills it, from the states of
    ``sentence_generators`` (n, contiguous), which move on."""
    native().exponential_draws(states, out)


# --- attention steps -------------------------------------------------------------------


def source_part(keys: Tensor, keys_t: Optional[Tensor], values: Tensor, padding: Optional[Tensor], group: int,
                sentences: Optional[Tensor] = None):
    """An attention step's source part (see ``step_attention``)."""
    return native().Source(keys=keys, keys_t=keys_t, values=values, padding=padding, group=group,
                           sentences=sentences)


def step_attention(q: Tensor, scale: float, mode: str, k: int, out: Tensor, source=None,
                   lineage: Optional[Tuple[Tensor, Tensor, Tensor, int]] = None,
                   local: Optional[Tuple[Tensor, float, float]] = None):
    """(see step_attention.c) q, out (rows, heads, dim) contiguous float32;
    ``mode`` an attention class's kernel mode. ``source``: ``source_part``
    (keys and values (sentences, heads, src_len, dim), dim contiguous;
    keys_t the keys as ``transposed_keys`` lays them out; padding (sentences,
    src_len) bool or None; ``group`` hypotheses per sentence; ``sentences``
    (rows / group,) int64, the cached sentence each group reads, or None
    (group g reads sentence g)). ``lineage``: (keys, values, ancestors,
    length): keys and values (capacity, rows0, heads, dim) contiguous,
    ancestors (>= rows, >= length) int64; positions 0..length-1 are
    attended. One of the two at least. ``local`` (mode ``local``, source
    only): (centres (rows, heads) float32 contiguous, window, gaussian)."""
    keys = values = ancestors = None
    length = 0
    if lineage is not None:
        keys, values, ancestors, length = lineage
    centres, window, gaussian = local if local else (None, 0.0, 1.0)
    native().step_attention(q=q, out=out, mode=attention_mode(mode), scale=scale, k=k, source=source, keys=keys,
                            values=values, ancestors=ancestors, length=length, centres=centres, window=window,
                            gaussian=gaussian)


def step_attention_threads(rows: int, heads: int, dim: int, positions: int) -> int:
    """The threads ``step_attention`` splits such a step over (torch's
    intra-op threads where the step is large enough; 1 without OpenMP)."""
    return native().step_attention_threads(rows, heads, dim, positions)


def transposed_keys(keys: Tensor) -> Tensor:
    """Keys (sentences, heads, src_len, dim) as ``step_attention``'s source
    part reads them for soft and top-k attention: (sentences, heads, dim,
    src_len rounded up to the header's source block), contiguous, zeros
    beyond src_len."""
    sentences, heads, src_len, dim = keys.shape
    block = native().SOURCE_BLOCK
    out = keys.new_zeros(sentences, heads, dim, -(-src_len // block) * block)
    out[..., :src_len] = keys.transpose(2, 3)
    return out


# --- a decoder layer's sublayers and a step's layers -----------------------------------


def has_blas() -> bool:
    """Whether the sublayer kernels can run: the library, and PyTorch's BLAS exported."""
    module = native()
    return module is not None and module.has_blas()


def linear_product(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``F.linear(x, weight, bias)`` (x (rows, in), weight (out, in), float32,
    contiguous) as the sublayer kernels compute it."""
    return native().linear_product(x, (weight, bias))


def packed_linear(product, in_features: int, out_features: int):
    """A Linear layer on oneDNN's packed kernel (``decoding/packed_linear.py``'s
    ``PackedProduct``) as the native search takes it: its packed weight and bias."""
    return native().PackedLinear(packed=product.packed, bias=product.bias, in_features=in_features,
                                 out_features=out_features)


def int8_linear(weight: Tensor, bias: Optional[Tensor]):
    """An int8 Linear layer of ``weight`` (out, in) and ``bias`` float32
    (``int8_linear.c``), callable on x (..., in); None without the library."""
    module = native()
    return None if module is None else module.Int8Linear(weight.contiguous(), bias)


def int8_rows(layer, rows: Tensor):
    """The int8 layer of ``layer``'s output rows ``rows`` (int64): the same int8 values and scales."""
    return native().Int8Linear(layer, rows.to(torch.int64).contiguous())


def int8_quantize_rows(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Each row of x (rows, n) float32 as the int8 kernel quantizes it: (int8 values, scales)."""
    return native().int8_quantize_rows(x.contiguous())


def attention_sublayer(q, k, v, out, heads: int, head_dim: int, scale: float, mode: str, top_k: int):
    """An attention sublayer's Linear layers ((weight, bias) each, or
    ``packed_linear``'s; k and v None for cross-attention) and how it
    attends, as the kernels read them."""
    return native().Attention(q=q, k=k, v=v, out=out, heads=heads, head_dim=head_dim, scale=scale,
                              mode=attention_mode(mode), top_k=top_k)


def feed_forward(fc1, fc2):
    """A feed-forward sublayer's Linear layers (as ``attention_sublayer``'s), ReLU between."""
    return native().FeedForward(fc1=fc1, fc2=fc2)


def self_attention_sublayer(attention, x: Tensor, residual: Tensor, keys: Tensor, values: Tensor,
                            ancestors: Tensor, length: int) -> Tensor:
    """``residual`` + self-attention of ``x`` (both (rows, embed) contiguous
    float32) over the lineage caches ``keys``, ``values`` (capacity, rows0,
    heads, head_dim), this step's written at position ``length - 1``."""
    return native().self_attention_sublayer(attention, x, residual, keys, values, ancestors, length)


def cross_attention_sublayer(attention, x: Tensor, residual: Tensor, source) -> Tensor:
    """``residual`` + cross-attention of ``x`` over ``source`` (``source_part``)."""
    return native().cross_attention_sublayer(attention, x, residual, source)


def feed_forward_sublayer(layers, x: Tensor, residual: Tensor) -> Tensor:
    """``residual`` + fc2(relu(fc1(x))) (``layers``: ``feed_forward``'s)."""
    return native().feed_forward_sublayer(layers, x, residual)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, lanes: int, fused: bool) -> Tensor:
    """``F.layer_norm(x, (n,), weight, bias, eps)`` of x (rows, n) as
    ``layer_norm.c`` computes it with ``lanes`` and ``fused`` (see there);
    float32, contiguous."""
    return native().layer_norm(x, weight, bias, eps, (lanes, fused))


_norm_variants: Dict[tuple, Optional[Tuple[int, bool]]] = {}


def layer_norm_variant(n: int, eps: float) -> Optional[Tuple[int, bool]]:
    """(lanes, fused) with which ``layer_norm`` gives ``F.layer_norm``'s
    bits on rows of ``n`` here, or None (no library, or no pair does): tried
    once per process, row size and eps, on rows of different means and
    scales. Only rows of whole vectors at either width (``n`` a multiple of
    16): PyTorch's sums over a row's scalar tail are not repeated here bit
    for bit."""
    key = (n, eps)
    if key not in _norm_variants:
        _norm_variants[key] = None
        if n % 16 == 0 and available():
            generator = torch.Generator().manual_seed(0)  # (the process's own generator untouched)
            x = (torch.randn(64, n, generator=generator) * torch.rand(64, 1, generator=generator) * 10
                 + torch.randn(64, 1, generator=generator) * 10)
            weight, bias = torch.randn(n, generator=generator), torch.randn(n, generator=generator)
            expected = torch.nn.functional.layer_norm(x, (n,), weight, bias, eps)
            _norm_variants[key] = next(((lanes, fused) for lanes in (8, 16) for fused in (True, False)
                                        if torch.equal(layer_norm(x, weight, bias, eps, lanes, fused), expected)),
                                       None)
    return _norm_variants[key]


def decoder_layers(pre_norm: bool, norm_variant: Tuple[int, bool], last_norm, embed: int):
    """A decoder's layers as ``decoder_step`` reads them, filled with their
    ``add(self_attention=, cross_attention=, feed_forward=, self_norm=,
    cross_norm=, final_norm=)`` (norms (weight, bias, eps)); ``last_norm``
    the same, or None."""
    return native().DecoderLayers(pre_norm=pre_norm, norm_variant=norm_variant, last_norm=last_norm, embed=embed)


def decoder_step(layers, features: Tensor, caches, sources, ancestors: Tensor, length: int) -> Tensor:
    """The decoder's layers for one step (``decoder_sublayers.c``'s
    ``decoder_step``) of ``features`` (rows, embed), float32, contiguous:
    ``layers`` (``decoder_layers``); ``caches``: each layer's lineage keys and
    values (capacity, rows0, heads, head_dim); ``sources``: each layer's
    ``source_part``."""
    return native().decoder_step(layers, features, caches, sources, ancestors, length)
