"""Which search decodes, and how a decoder step runs (``--decoding-engine``,
a model option: at decoding time ``--model-overrides "{'decoding_engine':
'fairseq'}"`` or the hub's ``decoding_engine='fairseq'``):

- ``auto`` (the default): ``search`` on a CPU, and on CUDA where the GPU
  check has passed (``CUDA_SEARCH_PASSED_AT``); fairseq's generator and step
  on CUDA until then.
- ``search``: the plugin's beam search (``beam_search``: fairseq's
  hypotheses, its own passes over the vocabulary), whose step is the
  ``lineage`` step on a CPU and the ``graph`` step on CUDA.
- ``fairseq`` (``dynamic`` in checkpoints of earlier versions): fairseq's
  generator and its step. Self-attention caches grow by one concatenation
  per step, the beam is reordered into new tensors, finished sentences
  leave the batch.
- ``static``: fairseq's generator over the fixed-shape step
  (``fixed_shape_step``): every step after the first runs the same
  operations on the same tensors.
- ``graph``: ``static``, its layers captured once as a CUDA graph and
  replayed on later steps (CUDA only; elsewhere it runs as ``static``).

``generator_class`` (the package's) picks the search; ``step_of`` the step.
"""

from torch import Tensor

# how a decoder step runs
FAIRSEQS_STEP = "fairseq"  # fairseq's decoder forward, its caches concatenated and reordered
LINEAGE_STEP = "lineage"  # fairseq's forward, attention through the search's lineage (lineage.py)
STATIC_STEP = "static"  # the fixed-shape step
GRAPH_STEP = "graph"  # the fixed-shape step, captured as a CUDA graph
FIXED_SHAPE_STEPS = (STATIC_STEP, GRAPH_STEP)
# the engines whose search is the plugin's (where the step allows)
PLUGIN_SEARCH_ENGINES = ("auto", "search")

# The commit at which scripts/gpu_check.sh last passed on a GPU (its record:
# results/gpu_check/verdict.json); None: it has not. Until it has, ``auto`` on
# CUDA is fairseq's generator and step, which fairseq runs on GPUs; ``search``
# chooses the plugin's search there.
CUDA_SEARCH_PASSED_AT = "1ade96e2f965edbcbb418f40fbfe705f9328c59a"


def on_cuda(models) -> bool:
    """Whether the models decode on a CUDA device."""
    parameter = next((p for model in models for p in model.parameters()), None)
    return parameter is not None and parameter.is_cuda


def cuda_auto_is_fairseqs(engine: str) -> bool:
    """Whether ``engine`` on CUDA decodes with fairseq's generator and step."""
    return engine == "auto" and CUDA_SEARCH_PASSED_AT is None


def step_of(engine: str, tokens: Tensor) -> str:
    """How a step of ``engine`` runs on the device of ``tokens``."""
    if engine in PLUGIN_SEARCH_ENGINES:
        if not tokens.is_cuda:
            return LINEAGE_STEP
        return FAIRSEQS_STEP if cuda_auto_is_fairseqs(engine) else GRAPH_STEP
    return engine  # fairseq, static, graph
