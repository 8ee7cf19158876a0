"""fairseq-hardattn: efficient decoder attention as a fairseq user-dir plugin.

Load with ``--user-dir "$(python -m fairseq_hardattn)"`` (or import the
package). Importing registers the models, architectures and criterions and
applies the few workarounds of fairseq behaviour in ``fairseq_compat``
(checkpoints on torch >= 2.6, the last batch of a data set, one-line errors,
checked ``--model-overrides``, quieter library warnings).
"""

from . import fairseq_compat
from .errors import ConfigError
from . import bpe, criterions, decoding, models  # noqa: F401

fairseq_compat.install()  # before anything loads a checkpoint

__all__ = ["ConfigError", "USER_DIR", "registered_architectures"]

# the value of fairseq's --user-dir (and the hub's user_dir=) for this plugin
USER_DIR = __path__[0]


def registered_architectures():
    """Names of every ``--arch`` this plugin registers, sorted."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    return sorted(
        arch
        for arch, model_cls in ARCH_MODEL_REGISTRY.items()
        if model_cls.__module__.startswith(__name__ + ".")
    )
