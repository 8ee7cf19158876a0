"""int8 decoding on a CPU (``--int8-decoding``, a model option: at decoding
time ``--model-overrides "{'int8_decoding': True}"`` or the hub's
``int8_decoding=True``): every ``nn.Linear`` of the model (projections,
feed-forward layers, the output projection) becomes PyTorch's dynamically
quantized int8 Linear (int8 weights, activations quantized per call, fbgemm
/ oneDNN kernels); embeddings, norms and attention arithmetic stay float32.
Applied when fairseq's tools prepare the model for decoding
(``prepare_for_inference_``); a quantized model decodes only."""

import warnings

import torch
from torch import nn

from ..errors import ConfigError


def check_int8_decoding(model, cfg=None):
    """One line where int8 decoding cannot run: on a GPU, or with --fp16."""
    parameter = next(model.parameters(), None)
    if parameter is not None and parameter.is_cuda:
        raise ConfigError("--int8-decoding runs on the CPU (PyTorch's int8 Linear kernels): decode "
                          "on the CPU, or on the GPU without it")
    if getattr(getattr(cfg, "common", None), "fp16", False):
        raise ConfigError("--int8-decoding and --fp16 exclude each other: choose one")


def quantize_for_decoding(model):
    """``model`` with its Linear layers int8 (in place, once)."""
    if getattr(model, "int8_quantized", False):
        return model
    check_int8_decoding(model)
    with warnings.catch_warnings():
        # torch 2.13 marks its quantized tensor constructors deprecated (pytorch issue
        # 184982); they are the int8 Linear kernels this option exists for
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor", category=UserWarning)
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    model.int8_quantized = True
    return model

