"""Options, build steps, gate and CPS reporting of the model families with
flexible attention (``flexible_transformer`` and ``flexible_lstm``).

Flexible attention skips, at test time, the positions whose penalty exceeds
τ = ``--flexible-threshold``: a number, ``inf`` (no skipping) or ``auto``, the
paper's rule τ = -log10(1/S̄) with S̄ the mean source length (base 10: the
paper's τ = 1.38 for S̄ = 24.4). S̄ is measured on the validation set when the
model is built for training and saved with the checkpoint (or given with
``--flexible-mean-source-length``). τ is resolved once per build and handed to
the modules as a number.

``--print-cps`` (e.g. ``fairseq-generate ... --model-overrides "{'print_cps': True}"``)
counts the score computations per decoding step (CPS) and prints them when
the process ends (fairseq's tools have no hook after decoding); ``model.cps_summary()``
returns them.
"""

import atexit
import logging
import math
import sys

from ..errors import ConfigError
from ..modules.cps import combined_summary
from ..modules.gate_networks import masked_mean_gate

logger = logging.getLogger(__name__)

# the CPS counters of each model built with --print-cps (not the models: they
# may be gone when the process ends), reported once at exit
_CPS_REPORTS = []


@atexit.register
def _report_cps():
    for counters in _CPS_REPORTS:
        print_cps_summary(combined_summary(counters))


def print_cps_summary(summary):
    if summary:
        print(f"fairseq-hardattn | CPS {summary['cps']:.2f} (global attention "
              f"{summary['global_cps']:.2f}): {100 * summary['reduction']:.1f}% fewer "
              "score computations", file=sys.stderr, flush=True)


def resolve_threshold(args):
    """τ as a number (inf: no skipping), from --flexible-threshold."""
    value = str(args.flexible_threshold).strip().lower()
    if value in ("inf", "none"):
        return math.inf
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

    @classmethod
    def prepare_flexible_build(cls, args, task, uses_threshold=True):
        """Validate the options and record S̄ (before the model is built);
        returns τ (resolved once, here), or None where nothing uses it."""
        if not args.flexible_sigma > 0:
            raise ConfigError(f"--flexible-sigma must be > 0, got {args.flexible_sigma}")
        gate_dim = getattr(args, "flexible_gate_dim", None)
        if gate_dim is not None and gate_dim < 1:
            raise ConfigError(f"--flexible-gate-dim must be >= 1, got {gate_dim}")
        cls.measure_mean_source_length(args, task)
        return resolve_threshold(args) if uses_threshold else None

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

    def finish_flexible_build(self, args, threshold):
        """Give the built modules τ; count CPS if asked (printed at exit)."""
        if threshold is not None:
            for module in self.windowed_modules():
                if hasattr(module, "set_threshold"):
                    module.set_threshold(threshold)
        if getattr(args, "print_cps", False):
            self.enable_cps_counting()
            _CPS_REPORTS.append([module.cps for module in self.windowed_modules()])

    def train(self, mode=True):
        """Refuse training within bands that do not exist (decoding such a
        model with τ = ∞ is fine, so this is checked here, not when building)."""
        if mode and any(getattr(m, "train_threshold", False) and m.threshold is None
                        for m in self.windowed_modules()):
            raise ConfigError("--flexible-train-threshold needs a finite --flexible-threshold "
                              "(a number or 'auto'): with 'inf' there is no band to train in")
        return super().train(mode)

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
        return combined_summary(module.cps for module in self.windowed_modules())
