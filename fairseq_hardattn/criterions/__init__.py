from . import label_smoothed_cross_entropy_with_gate  # noqa: F401  (registers it)
