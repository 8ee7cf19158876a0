"""int8 decoding on a CPU (``--int8-decoding``, a model option: at decoding
time ``--model-overrides "{'int8_decoding': True}"`` or the hub's
``int8_decoding=True``): every ``nn.Linear`` of the model (projections,
feed-forward layers, the output projection) becomes PyTorch's dynamically
quantized int8 Linear (int8 weights, activations quantized per call);
embeddings, norms and attention stay float32. The weights are packed for
oneDNN's kernels or PyTorch's default engine, whichever ran faster on such a
CPU (``packing_engines``).
Applied when fairseq's tools prepare the model for decoding
(``prepare_for_inference_``); a quantized model decodes only."""

import contextlib
import logging
import warnings

import torch
from torch import nn

from ..errors import ConfigError
from .heap import keep_large_blocks_in_the_heap
from .row_shapes import in_few_shapes

logger = logging.getLogger(__name__)


def check_int8_decoding(model, cfg=None):
    """One line where int8 decoding cannot run: on a GPU, or with --fp16."""
    parameter = next(model.parameters(), None)
    if parameter is not None and parameter.is_cuda:
        raise ConfigError("--int8-decoding runs on the CPU (PyTorch's int8 Linear kernels): decode "
                          "on the CPU, or on the GPU without it")
    if getattr(getattr(cfg, "common", None), "fp16", False):
        raise ConfigError("--int8-decoding and --fp16 exclude each other: choose one")


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX int8 tiles (torch's own check)."""
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


# the projection to the vocabulary, the largest int8 Linear of a step
OUTPUT_PROJECTION = "decoder.output_projection"


def packing_engines():
    """The quantized engines to pack int8 weights for: (the model's layers,
    its output projection). oneDNN's dynamic int8 Linear against PyTorch's
    default (x86 / fbgemm), one thread, measured per shape
    (``research/linear_engines.py``; results/linear_engines.md): with AMX
    int8 tiles oneDNN is faster at every Transformer Base shape; without
    AMX it is no faster at the layers' shapes but faster at the output
    projection to a vocabulary. So every layer packs for oneDNN with AMX,
    and the output projection wherever oneDNN is there; the rest keeps the
    default."""
    default = torch.backends.quantized.engine
    onednn = "onednn" if "onednn" in torch.backends.quantized.supported_engines else default
    return (onednn if cpu_has_amx() else default), onednn


def _submodule(model, name: str):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


@contextlib.contextmanager
def packing_for(engine: str):
    """Int8 weights packed within are packed for ``engine``. Packed weights
    keep the engine they were packed for, so the process-wide engine is set
    only while packing and then restored: nothing else in the process changes."""
    previous_engine = torch.backends.quantized.engine
    with warnings.catch_warnings():
        # torch 2.13 marks its quantized tensor constructors deprecated (pytorch issue
        # 184982); they are the int8 Linear kernels this option exists for
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor", category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*torchao", category=UserWarning)
        torch.backends.quantized.engine = engine
        try:
            yield
        finally:
            torch.backends.quantized.engine = previous_engine


def pack_int8(model, layers, engine: str):
    """``layers`` of ``model`` (Linear types or submodule names) made dynamic int8
    Linear layers in place, their weights packed for ``engine``."""
    with packing_for(engine):
        torch.ao.quantization.quantize_dynamic(model, layers, dtype=torch.qint8, inplace=True)
    return model


def quantize_for_decoding(model):
    """``model`` with its Linear layers int8 (in place, once), each packed for
    its engine (``packing_engines``)."""
    if getattr(model, "int8_quantized", False):
        return model
    check_int8_decoding(model)
    layers_engine, output_projection_engine = packing_engines()
    layers = sum(isinstance(m, nn.Linear) for m in model.modules())
    if isinstance(_submodule(model, OUTPUT_PROJECTION), nn.Linear):
        pack_int8(model, {OUTPUT_PROJECTION}, output_projection_engine)
    pack_int8(model, {nn.Linear}, layers_engine)
    for name, module in model.named_modules():
        engine = output_projection_engine if name == OUTPUT_PROJECTION else layers_engine
        if engine == "onednn" and isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            module.forward = in_few_shapes(module.forward)
    model.int8_quantized = True
    logger.info("int8 decoding (--int8-decoding): %d Linear layers quantized, int8 weights packed for "
                "%s (the output projection for %s)", layers, layers_engine, output_projection_engine)
    keep_large_blocks_in_the_heap()
    return model


def int8_rows(layer, rows: torch.Tensor):
    """The logits of ``layer``'s output ``rows`` only (a shortlist's tokens),
    as a function of its input: the same int8 weights and quantization as the
    layer's forward, packed for the engine ``layer`` was packed for
    (``quantize_for_decoding``). Made once per batch, so packed once: a
    dynamic Linear module would pack a placeholder weight first."""
    weight, bias = layer.weight(), layer.bias()
    rows = rows.to(weight.device)
    sliced = torch.quantize_per_tensor(weight.index_select(0, rows).dequantize(), weight.q_scale(),
                                       weight.q_zero_point(), torch.qint8) \
        if weight.qscheme() == torch.per_tensor_affine else \
        torch.quantize_per_channel(weight.dequantize().index_select(0, rows),
                                   weight.q_per_channel_scales().index_select(0, rows),
                                   weight.q_per_channel_zero_points().index_select(0, rows), 0, torch.qint8)
    with packing_for(packing_engines()[1]):
        packed = torch.ops.quantized.linear_prepack(sliced, None if bias is None else bias.index_select(0, rows))
    # (torch.ao.nn.quantized.dynamic.Linear's forward for qint8 weights)
    def product(x):
        return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True).to(x.dtype)

    return in_few_shapes(product) if packing_engines()[1] == "onednn" else product
