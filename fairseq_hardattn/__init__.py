"""fairseq-hardattn: efficient decoder attention as a fairseq user-dir plugin.

Load with ``--user-dir fairseq_hardattn`` (or import the package). Importing
registers the models, architectures and criterions, lets torch >= 2.6 load
fairseq checkpoints, keeps fairseq from dropping the last batch of a dataset,
and makes configuration errors print in one line.
"""

from . import batching_fix  # noqa: F401
from . import checkpoint_compat  # noqa: F401  (before anything loads a checkpoint)
from . import fairseq_compat
from .errors import ConfigError, install_error_hook
from . import criterions, models  # noqa: F401

fairseq_compat.install()
install_error_hook()

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
