"""Let torch >= 2.6 load fairseq checkpoints, with no environment variable.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which
refuses any pickled Python object it does not know. fairseq calls
``torch.load`` without that argument and its checkpoints hold a few such
objects: the ``argparse.Namespace`` of legacy (``--arch``) models, and numpy
scalars/arrays where metrics were recorded (e.g. ``--eval-bleu`` with
``--best-checkpoint-metric bleu``). Rather than switching the protection off
for every load, we allow exactly those types; importing the plugin (which
``--user-dir`` does before any checkpoint is read) is enough.
"""

import argparse

import numpy
import torch

_numpy_multiarray = getattr(numpy, "_core", None) or numpy.core  # numpy 2 / 1


def _safe_globals():
    from .fairseq_compat import PluginModelArgs

    allowed = [argparse.Namespace, PluginModelArgs, numpy.ndarray, numpy.dtype]
    for name in ("_reconstruct", "scalar"):
        fn = getattr(_numpy_multiarray.multiarray, name)
        allowed.append(fn)
        # checkpoints written under numpy 1 name the same functions numpy.core.*
        allowed.append((fn, f"numpy.core.multiarray.{name}"))
    dtypes = getattr(numpy, "dtypes", None)  # numpy >= 1.25
    if dtypes is not None:
        for name in ("Int64DType", "Int32DType", "Float64DType", "Float32DType",
                     "Float16DType", "BoolDType"):
            if hasattr(dtypes, name):
                allowed.append(getattr(dtypes, name))
    return allowed


if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
    torch.serialization.add_safe_globals(_safe_globals())
