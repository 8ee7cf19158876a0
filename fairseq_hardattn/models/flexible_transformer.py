"""Transformers whose decoder cross-attention looks only near a centre:
flexible attention (Shu & Nakayama 2017) and Luong's local-p attention, its
baseline. ``--dec-cross-attn-kind`` selects ``flexible`` or ``local``;
everything else is fairseq's Transformer. The flexible options (τ, S̄, CPS)
are in ``flexible_options``.
"""

from fairseq.models import register_model, register_model_architecture

from ..errors import ConfigError
from ..modules import FlexibleAttention, LocalAttention
from .attention_kind_base import (
    AttentionKindDecoder,
    AttentionKindDecoderLayer,
    AttentionKindTransformerModel,
    base_architecture,
    big_architecture,
    set_defaults,
    small_architecture,
)
from .flexible_options import FlexibleAttentionOptions

MODEL_NAME = "flexible_transformer"


class WindowedAttentionDecoderLayer(AttentionKindDecoderLayer):
    cross_attention_kinds = {"flexible": FlexibleAttention, "local": LocalAttention}

    def cross_attention_options(self, kind, cfg):
        # τ is set on the built modules (FlexibleAttentionOptions.finish_flexible_build)
        if kind is FlexibleAttention:
            return dict(sigma=cfg.flexible_sigma, train_passes=cfg.flexible_train_passes,
                        train_threshold=cfg.flexible_train_threshold,
                        gate_dim=cfg.flexible_gate_dim)
        return dict(window=cfg.local_window)


class WindowedAttentionDecoder(AttentionKindDecoder):
    layer_class = WindowedAttentionDecoderLayer


@register_model(MODEL_NAME)
class FlexibleTransformerModel(FlexibleAttentionOptions, AttentionKindTransformerModel):
    decoder_class = WindowedAttentionDecoder

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        cls.add_flexible_args(parser)
        parser.add_argument("--flexible-train-passes", type=int, metavar="N",
                            help="penalised passes estimating p_{t-1} in training "
                                 "(0: the exact step-by-step recurrence)")
        parser.add_argument("--flexible-train-threshold", action="store_true",
                            help="attend only within the band of --flexible-threshold in "
                                 "training too (e.g. to fine-tune for the positions "
                                 "decoding skips); the paper trains without it")
        parser.add_argument("--local-window", type=int, metavar="D",
                            help="local attention window: 2D+1 positions")

    @classmethod
    def validate_args(cls, args):
        super().validate_args(args)
        if args.flexible_train_passes < 0:
            raise ConfigError(f"--flexible-train-passes must be >= 0, got {args.flexible_train_passes}")
        if args.local_window < 1:
            raise ConfigError(f"--local-window must be >= 1, got {args.local_window}")

    @classmethod
    def build_model(cls, args, task):
        windowed_base(args)
        threshold = cls.prepare_flexible_build(
            args, task, uses_threshold=args.dec_cross_attn_kind == "flexible")
        model = super().build_model(args, task)
        model.finish_flexible_build(args, threshold)
        return model


# --- architectures ------------------------------------------------------------


def windowed_base(args):
    set_defaults(args, flexible_sigma=3.0, flexible_threshold="auto",
                 flexible_train_passes=2, flexible_train_threshold=False, local_window=10,
                 flexible_gate_dim=None, print_cps=False)


def flexible_kind(args):
    set_defaults(args, dec_cross_attn_kind="flexible")
    windowed_base(args)


def local_kind(args):
    set_defaults(args, dec_cross_attn_kind="local")
    windowed_base(args)


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def flexible_base_architecture(args):
    flexible_kind(args)
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_flexible")
def transformer_flexible(args):
    flexible_base_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_flexible_big")
def transformer_flexible_big(args):
    flexible_kind(args)
    big_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_flexible_small")
def transformer_flexible_small(args):
    flexible_kind(args)
    small_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_local")
def transformer_local(args):
    local_kind(args)
    base_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_local_big")
def transformer_local_big(args):
    local_kind(args)
    big_architecture(args)


@register_model_architecture(MODEL_NAME, "transformer_local_small")
def transformer_local_small(args):
    local_kind(args)
    small_architecture(args)
