"""fairseq-hardattn: efficient decoder attention as a fairseq user-dir plugin.

Load with ``--user-dir "$(python -m fairseq_hardattn)"`` (or import the
package). Importing registers the models, architectures, criterions and the
BPE, and lets torch read fairseq checkpoints; it replaces no function of
argparse, sys or fairseq. A fairseq command run with the plugin gets the
workarounds of fairseq behaviour in ``compat`` (checkpoints and overrides,
the last batch of a data set, one-line errors, signals, quieter warnings).
``from_pretrained`` is the hub with the plugin's checks.
"""

import sys

from .errors import ConfigError

# the value of fairseq's --user-dir (and the hub's user_dir=) for this plugin
USER_DIR = __path__[0]


def _run_as_its_own_command() -> bool:
    """``python -m fairseq_hardattn ...``: its ``__main__`` loads what the
    command asks for (its --help and the plugin's path need neither torch nor
    fairseq)."""
    argv = getattr(sys, "orig_argv", [])
    return "-m" in argv and argv[argv.index("-m") + 1:][:1] == [__name__] and sys.argv[:1] == ["-m"]


def load():
    """Register the models, criterions, BPE and engine; let torch read
    fairseq checkpoints; in a fairseq command, install compat's fixes."""
    global from_pretrained
    from . import compat

    compat.install()  # before anything loads a checkpoint
    if compat.running_a_fairseq_command():
        compat.install_for_command_line()

    from . import bpe, criterions, decoding, models  # noqa: F401
    from .compat.hub import from_pretrained


if not _run_as_its_own_command():
    load()

__all__ = ["ConfigError", "USER_DIR", "from_pretrained", "registered_architectures"]


def registered_architectures():
    """Names of every ``--arch`` this plugin registers, sorted."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    return sorted(
        arch
        for arch, model_cls in ARCH_MODEL_REGISTRY.items()
        if model_cls.__module__.startswith(__name__ + ".")
    )
