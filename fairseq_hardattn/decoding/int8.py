"""int8 decoding on a CPU (``--int8-decoding``, a model option: at decoding
time ``--model-overrides "{'int8_decoding': True}"`` or the hub's
``int8_decoding=True``): every ``nn.Linear`` of the model (projections,
feed-forward layers, the output projection) becomes an ``Int8Linear``;
embeddings, norms and attention stay float32.

An ``Int8Linear`` quantizes its weight once, per output row, and each
product's input per row as it runs, both symmetric to [-127, 127]:
``y = (sum_k xq wq) * (sx * sw) + b``. The sums are of integers, exact in
any order, so a layer gives the same outputs on every CPU and thread count,
in the native library's kernel (``kernels/int8_linear.c``: AVX-512 VNNI or
AVX2, no per-call set-up, the product inside the native search's step) or,
where the library is not built, in PyTorch's ops (``int8_product``: the same
numbers, slower). Applied when fairseq's tools prepare the model for
decoding (``prepare_for_inference_``); a quantized model decodes only (it
neither trains nor saves)."""

import logging
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor, nn

from .. import kernels
from ..errors import ConfigError

logger = logging.getLogger(__name__)


def check_int8_decoding(model, cfg=None):
    """One line where int8 decoding cannot run: on a GPU, or with --fp16."""
    parameter = next(model.parameters(), None)
    if parameter is not None and parameter.is_cuda:
        raise ConfigError("--int8-decoding runs on the CPU (the plugin's int8 Linear kernels): decode "
                          "on the CPU, or on the GPU without it")
    if getattr(getattr(cfg, "common", None), "fp16", False):
        raise ConfigError("--int8-decoding and --fp16 exclude each other: choose one")


def quantize_rows(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Each row of x (rows, n) float32 as int8 and its scale, as
    ``int8_linear.c`` quantizes it: s = (its largest magnitude) / 127, xq =
    x / s rounded half to even; a row of zeros: s = 0; a row with an
    infinity or a NaN: zeros, s = NaN."""
    amax = x.abs().amax(dim=1)
    finite = torch.isfinite(x).all(dim=1)
    quantized = finite & (amax > 0)
    scales = amax / 127
    safe = torch.where(quantized, scales, torch.ones_like(scales))
    values = torch.where(quantized.unsqueeze(1), torch.round(x / safe.unsqueeze(1)), 0).to(torch.int8)
    return values, torch.where(finite, torch.where(amax > 0, scales, 0), float("nan"))


def int8_product(x: Tensor, weight: Tensor, scales: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The int8 layer of ``weight`` (out, in) int8 and ``scales`` (out,)
    (``quantize_rows``'s) on x (..., in) float32, in PyTorch's ops: the
    kernel's numbers (its integer sums are exact here in float64)."""
    rows = x.reshape(-1, x.size(-1)).float()
    values, row_scales = quantize_rows(rows)
    sums = (values.double() @ weight.double().t()).float()
    y = sums * (row_scales.unsqueeze(1) * scales.unsqueeze(0))
    if bias is not None:
        y = y + bias
    return y.view(*x.shape[:-1], weight.size(0))


class Int8Linear(nn.Module):
    """An ``nn.Linear`` for int8 decoding (the module's docstring): the same
    inputs and outputs, float32."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float().contiguous()
        self.bias_values = None if linear.bias is None else linear.bias.detach().float().clone()
        self.native = kernels.int8_linear(weight, self.bias_values)
        # without the library: the quantized weight, for PyTorch's ops
        self.values, self.scales = (None, None) if self.native is not None else quantize_rows(weight)

    def forward(self, x: Tensor) -> Tensor:
        if self.native is not None:
            return self.native(x)
        return int8_product(x, self.values, self.scales, self.bias_values)

    def rows(self, columns: Tensor) -> Callable[[Tensor], Tensor]:
        """The layer of the output rows ``columns`` (a shortlist's tokens):
        the same int8 weights, scales and products."""
        columns = columns.cpu()
        if self.native is not None:
            return kernels.int8_rows(self.native, columns)
        values, scales = self.values.index_select(0, columns), self.scales.index_select(0, columns)
        bias = None if self.bias_values is None else self.bias_values.index_select(0, columns)
        return lambda x: int8_product(x, values, scales, bias)

    def extra_repr(self) -> str:
        where = "the native kernel" if self.native is not None else "PyTorch's ops"
        return f"in_features={self.in_features}, out_features={self.out_features}, {where}"


def quantize_for_decoding(model):
    """``model`` with its Linear layers ``Int8Linear`` (in place, once)."""
    if getattr(model, "int8_quantized", False):
        return model
    check_int8_decoding(model)
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8Linear(child))
                replaced += 1
    model.int8_quantized = True
    how = "the native kernel" if kernels.available() else "PyTorch's ops (the native library is unavailable: slower)"
    logger.info("int8 decoding (--int8-decoding): %d Linear layers quantized (weights per row, activations per "
                "row at each product), multiplied by %s", replaced, how)
    return model
