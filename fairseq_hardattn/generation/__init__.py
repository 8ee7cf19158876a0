"""Generation: the plugin's beam search (``beam_search``) and which generator
fairseq's tools get (``generator_class``): fairseq-generate,
fairseq-interactive, ``--eval-bleu`` and the hub all build theirs through
``task.build_generator``, which ``fairseq_compat`` routes here."""

import logging

from ..models import decoding_engine
from .beam_search import PluginBeamSearch, PluginBeamSearchWithAlignment, fallback_reason

logger = logging.getLogger(__name__)

# the --decoding-engine values whose search is the plugin's
PLUGIN_SEARCH_ENGINES = ("auto", "search")


def engine_of(model):
    """A model's ``--decoding-engine``; None for a model not of this plugin."""
    return getattr(getattr(model, "decoder", None), "decoding_engine", None)


def wants_plugin_search(models) -> bool:
    """Every model is one of this plugin's, set to decode with its search."""
    return bool(models) and all(engine_of(model) in PLUGIN_SEARCH_ENGINES for model in models)


def on_cuda(models) -> bool:
    """Whether the models decode on a CUDA device."""
    parameter = next((p for model in models for p in model.parameters()), None)
    return parameter is not None and parameter.is_cuda


def generator_class(models, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
    """(the generator class, its extra keyword arguments) for ``models`` and
    the generation options ``args``, or None for fairseq's choice."""
    if getattr(args, "score_reference", False) or not wants_plugin_search(models):
        return None
    if on_cuda(models) and any(decoding_engine.cuda_auto_is_fairseqs(engine_of(m)) for m in models):
        logger.info("on CUDA the plugin's search has not passed its GPU check (scripts/gpu_check.sh) "
                    "at this version: decoding with fairseq's generator; --model-overrides "
                    "\"{'decoding_engine': 'search'}\" (hub: decoding_engine='search') for the plugin's")
        return None
    reason = fallback_reason(models, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
    if reason is not None:
        logger.info("the plugin's beam search does not run %s: decoding with fairseq's generator",
                    reason)
        return None
    extra = dict(extra_gen_cls_kwargs or {})
    if getattr(args, "print_alignment", False):
        extra["print_alignment"] = args.print_alignment
        extra["aligned_nbest"] = max(1, getattr(args, "nbest", 1) or 1)
        return PluginBeamSearchWithAlignment, extra
    return PluginBeamSearch, extra


__all__ = ["PluginBeamSearch", "PluginBeamSearchWithAlignment", "fallback_reason", "generator_class",
           "wants_plugin_search"]
