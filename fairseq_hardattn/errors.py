"""One error type for invalid configurations and inputs, reported in one line.

fairseq's command-line tools print a full traceback for any exception raised
while building a model or loading a checkpoint. For the mistakes a user makes
(an unknown attention kind, contradictory options, a checkpoint of another
family) a traceback from deep inside fairseq hides the one line that matters,
so the plugin installs an exception hook that prints only that line (for
``ConfigError`` and for fairseq's own input errors, e.g. a sentence longer
than the model's maximum positions).
"""

import re
import sys


class ConfigError(ValueError):
    """An invalid option, option combination, checkpoint or input."""


# fairseq's own errors about user input, raised as bare Exceptions
_FAIRSEQ_INPUT_ERRORS = (re.compile(r"Size of sample #\d+ is invalid"),)


def _is_input_error(exc):
    return isinstance(exc, ConfigError) or (
        type(exc) is Exception and any(p.match(str(exc)) for p in _FAIRSEQ_INPUT_ERRORS))


def _report_config_errors(exc_type, exc, tb, _previous=sys.excepthook):
    if _is_input_error(exc):
        print(f"fairseq-hardattn: error: {exc}", file=sys.stderr)
        return
    _previous(exc_type, exc, tb)


def install_error_hook():
    """Print ``ConfigError``s in one line when they reach the top level."""
    if sys.excepthook is not _report_config_errors:
        sys.excepthook = _report_config_errors


class ClearCheckpointErrors:
    """Model mixin: a checkpoint of another family (or size) fails with one
    line naming what does not fit, not torch's list of every parameter."""

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            expected = self.state_dict()
            missing = sorted(set(expected) - set(state_dict))
            unexpected = sorted(set(state_dict) - set(expected))
            problems = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
            detail = "; ".join(
                part for part in (
                    missing and f"{len(missing)} parameters missing (e.g. {missing[0]})",
                    unexpected and f"{len(unexpected)} unexpected (e.g. {unexpected[0]})",
                    not (missing or unexpected) and problems and problems[0][:200],
                ) if part)
            name = getattr(model_cfg, "_name", None) or getattr(model_cfg, "arch", None) \
                or type(self).__name__
            raise ConfigError(
                f"the checkpoint does not fit {name}: {detail}. Checkpoints convert between "
                "attention kinds of the same sublayers (soft/hard, + fresh gates for flexible or "
                "local cross-attention), not between families or sizes"
            ) from None
