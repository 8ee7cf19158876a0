"""Attention mechanisms, each a drop-in for a sublayer of fairseq's Transformer.

``ATTENTION_KINDS`` maps the names of the generic kinds (``--*-attn-kind``)
to their classes; all take ``MultiheadAttention``'s constructor arguments and
have its parameters, so a checkpoint trained with one kind loads into another.
``CROSS_SELF_KINDS`` does the same for cross+self attention. Shared machinery
has modules of its own (``cached_projection``, ``gather``, ``windows``,
``cps``, ``gate_networks``); a mechanism module never imports another
mechanism's helpers. ``decoding_step`` is how a module meets the decoding
engine (``fairseq_hardattn.decoding``), which no module imports.
"""

from .average_attention import AverageAttention
from .cached_projection import CachedProjectionAttention
from .cross_self_attention import CrossSelfAttention, HardCrossSelfAttention
from .flexible_attention import FlexibleAttention
from .flexible_lstm_attention import FlexibleLSTMAttention
from .hard_retrieval_attention import (
    HardRetrievalAttention,
    StraightThroughRetrieval,
    sample_key_indices,
)
from .local_attention import LocalAttention
from .soft_attention import SoftAttention
from .topk_attention import TopKAttention
from . import decoding_step  # noqa: F401

ATTENTION_KINDS = {
    "soft": SoftAttention,
    "hard": HardRetrievalAttention,
    "topk": TopKAttention,
}

CROSS_SELF_KINDS = {
    "soft": CrossSelfAttention,
    "hard": HardCrossSelfAttention,
}


__all__ = [
    "ATTENTION_KINDS",
    "AverageAttention",
    "CROSS_SELF_KINDS",
    "CachedProjectionAttention",
    "CrossSelfAttention",
    "FlexibleAttention",
    "FlexibleLSTMAttention",
    "HardCrossSelfAttention",
    "HardRetrievalAttention",
    "LocalAttention",
    "SoftAttention",
    "StraightThroughRetrieval",
    "TopKAttention",
    "sample_key_indices",
]
