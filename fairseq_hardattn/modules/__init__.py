"""Attention mechanisms, each a drop-in for fairseq's ``MultiheadAttention``.

``ATTENTION_KINDS`` maps the names accepted by the ``--*-attn-kind`` options
to their classes; all take ``MultiheadAttention``'s constructor arguments and
have its parameters, so a checkpoint trained with one kind loads into another.
"""

from fairseq.modules import MultiheadAttention

from .cached_projection import CachedProjectionAttention
from .hard_retrieval_attention import (
    HardRetrievalAttention,
    StraightThroughRetrieval,
    sample_key_indices,
)

ATTENTION_KINDS = {
    "soft": MultiheadAttention,
    "hard": HardRetrievalAttention,
}


def attention_class(kind: str, option: str = "attention kind"):
    """The class registered for ``kind``, or a clear error naming the option."""
    try:
        return ATTENTION_KINDS[kind]
    except KeyError:
        raise ValueError(
            f"unknown {option} {kind!r}; choose one of: {', '.join(ATTENTION_KINDS)}"
        ) from None


__all__ = [
    "ATTENTION_KINDS",
    "CachedProjectionAttention",
    "HardRetrievalAttention",
    "StraightThroughRetrieval",
    "attention_class",
    "sample_key_indices",
]
