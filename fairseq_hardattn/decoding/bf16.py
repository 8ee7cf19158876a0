"""bfloat16 decoding on a CPU (``--model-overrides "{'bf16_decoding': True}"``,
the hub's ``bf16_decoding=True``): every ``nn.Linear`` of the model
multiplies in bfloat16 (weights stored bfloat16; inputs rounded to bfloat16,
products accumulated in float32 by oneDNN's kernels; outputs float32), the
rest (embeddings, norms, attention, the search) stays float32. CPUs with AMX
(Intel Xeon from Sapphire Rapids on) or AVX512-BF16 multiply bfloat16
matrices in hardware; elsewhere PyTorch would emulate them, slower than
float32, so the option is refused there in one line.
Applied when fairseq's tools prepare the model for decoding
(``prepare_for_inference_``); such a model decodes only."""

import logging

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .row_shapes import in_few_shapes

logger = logging.getLogger(__name__)


def cpu_bf16_feature() -> str:
    """The CPU's bfloat16 matrix unit ('AMX', 'AVX512-BF16'), or ''."""
    cpu = torch.cpu
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "AMX"
    if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "AVX512-BF16"
    return ""


def check_bf16_decoding(model, cfg=None):
    """One line where bfloat16 decoding cannot run: on a GPU, with --fp16 or
    int8, or on a CPU without AMX or AVX512-BF16."""
    parameter = next(model.parameters(), None)
    if parameter is not None and parameter.is_cuda:
        raise ConfigError("--bf16-decoding runs on the CPU; on a GPU, decode with --fp16 or --bf16")
    if getattr(getattr(cfg, "common", None), "fp16", False) or getattr(model.args, "int8_decoding", False):
        raise ConfigError("--bf16-decoding excludes --fp16 and int8_decoding: choose one")
    if not cpu_bf16_feature():
        raise ConfigError("--bf16-decoding needs a CPU with AMX or AVX512-BF16 (bfloat16 matrix "
                          "instructions); this CPU has neither, and emulated it would be slower than "
                          "float32: decode in float32, or int8_decoding=True")


# oneDNN's bfloat16 product, which compiles a kernel for each shape
_bf16_product = in_few_shapes(F.linear)


class BF16Linear(nn.Module):
    """A Linear layer whose product is bfloat16 (oneDNN's kernel where the
    CPU has one), float32 in and out."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(),
                                                                  requires_grad=False)

    def forward(self, x):
        # as one 2-D matrix: PyTorch multiplies a bfloat16 3-D view (the
        # decoder's (rows, 1, features) step) on a path hundreds of times slower
        out = _bf16_product(x.reshape(-1, self.in_features).to(torch.bfloat16), self.weight)
        out = out.float().view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def to_bf16_for_decoding(model):
    """``model`` with its Linear layers ``BF16Linear`` (in place, once)."""
    if getattr(model, "bf16_linears", False):
        return model
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, BF16Linear(child))
                count += 1
    model.bf16_linears = True
    logger.info("bf16 decoding (--bf16-decoding): %d Linear layers multiply in bfloat16 on this CPU's %s",
                count, cpu_bf16_feature() or "emulation")
    return model
