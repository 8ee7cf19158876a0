# importing each module registers its criterion with fairseq
from . import label_smoothed_cross_entropy_with_distillation  # noqa: F401
from . import label_smoothed_cross_entropy_with_gate  # noqa: F401
