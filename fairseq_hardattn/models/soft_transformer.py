"""The soft baseline: fairseq's Transformer with soft attention everywhere,
built by this plugin's classes, so that it decodes on the same terms as every
other variant (encoder K/V kept once per sentence of a beam, alignments from
a teacher-forced pass) and its checkpoints switch kinds like theirs.
``transformer_soft`` (Base), ``_big`` and ``_small`` (the CPU preset);
``transformer_soft_prenorm`` (+``_small``): the soft counterpart of
``transformer_hard_dec_prenorm``, trained the same way;
``transformer_soft_prenorm_h8_small``: that of ``transformer_hard_dec_anneal_small``.
"""

from fairseq.models import register_model, register_model_architecture

from .attention_kind_base import (
    AttentionKindTransformerModel,
    base_architecture,
    big_architecture,
    eight_decoder_heads,
    pre_norm,
    small_architecture,
)

MODEL_NAME = "soft_transformer"


@register_model(MODEL_NAME)
class SoftTransformerModel(AttentionKindTransformerModel):
    """fairseq's Transformer, soft attention in every sublayer by default."""


@register_model_architecture(MODEL_NAME, "transformer_soft")
def transformer_soft(args):
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_soft_big")
def transformer_soft_big(args):
    big_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_soft_small")
def transformer_soft_small(args):
    """The soft baseline at the CPU preset (the same model as fairseq's transformer)."""
    small_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_soft_prenorm")
def transformer_soft_prenorm(args):
    """The soft counterpart of transformer_hard_dec_prenorm (pre-norm layers)."""
    pre_norm(args)
    transformer_soft(args)


@register_model_architecture(MODEL_NAME, "transformer_soft_prenorm_small")
def transformer_soft_prenorm_small(args):
    pre_norm(args)
    transformer_soft_small(args)


@register_model_architecture(MODEL_NAME, "transformer_soft_prenorm_h8_small")
def transformer_soft_prenorm_h8_small(args):
    """The soft counterpart of transformer_hard_dec_anneal_small (pre-norm, 8 decoder heads)."""
    eight_decoder_heads(args)
    transformer_soft_prenorm_small(args)
