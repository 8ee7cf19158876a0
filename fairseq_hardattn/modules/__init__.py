"""Attention mechanisms, each a drop-in for a sublayer of fairseq's Transformer.

``ATTENTION_KINDS`` maps the names accepted by the ``--*-attn-kind`` options
to their classes; all take ``MultiheadAttention``'s constructor arguments and
have its parameters, so a checkpoint trained with one kind loads into another.
``CROSS_SELF_KINDS`` does the same for cross+self attention.
"""

from .average_attention import AverageAttention
from .cached_projection import CachedProjectionAttention
from .cross_self_attention import CrossSelfAttention, HardCrossSelfAttention
from .flexible_attention import FlexibleAttention, FlexibleLSTMAttention
from .hard_retrieval_attention import (
    HardRetrievalAttention,
    StraightThroughRetrieval,
    sample_key_indices,
)
from .local_attention import LocalAttention
from .soft_attention import SoftAttention
from . import sentence_groups  # noqa: F401

ATTENTION_KINDS = {
    "soft": SoftAttention,
    "hard": HardRetrievalAttention,
}

CROSS_SELF_KINDS = {
    "soft": CrossSelfAttention,
    "hard": HardCrossSelfAttention,
}


def attention_class(kind: str, option: str = "attention kind", kinds=None):
    """The class registered for ``kind``, or a clear error naming the option."""
    kinds = ATTENTION_KINDS if kinds is None else kinds
    try:
        return kinds[kind]
    except KeyError:
        raise ValueError(
            f"unknown {option} {kind!r}; choose one of: {', '.join(kinds)}"
        ) from None


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
    "attention_class",
    "sample_key_indices",
]
