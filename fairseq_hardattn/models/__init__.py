from . import hard_retrieval_transformer  # noqa: F401  (registers the models)
