"""Transformer with the average attention network (AAN) decoder (Zhang et al.
2018): decoder self-attention replaced by a cumulative average with an
optional FFN and an input/forget gate (``fairseq_hardattn.modules.AverageAttention``).
Cross-attention keeps its selectable kind (``--dec-cross-attn-kind``).
"""

from fairseq.models import register_model, register_model_architecture

from ..errors import ConfigError
from ..modules import AverageAttention
from .attention_kind_base import (
    REPLACED,
    AttentionKindDecoder,
    AttentionKindDecoderLayer,
    AttentionKindTransformerModel,
    base_architecture,
    big_architecture,
    model_name,
    set_defaults,
    small_architecture,
)

MODEL_NAME = "aan_transformer"


class AverageAttentionDecoderLayer(AttentionKindDecoderLayer):
    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return AverageAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            ffn_dim=cfg.aan_ffn_dim,
            dropout=cfg.activation_dropout or cfg.relu_dropout or 0.0,
            activation_fn=cfg.activation_fn,
        )


class AverageAttentionDecoder(AttentionKindDecoder):
    layer_class = AverageAttentionDecoderLayer


@register_model(MODEL_NAME)
class AANTransformerModel(AttentionKindTransformerModel):
    decoder_class = AverageAttentionDecoder
    replaced_sublayers = {
        "dec_self_attn_kind": "its decoder self-attention is the average attention network"
    }

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        parser.add_argument("--aan-ffn-dim", type=int, metavar="N",
                            help="inner size of the FFN applied to the running average "
                                 "(0: no FFN; default: the decoder FFN size)")

    @classmethod
    def validate_args(cls, args):
        super().validate_args(args)
        if args.aan_ffn_dim < 0:
            raise ConfigError(f"--aan-ffn-dim must be >= 0, got {args.aan_ffn_dim}")
        if args.cross_self_attention:
            raise ConfigError(f"{model_name(args)} does not support --cross-self-attention")

    @classmethod
    def build_model(cls, args, task):
        aan_base(args)
        return super().build_model(args, task)


def aan_base(args):
    set_defaults(args, dec_self_attn_kind=REPLACED)


def aan_ffn_default(args):
    set_defaults(args, aan_ffn_dim=args.decoder_ffn_embed_dim)


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def aan_base_architecture(args):
    aan_base(args)
    base_architecture(args)
    aan_ffn_default(args)


@register_model_architecture(MODEL_NAME, "transformer_aan")
def transformer_aan(args):
    aan_base_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_aan_big")
def transformer_aan_big(args):
    aan_base(args)
    big_architecture(args)
    aan_ffn_default(args)


@register_model_architecture(MODEL_NAME, "transformer_aan_small")
def transformer_aan_small(args):
    aan_base(args)
    small_architecture(args)
    aan_ffn_default(args)
