"""The decoding engine: everything that makes decoding fast, apart from the
mechanisms it decodes (``modules/``, ``models/``, which import nothing
from here).

- ``generator_class``: which generator fairseq's tools get (fairseq-generate,
  fairseq-interactive, ``--eval-bleu`` and the hub all build theirs through
  ``task.build_generator``, which the plugin routes here): the plugin's beam
  search (``beam_search``) where every model is the plugin's and the options
  are ones it runs, fairseq's generator otherwise;
- ``engines``: ``--decoding-engine`` and the step each engine runs;
- the steps: ``lineage`` (the search's on a CPU, one kernel call per
  attention sublayer), ``fixed_shape_step`` (static, or a CUDA graph);
- ``workers`` (batches at once in forked processes, ``read_ahead`` of
  fairseq's iterators), ``int8`` and ``packed_linear`` (Linear layers for a
  CPU).

The engine meets the models through ``modules/decoding_step.py``: it keeps
one ``DecodingCall`` per decoding call, and ``ENGINE`` (registered there on
import) runs a decoder's fixed-shape step and prepares a model for decoding.
"""

import logging

from .. import kernels
from ..compat import batches as fairseq_batches
from ..errors import ConfigError
from ..modules import decoding_step
from . import engines, fixed_shape_step, native_search, read_ahead
from .beam_search import PluginBeamSearch, PluginBeamSearchWithAlignment, fallback_reason
from .bf16 import check_bf16_decoding, to_bf16_for_decoding
from .int8 import check_int8_decoding, quantize_for_decoding
from .shortlist import Shortlist
from .workers import import_what_the_first_batch_imports

logger = logging.getLogger(__name__)

# fairseq-interactive's batches, read ahead for the workers in a command run with the plugin
fairseq_batches.register_read_ahead(read_ahead.InteractiveBatches)


def engine_of(model):
    """A model's ``--decoding-engine``; None for a model not of this plugin."""
    return getattr(getattr(model, "decoder", None), "decoding_engine", None)


def wants_plugin_search(models) -> bool:
    """Every model is one of this plugin's, set to decode with its search."""
    return bool(models) and all(engine_of(model) in engines.PLUGIN_SEARCH_ENGINES for model in models)


def generator_class(models, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
    """(the generator class, its extra keyword arguments) for ``models`` and
    the generation options ``args``, or None for fairseq's choice. A model
    with a shortlist decodes with the plugin's search, or not at all."""
    chosen = _generator_class(models, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
    shortlisted = [m for m in models if getattr(m, "shortlist", None) is not None]
    if shortlisted and (chosen is None or len(shortlisted) != len(models)):
        raise ConfigError("a shortlist decodes with the plugin's search only (every model of an ensemble "
                          "with one), which these options do not run: "
                          f"{fallback_reason(models, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn) or 'the engine, or --score-reference'}")
    if shortlisted and getattr(args, "no_repeat_ngram_size", 0) > 0:
        raise ConfigError("a shortlist and --no-repeat-ngram-size exclude each other: choose one")
    return chosen


def _generator_class(models, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
    if getattr(args, "score_reference", False) or not wants_plugin_search(models):
        return None
    if engines.on_cuda(models) and any(engines.cuda_auto_is_fairseqs(engine_of(m)) for m in models):
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
    if getattr(args, "sampling", False) and getattr(args, "seed", None) is not None:
        extra["seed"] = args.seed  # the hub's seed=; commands seed torch with --seed
    if getattr(args, "print_alignment", False):
        extra["print_alignment"] = args.print_alignment
        extra["aligned_nbest"] = max(1, getattr(args, "nbest", 1) or 1)
        return PluginBeamSearchWithAlignment, extra
    return PluginBeamSearch, extra


def attach_to_task(task):
    """The task that built a model of the plugin decodes with the engine: its
    ``build_generator`` (through which fairseq-generate, fairseq-interactive,
    ``--eval-bleu`` and the hub get their generator) builds the plugin's
    search where ``generator_class`` chooses it, and its batch iterators read
    ahead (``read_ahead``). This task object only: fairseq's classes are
    unchanged."""
    build_generator = getattr(task, "build_generator", None)
    if build_generator is None or getattr(task, "_fairseq_hardattn_engine", False):
        return  # not a fairseq task, or attached already
    task._fairseq_hardattn_engine = True

    def build(models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
        beam = getattr(args, "beam", 1)
        if beam < 1:  # fairseq fails mid-search ("cannot reshape tensor of 0 elements")
            raise ConfigError(f"--beam must be >= 1, got {beam}")
        if seq_gen_cls is None:
            chosen = generator_class(models, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
            if chosen is not None:
                seq_gen_cls, extra_gen_cls_kwargs = chosen
        return build_generator(models, args, seq_gen_cls=seq_gen_cls,
                               extra_gen_cls_kwargs=extra_gen_cls_kwargs,
                               prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)

    task.build_generator = build
    read_ahead.attach(task)


class Engine:
    """What the engine does for a model of the plugin (``decoding_step.StepEngine``)."""

    def decoder_step(self, decoder, tokens, encoder_out, incremental_state, features_only):
        step = engines.step_of(decoder.decoding_engine, tokens)
        if step not in engines.FIXED_SHAPE_STEPS:
            return None
        return fixed_shape_step.step(decoder, tokens, encoder_out, incremental_state, step,
                                     features_only)

    def reordered(self, incremental_state, new_order):
        fixed_shape_step.reordered(incremental_state, new_order)

    def model_built(self, model, task):
        if task is not None:
            attach_to_task(task)

    def prepare_for_inference(self, model, cfg):
        """int8 or bfloat16 Linear layers and a shortlist where the model's
        options ask for them (``int8_decoding``, ``bf16_decoding``,
        ``shortlist``), and what the first batch would import, imported now."""
        kernels.native()  # (built or loaded now, not by the first batch)
        if getattr(model.args, "int8_decoding", False):
            check_int8_decoding(model, cfg)
            quantize_for_decoding(model)
        if getattr(model.args, "bf16_decoding", False):
            check_bf16_decoding(model, cfg)
            to_bf16_for_decoding(model)
        path = getattr(model.args, "shortlist", None)
        if path and getattr(model, "shortlist", None) is None:
            model.shortlist = Shortlist.load(path, model.encoder.dictionary, model.decoder.dictionary,
                                             getattr(model.args, "shortlist_k", None))
        import_what_the_first_batch_imports(fairseq_encodes=not native_search.takes(model))


ENGINE = Engine()
decoding_step.set_step_engine(ENGINE)

__all__ = ["ENGINE", "PluginBeamSearch", "PluginBeamSearchWithAlignment", "attach_to_task",
           "fallback_reason", "generator_class", "wants_plugin_search"]
