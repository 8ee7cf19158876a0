"""One error type for invalid configurations and inputs, reported in one line.

fairseq's command-line tools print a full traceback for any exception raised
while building a model or loading a checkpoint. For the mistakes a user makes
(an unknown attention kind, contradictory options, a checkpoint of another
family) a traceback from deep inside fairseq hides the one line that matters,
so the plugin installs an exception hook that prints only that line.
"""

import sys


class ConfigError(ValueError):
    """An invalid option, option combination, checkpoint or input."""


def _report_config_errors(exc_type, exc, tb, _previous=sys.excepthook):
    if isinstance(exc, ConfigError):
        print(f"fairseq-hardattn: error: {exc}", file=sys.stderr)
        return
    _previous(exc_type, exc, tb)


def install_error_hook():
    """Print ``ConfigError``s in one line when they reach the top level."""
    if sys.excepthook is not _report_config_errors:
        sys.excepthook = _report_config_errors
