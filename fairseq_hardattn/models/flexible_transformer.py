"""Transformers whose decoder cross-attention looks only near a centre:
flexible attention (Shu & Nakayama 2017) and Luong's local-p attention, its
baseline. ``--dec-cross-attn-kind`` selects ``flexible`` or ``local``;
everything else is fairseq's Transformer.

Flexible attention skips, at test time, the positions whose penalty exceeds
τ = ``--flexible-threshold``: a number, ``inf`` (no skipping) or ``auto``, the
paper's rule τ = -log10(1/S̄) with S̄ the mean source length (base 10: the
paper's τ = 1.38 for S̄ = 24.4). S̄ is measured on
the validation set when the model is built for training and saved with the
checkpoint (or given with ``--flexible-mean-source-length``).

``--print-cps`` (e.g. ``fairseq-generate ... --model-overrides "{'print_cps': True}"``)
counts the score computations per decoding step (CPS) and prints them when
the process ends; ``model.cps_summary()`` returns them.
"""

import atexit
import logging
import math
import sys

from fairseq.models import register_model, register_model_architecture

from ..errors import ConfigError
from ..modules import FlexibleAttention, LocalAttention
from ..modules.flexible_attention import masked_mean_gate
from .hard_retrieval_transformer import (
    ATTENTION_KINDS,
    AttentionKindDecoder,
    AttentionKindDecoderLayer,
    HardRetrievalTransformerModel,
    base_architecture,
    big_architecture,
    set_defaults,
    small_architecture,
)

logger = logging.getLogger(__name__)

MODEL_NAME = "flexible_transformer"
WINDOWED_KINDS = {"flexible": FlexibleAttention, "local": LocalAttention}


def resolve_threshold(args):
    """τ as a float, or None for no skipping."""
    value = str(args.flexible_threshold).strip().lower()
    if value in ("inf", "none"):
        return None
    if value == "auto":
        mean_length = getattr(args, "flexible_mean_source_length", None)
        if not mean_length:
            raise ConfigError(
                "--flexible-threshold auto needs the mean source length, which is "
                "measured when training: give --flexible-mean-source-length N or a number "
                "(e.g. --model-overrides \"{'flexible_threshold': 2.5}\")"
            )
        # -log(1/S̄) in base 10: the paper's τ = 1.38 for S̄ = 24.4 (ln would give 3.19)
        return math.log10(mean_length)
    try:
        threshold = float(value)
    except ValueError:
        raise ConfigError(
            f"--flexible-threshold must be a number, 'auto' or 'inf', got {args.flexible_threshold!r}"
        ) from None
    if not threshold > 0:
        raise ConfigError(f"--flexible-threshold must be > 0, got {threshold}")
    return threshold


class WindowedAttentionDecoderLayer(AttentionKindDecoderLayer):
    cross_attention_kinds = WINDOWED_KINDS

    def cross_attention_options(self, kind, cfg):
        if kind is FlexibleAttention:
            return dict(sigma=cfg.flexible_sigma, threshold=resolve_threshold(cfg),
                        train_passes=cfg.flexible_train_passes,
                        train_threshold=cfg.flexible_train_threshold,
                        gate_dim=cfg.flexible_gate_dim)
        return dict(window=cfg.local_window)


class WindowedAttentionDecoder(AttentionKindDecoder):
    layer_class = WindowedAttentionDecoderLayer


def mean_source_length(task, split="valid"):
    """Mean source length (tokens, EOS included) of the task's validation set,
    loading it if needed (fairseq builds the model first); None without one."""
    datasets = getattr(task, "datasets", None)
    if datasets is None:
        return None
    if split not in datasets:
        try:
            task.load_dataset(split)
        except Exception:  # no such split (e.g. fairseq-interactive): unknown
            return None
    sizes = getattr(datasets.get(split), "src_sizes", None)
    return float(sizes.mean()) if sizes is not None and len(sizes) else None


class FlexibleAttentionOptions:
    """Options, build steps, gate and CPS reporting of the families with
    flexible attention (this Transformer family and ``lstm_flexible``)."""

    @staticmethod
    def add_flexible_args(parser):
        parser.add_argument("--flexible-sigma", type=float, metavar="S",
                            help="σ of the position penalty g(s-p)²/(2σ²)")
        parser.add_argument("--flexible-threshold", metavar="TAU",
                            help="test-time threshold τ on the penalty: a number, 'auto' "
                                 "(-log10(1/mean source length)) or 'inf' (score everything)")
        parser.add_argument("--flexible-mean-source-length", type=float, metavar="N",
                            help="S̄ for --flexible-threshold auto (default: measured on "
                                 "the validation set when training)")
        parser.add_argument("--flexible-gate-dim", type=int, metavar="N",
                            help="hidden size of the gate network W_g (default: the "
                                 "attention's input size; the paper leaves it open, and "
                                 "it is a d x N product per decoding step)")
        parser.add_argument("--print-cps", action="store_true",
                            help="count score computations per decoding step and print "
                                 "them at exit")

    @staticmethod
    def validate_flexible_args(args, uses_threshold=True):
        if not args.flexible_sigma > 0:
            raise ConfigError(f"--flexible-sigma must be > 0, got {args.flexible_sigma}")
        gate_dim = getattr(args, "flexible_gate_dim", None)
        if gate_dim is not None and gate_dim < 1:
            raise ConfigError(f"--flexible-gate-dim must be >= 1, got {gate_dim}")
        if uses_threshold:
            resolve_threshold(args)

    @staticmethod
    def measure_mean_source_length(args, task):
        """Record S̄ in the model's options, so that checkpoints carry it."""
        if not getattr(args, "flexible_mean_source_length", None):
            args.flexible_mean_source_length = mean_source_length(task)
            if args.flexible_mean_source_length:
                logger.info("flexible attention: validation mean source length %.2f "
                            "(--flexible-threshold auto: tau = %.3f)",
                            args.flexible_mean_source_length,
                            math.log10(args.flexible_mean_source_length))

    def finish_build(self, args):
        if getattr(args, "print_cps", False):
            self.enable_cps_counting()
            atexit.register(self.print_cps_summary)

    def windowed_modules(self):
        return [m for m in self.decoder.modules() if hasattr(m, "cps")]

    def mean_gate(self, target_mask):
        """Mean penalty strength g_t of the last forward, over layers, heads and
        unpadded target positions (target_mask: bsz x tgt_len, True = real)."""
        gates = [m.last_gates for m in self.windowed_modules()
                 if getattr(m, "last_gates", None) is not None]
        if not gates:
            raise ConfigError("the gate loss needs flexible attention")
        return masked_mean_gate(gates, target_mask)

    def enable_cps_counting(self, enabled=True):
        for module in self.windowed_modules():
            module.cps.enabled = enabled
            module.cps.reset()

    def cps_summary(self):
        """Score computations per decoding step, over all windowed layers."""
        summaries = [s for s in (m.cps.summary() for m in self.windowed_modules()) if s]
        if not summaries:
            return None
        queries = sum(s["queries"] for s in summaries)
        cps = sum(s["cps"] * s["queries"] for s in summaries) / queries
        global_cps = sum(s["global_cps"] * s["queries"] for s in summaries) / queries
        return {"cps": cps, "global_cps": global_cps,
                "reduction": 1 - cps / global_cps if global_cps else 0.0}

    def print_cps_summary(self):
        summary = self.cps_summary()
        if summary:
            print(f"fairseq-hardattn | CPS {summary['cps']:.2f} (global attention "
                  f"{summary['global_cps']:.2f}): {100 * summary['reduction']:.1f}% fewer "
                  "score computations", file=sys.stderr, flush=True)


@register_model(MODEL_NAME)
class FlexibleTransformerModel(FlexibleAttentionOptions, HardRetrievalTransformerModel):
    decoder_class = WindowedAttentionDecoder
    kind_choices = dict(HardRetrievalTransformerModel.kind_choices,
                        dec_cross_attn_kind=WINDOWED_KINDS)

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        # this family's cross-attention kinds
        for action in parser._actions:
            if action.dest == "dec_cross_attn_kind":
                action.choices = sorted(set(ATTENTION_KINDS) | set(WINDOWED_KINDS))
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
        cls.validate_flexible_args(args, uses_threshold=args.dec_cross_attn_kind == "flexible")
        if args.flexible_train_passes < 0:
            raise ConfigError(f"--flexible-train-passes must be >= 0, got {args.flexible_train_passes}")
        if args.local_window < 1:
            raise ConfigError(f"--local-window must be >= 1, got {args.local_window}")

    @classmethod
    def build_model(cls, args, task):
        windowed_base(args)
        cls.measure_mean_source_length(args, task)
        model = super().build_model(args, task)
        model.finish_build(args)
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
