"""float32 Linear layers on oneDNN's prepacked kernels while the plugin's
search decodes on a CPU.

PyTorch's ``nn.Linear`` multiplies with MKL's sgemm on a weight laid out as
trained, after copying its bias into the output. oneDNN's Linear
(``torch.ops.mkldnn._linear_pointwise``, what inductor's CPU freezing calls)
multiplies with a weight reordered once into its kernel's blocked layout and
adds the bias in the same pass. Against ``nn.Linear``
(``research/linear_engines.py`` measures a CPU; results/linear_engines.md)
it is faster at the output projection and Transformer Base's layers, and no
faster at the small preset's 128 x 128 and 128 x 256: so weights of at least
``MIN_PACKED_WEIGHT`` elements pack.

Only inside the search (``packed_linears`` around a decoding call): the
model is unchanged outside it, and fairseq's generator, training and every
other forward keep ``nn.Linear``. The outputs equal ``nn.Linear``'s to
float32 rounding (the sums run in the kernel's order). A model prepared for
decoding keeps its packed weights from one call to the next (``_kept``;
a second copy of those weights between calls too):
packing the output projection again was a part of every call, most felt
by calls of a few sentences."""

import contextlib
import threading
import weakref
from typing import Set

import torch
from torch import nn

from .heap import keep_large_blocks_in_the_heap
from .row_shapes import in_few_shapes

# a weight packs from 256 x 256 elements: below it (the small preset's layers)
# oneDNN's call costs what its kernel saves
MIN_PACKED_WEIGHT = 256 * 256


def onednn_linear_available() -> bool:
    """Whether this PyTorch build has oneDNN's prepacked float32 Linear."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


def packable_weight(weight: torch.Tensor) -> bool:
    """A float32 weight on the CPU, large enough to gain from packing."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.numel() >= MIN_PACKED_WEIGHT


def packable(layer: nn.Module) -> bool:
    """A plain float32 Linear on the CPU, large enough to gain from packing."""
    return type(layer) is nn.Linear and packable_weight(layer.weight) and "forward" not in vars(layer)


class PackedProduct:
    """``F.linear(x, weight, bias)`` on oneDNN's kernel, over a copy of
    ``weight`` packed now (``packed``; later changes to the weight are not
    seen), on rows padded to few shapes (``row_shapes``)."""

    def __init__(self, weight: torch.Tensor, bias=None):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        self.bias = None if bias is None else bias.detach()
        self._in_few_shapes = in_few_shapes(self.unpadded)

    def unpadded(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._in_few_shapes(x)


def packed_product(weight: torch.Tensor, bias=None) -> PackedProduct:
    return PackedProduct(weight, bias)


def packed_of(layer: nn.Module):
    """The ``PackedProduct`` ``layer`` runs on within ``packed_linears``, or None."""
    forward = vars(layer).get("forward")
    return forward if isinstance(forward, PackedProduct) else None


# a prepared model's packed forwards, by layer: (its weights, their marks, the forward)
_kept: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def packed_forward(layer: nn.Linear, keep: bool = False):
    """``layer``'s forward on oneDNN's kernel (``packed_product``); with
    ``keep``, the one packed for an earlier call while the weights are the
    same tensors with the same memory (a ``.data`` replaced is not) and
    versions (an in-place change, ``load_state_dict`` included, moves a
    version; a change through ``.data`` does not)."""
    if not keep:
        return packed_product(layer.weight, layer.bias)
    weights = [t for t in (layer.weight, layer.bias) if t is not None]
    marks = [(t.data_ptr(), t._version) for t in weights]
    kept = _kept.get(layer)
    if kept is None or kept[1] != marks or any(ref() is not t for ref, t in zip(kept[0], weights)):
        kept = _kept[layer] = ([weakref.ref(t) for t in weights], marks,
                               packed_product(layer.weight, layer.bias))
    return kept[2]


_lock = threading.Lock()
# a prepared model's Linear layers, listed once (fairseq's tools do not change its structure)
_linears: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()


def _linear_layers(model: nn.Module, keep: bool):
    if not keep:
        return [m for m in model.modules() if isinstance(m, nn.Linear)]
    if model not in _linears:
        _linears[model] = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return _linears[model]


@contextlib.contextmanager
def packed_linears(model: nn.Module):
    """Within the block, ``model``'s packable Linear layers run on oneDNN's
    prepacked kernel; yields the set of those layers (empty without oneDNN).
    The weights are packed when the first block on ``model`` opens: an
    optimizer that updates them through ``.data`` (fairseq's Adam) leaves
    their version as it was, so a copy kept from an earlier call could be
    stale (``--eval-bleu``'s generator lives through training). Only a
    model prepared for decoding (``prepared_for_inference``: fairseq's
    tools, whose weights are final, as its worker processes assume) keeps
    its packed weights for the next block, while each weight is the same
    tensor at the same version. Blocks that
    overlap (searches in several threads, worker processes forked in one)
    share one packing, restored when the last closes: each decodes with the
    same weights from start to end. Packing takes a small part of decoding a
    batch at Base dims."""
    with _lock:
        entry = model.__dict__.get("_packed_linears")  # [layers, open blocks]
        if entry is None:
            layers: Set[nn.Module] = set()
            keep = bool(getattr(model, "prepared_for_inference", False))
            if onednn_linear_available():
                layers = {m for m in _linear_layers(model, keep) if packable(m)}
            if layers:
                # each step's outputs are fresh tensors (the output projection's 10 MB
                # at the small preset): keep such blocks in the heap, not re-faulted
                keep_large_blocks_in_the_heap()
            for layer in layers:
                layer.forward = packed_forward(layer, keep)
            entry = model.__dict__["_packed_linears"] = [layers, 0]
        entry[1] += 1
    try:
        yield entry[0]
    finally:
        with _lock:
            entry[1] -= 1
            if entry[1] == 0:
                for layer in entry[0]:
                    vars(layer).pop("forward", None)
                model.__dict__.pop("_packed_linears", None)
