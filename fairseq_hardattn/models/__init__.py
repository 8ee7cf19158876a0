from . import soft_transformer  # noqa: F401  (registers the models)
from . import hard_retrieval_transformer  # noqa: F401
from . import topk_retrieval_transformer  # noqa: F401
from . import cross_self_transformer  # noqa: F401
from . import aan_transformer  # noqa: F401
from . import flexible_transformer  # noqa: F401
from . import flexible_lstm  # noqa: F401
