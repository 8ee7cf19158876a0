"""Counting the operations a model dispatches, and the host synchronisations
among them, on any device (the CPU included): what per-step overhead a GPU
would pay, and where it comes from.

``count_ops`` runs a function under a ``TorchDispatchMode`` that sees every
aten operation; operations inside this plugin's attention modules (their
``forward``) are counted apart, so a sync that fairseq's own generator or
decoder makes is told from one of ours. Host syncs are the operations whose
result the host must wait for (``SYNC_OPS``: ``.item()``/``int()``/``bool()``
of a tensor, ``nonzero``, ``torch.equal``, boolean-mask indexing, ...).
Python-level reads that dispatch nothing (``Tensor.tolist()``) are not seen:
the modules use none.
"""

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# aten operations that make the host wait for the device
SYNC_OPS = frozenset({
    "aten._local_scalar_dense", "aten.nonzero", "aten.nonzero_static", "aten.equal",
    "aten.is_nonzero", "aten.masked_select", "aten._unique", "aten._unique2",
    "aten.unique_consecutive", "aten.unique_dim", "aten.item",
})


def plugin_attention_modules(model: nn.Module):
    """This plugin's attention modules in ``model`` (the mechanisms)."""
    from fairseq_hardattn.modules import AverageAttention, CachedProjectionAttention, FlexibleLSTMAttention

    kinds = (CachedProjectionAttention, AverageAttention, FlexibleLSTMAttention)
    return [m for m in model.modules() if isinstance(m, kinds)]


@dataclass
class OpCounts:
    total: Counter = field(default_factory=Counter)  # op name -> count, everywhere
    inside: Counter = field(default_factory=Counter)  # inside the plugin's modules

    def ops(self, inside=False):
        return sum((self.inside if inside else self.total).values())

    def syncs(self, inside=False):
        counts = self.inside if inside else self.total
        return sum(n for op, n in counts.items() if op in SYNC_OPS)

    def sync_ops(self, inside=False):
        counts = self.inside if inside else self.total
        return {op: n for op, n in counts.items() if op in SYNC_OPS}


class _Counting(TorchDispatchMode):
    def __init__(self, counts: OpCounts):
        super().__init__()
        self.counts = counts
        self.depth = 0  # > 0 while inside one of the plugin's modules

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = "aten." + func.__name__.split(".")[0] if func.namespace == "aten" else str(func)
        self.counts.total[name] += 1
        if self.depth:
            self.counts.inside[name] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting(model: nn.Module):
    """Counts (``OpCounts``) of the operations dispatched in the ``with``
    block, those inside ``model``'s plugin attention modules apart."""
    counts = OpCounts()
    mode = _Counting(counts)
    handles = []

    def enter(*_):
        mode.depth += 1

    def leave(*_):
        mode.depth -= 1

    for module in plugin_attention_modules(model):
        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        with mode:
            yield counts
    finally:
        for handle in handles:
            handle.remove()
