"""float32 Linear layers on oneDNN's prepacked kernels while the plugin's
search decodes on a CPU.

PyTorch's ``nn.Linear`` multiplies with MKL's sgemm on a weight laid out as
trained, after copying its bias into the output. oneDNN's Linear
(``torch.ops.mkldnn._linear_pointwise``, what inductor's CPU freezing calls)
multiplies with a weight reordered once into its kernel's blocked layout and
adds the bias in the same pass. One thread, AMD EPYC (Zen 4), against
``nn.Linear`` (``research/linear_engines.py`` measures a CPU): 1.20x and
1.38x at the output projection to a 10k vocabulary (the small preset's 128
and Base's 512 features), 1.07x-1.20x at Base's layers, 0.93x-1.05x at the
small preset's 128 x 128 and 128 x 256, 1.03x at 256 x 256. So weights of at
least ``MIN_PACKED_WEIGHT`` elements pack.

Only inside the search (``packed_linears`` around a decoding call): the
model is unchanged outside it, and fairseq's generator, training and every
other forward keep ``nn.Linear``. The outputs equal ``nn.Linear``'s to
float32 rounding (the sums run in the kernel's order).

Inside it every float32 Linear also gives a row the same bits whatever rows
share its call and however many threads run it, so that a sentence's
hypotheses and scores do not depend on the sentences decoded beside it (the
workers share a large batch out: ``workers``). Both libraries take another
path for a few rows (a matrix-vector product; MKL's small-matrix kernel up
to 15 rows), and MKL splits the inner dimension over threads beyond 512
features: a call with fewer than ``ROWS_ALIKE`` rows runs on zero rows
added up to that many, and layers of more than 512 input features pack
whatever their size (oneDNN's rows are alike from 2 rows on at any shape;
tests/test_packed_linear.py)."""

import contextlib
import threading
from typing import Set

import torch
from torch import nn

from .int8 import keep_large_blocks_in_the_heap

# a weight packs from 256 x 256 elements: below it (the small preset's layers)
# oneDNN's call costs what its kernel saves
MIN_PACKED_WEIGHT = 256 * 256
# MKL's sgemm rounds a row alike at any row count and thread count up to this
# many input features (from ROWS_ALIKE rows on); a layer with more packs
MKL_ROWS_ALIKE_FEATURES = 512
ROWS_ALIKE = 16


def onednn_linear_available() -> bool:
    """Whether this PyTorch build has oneDNN's prepacked float32 Linear."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


def float32_linear(layer: nn.Module) -> bool:
    """A plain float32 Linear on the CPU (no forward of its own)."""
    return (type(layer) is nn.Linear and layer.weight.device.type == "cpu"
            and layer.weight.dtype == torch.float32 and "forward" not in vars(layer))


def packable(layer: nn.Module) -> bool:
    """A float32 Linear large enough to gain from packing, or too wide for
    MKL to round a row alike whatever rows share its call."""
    return float32_linear(layer) and (layer.weight.numel() >= MIN_PACKED_WEIGHT
                                      or layer.in_features > MKL_ROWS_ALIKE_FEATURES)


def rows_alike(forward):
    """``forward`` on at least ``ROWS_ALIKE`` rows: fewer are topped up with
    zero rows, dropped from the output."""
    def call(x):
        features = x.size(-1)
        rows = x.numel() // features if features else 0
        if not 0 < rows < ROWS_ALIKE:
            return forward(x)
        padded = torch.cat([x.reshape(rows, features), x.new_zeros(ROWS_ALIKE - rows, features)])
        return forward(padded)[:rows].reshape(*x.shape[:-1], -1)
    return call


def packed_forward(layer: nn.Linear):
    """``layer``'s forward on oneDNN's kernel, over a copy of its weight
    packed now (later changes to the weight are not seen)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach())
    bias = None if layer.bias is None else layer.bias.detach()
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def unpacked_forward(layer: nn.Linear):
    weight = layer.weight.detach()
    bias = None if layer.bias is None else layer.bias.detach()
    return lambda x: torch.nn.functional.linear(x, weight, bias)


_lock = threading.Lock()


@contextlib.contextmanager
def packed_linears(model: nn.Module):
    """Within the block, ``model``'s packable Linear layers run on oneDNN's
    prepacked kernel and every float32 Linear on at least ``ROWS_ALIKE``
    rows; yields the set of the packed layers (none without oneDNN, and
    then nothing changes).
    The weights are packed when the first block on ``model`` opens: an
    optimizer that updates them through ``.data`` (fairseq's Adam) leaves
    their version as it was, so a copy kept from an earlier call could be
    stale (``--eval-bleu``'s generator lives through training). Blocks that
    overlap (searches in several threads, worker processes forked in one)
    share one packing, restored when the last closes: each decodes with the
    same weights from start to end. At Base dims packing every layer costs
    about 70 ms, 2% of decoding a batch of 32 sentences of 30 tokens."""
    with _lock:
        entry = model.__dict__.get("_packed_linears")  # [packed layers, all changed, open blocks]
        if entry is None:
            packed: Set[nn.Module] = set()
            others = []
            if onednn_linear_available():
                packed = {m for m in model.modules() if packable(m)}
                others = [m for m in model.modules() if float32_linear(m) and m not in packed]
            if packed:
                # each step's outputs are fresh tensors (the output projection's 10 MB
                # at the small preset): keep such blocks in the heap, not re-faulted
                keep_large_blocks_in_the_heap()
            for layer in packed:
                layer.forward = rows_alike(packed_forward(layer))
            for layer in others:
                layer.forward = rows_alike(unpacked_forward(layer))
            entry = model.__dict__["_packed_linears"] = [packed, [*packed, *others], 0]
        entry[2] += 1
    try:
        yield entry[0]
    finally:
        with _lock:
            entry[2] -= 1
            if entry[2] == 0:
                for layer in entry[1]:
                    vars(layer).pop("forward", None)
                model.__dict__.pop("_packed_linears", None)
