"""Where the plugin works around fairseq's own behaviour, in one place.

Each piece names the fairseq behaviour it changes and is pinned by a test
(``tests/test_fairseq_compat.py``, ``tests/test_synthetic_and_fixes.py``).
``install()`` applies them; importing the plugin (``--user-dir``) calls it.

- Checkpoints on torch >= 2.6: ``torch.load`` defaults to
  ``weights_only=True``, which refuses any pickled Python object it does not
  know, and fairseq calls it without that argument. fairseq checkpoints hold a
  few such objects: the ``argparse.Namespace`` of legacy (``--arch``) models,
  numpy scalars/arrays where metrics were recorded (e.g. ``--eval-bleu`` with
  ``--best-checkpoint-metric bleu``). Rather than switching the protection off
  for every load, we allow exactly those types (``startup_hook``, which does
  the same for fairseq's commands run without this plugin).
- The last batch of a data set: this fairseq build (ve-fairseq 0.12.3,
  upstream main of 2024-10) ends ``data_utils.batch_by_size`` with
  ``if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0: b = b[:-1]``, so with the
  default ``--required-batch-size-multiple 8`` the last batch is dropped
  whenever its size is not a multiple of 8: ``fairseq-generate`` translated and
  scored 96 of 100 test sentences, with no warning. fairseq 0.12.2 kept that
  batch; so do we (the same batching minus the drop; call sites look the
  function up on the module at call time).
- Errors at the top level: fairseq's tools print a full traceback for any
  exception; a ``ConfigError`` (and fairseq's and torch's errors about a
  user's input, ``errors.one_line``) is printed in one line instead, through
  ``sys.excepthook``.
- Checkpoints that cannot be read: fairseq hands torch's unpickling error
  (a dozen frames from ``torch.serialization``) to the user. We raise one
  ``ConfigError`` naming the file and what is wrong with it.
- ``--model-overrides`` keys: fairseq sets every key of the dict on a legacy
  model's options, so a misspelt key (``dec_cross_attn_knd``) or one that this
  model family does not read (``print_cps`` on a hard model) changes nothing,
  silently. For this plugin's models we refuse both, in one line naming the
  key and the closest known ones.
- Checkpoints loaded without the plugin: this plugin's models keep their
  options as a plain ``argparse.Namespace``, as fairseq's own do, so a
  checkpoint needs none of the plugin's classes to be read. (Until 2026-11 they
  were a ``PluginModelArgs``, a Namespace under this plugin's name; such
  checkpoints still load, and are saved plain again.) Without the plugin,
  fairseq names what it cannot build (``Requested model type:
  transformer_hard_dec``) and the training's ``user_dir`` in the options it
  prints.
- ``--no-repeat-ngram-size``: fairseq's Python n-gram blocker (every CPU run,
  and GPU runs of this build, which ships no CUDA extension for it) compares
  the last n-1 entries of the whole preallocated token buffer (padding) with
  the hypothesis, so it bans nothing and the option silently does nothing
  (fairseq issue 5206). We hand it the tokens generated so far.
- Batches ahead: fairseq-generate, the hub and ``--eval-bleu`` iterate a
  ``CountingIterator`` and hand the generator one batch at a time;
  fairseq-interactive iterates its ``make_batches``. Both can now read
  ahead on request and note the batch they yielded last in each thread, so
  that the plugin's search decodes the next batches in worker processes
  meanwhile (``decoding.read_ahead``). What they yield, and its order, is
  unchanged.
- Warnings about fairseq's own use of its libraries (Hydra's deprecated
  APIs, ``torch.cuda.amp.autocast``, ``pin_memory`` without a GPU, torch's
  note on the mask types fairseq's attention passes): two dozen lines on
  every command, none of them about the user's run. We filter exactly those
  messages; every other warning still shows.
"""

import argparse
import difflib
import functools
import logging
import os
import re
import sys
import traceback
import warnings

import numpy
import torch
from fairseq import checkpoint_utils, hub_utils, ngram_repeat_block
from fairseq.models import fairseq_model
from fairseq.data import data_utils

from .errors import ConfigError, report_error

logger = logging.getLogger(__name__)

_PACKAGE = __name__.rsplit(".", 1)[0]
# keys fairseq's hub interface passes along with the user's own
_HUB_KEYS = {"is_vocoder", "generation_args"}


# --- checkpoints ------------------------------------------------------------


class PluginModelArgs(argparse.Namespace):
    """The options of this plugin's models in checkpoints saved until 2026-11
    (keep this name: those checkpoints refer to it)."""


def plain_args(args):
    """``args`` (a model's options, saved with its checkpoints) as fairseq's
    own ``argparse.Namespace``: readable without this plugin's classes."""
    if type(args) is PluginModelArgs:
        args.__class__ = argparse.Namespace
    return args


def _safe_globals():
    """fairseq's (``startup_hook``), and this plugin's former options class."""
    from .startup_hook import fairseq_safe_globals

    return fairseq_safe_globals() + [PluginModelArgs]


def _raised_by_torch_load(error: BaseException) -> bool:
    return any(frame.filename.endswith(os.path.join("torch", "serialization.py"))
               for frame in traceback.extract_tb(error.__traceback__))


def _checkpoints_in(directory, shown=6):
    """' (the .pt files in it, the best and last first)', or that there is none."""
    found = [name for name in os.listdir(directory) if name.endswith(".pt")]
    if not found:
        return " (there is none in it)"
    first = ("checkpoint_best.pt", "checkpoint_last.pt")
    number = lambda name: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
    found = [n for n in first if n in found] + sorted((n for n in found if n not in first), key=number)
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return f" ({', '.join(found[:shown])}{more})"


def readable_checkpoints(load_checkpoint_to_cpu):
    """Wrap fairseq's ``load_checkpoint_to_cpu``: a file torch cannot unpickle
    is a ``ConfigError`` naming it (the torch error chained to it); and both
    checkpoint formats take ``--model-overrides`` alike. fairseq sets the
    overrides of a checkpoint in its older format (options as one
    ``argparse.Namespace``, ``args``) on that Namespace without
    ``overwrite_args_by_name``, where this plugin checks them and maps a
    fairseq transformer to its own architecture, and every later reader
    converts ``args`` again. So ``args`` gives way to the ``cfg`` fairseq
    converts it to, and the overrides act on that ``cfg``, as on today's."""

    @functools.wraps(load_checkpoint_to_cpu)
    def load(path, arg_overrides=None, load_on_all_ranks=False):
        if os.path.isdir(path):
            raise ConfigError(f"the checkpoint {path} is a directory: give a checkpoint file "
                              f"in it{_checkpoints_in(path)}")
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            raise ConfigError(f"the checkpoint {path} is an empty file")
        try:
            state = load_checkpoint_to_cpu(path, None, load_on_all_ranks)
        except Exception as error:
            if isinstance(error, ConfigError) or not _raised_by_torch_load(error):
                raise
            detail = str(error).strip().splitlines()[0].split(". ")[0] if str(error).strip() else ""
            raise ConfigError(
                f"cannot read the checkpoint {path}: it is truncated or not a fairseq "
                f"checkpoint ({type(error).__name__}{': ' + detail[:160] if detail else ''})"
            ) from error
        if state.get("args") is not None:  # converted to state["cfg"] by fairseq's upgrade
            state["args"] = None
        if arg_overrides is not None:
            checkpoint_utils.overwrite_args_by_name(state["cfg"], arg_overrides)
        return state

    return load


# --- --model-overrides ------------------------------------------------------


def _model_name(cfg, overrides):
    if overrides.get("_name"):
        return overrides["_name"]
    model = cfg.get("model") if hasattr(cfg, "get") else None
    if model is None:
        return None
    return getattr(model, "_name", None) or getattr(model, "arch", None)


def _option_names(model_class):
    parser = argparse.ArgumentParser(add_help=False)
    model_class.add_args(parser)
    return set(vars(parser.parse_known_args([])[0]))


def _is_plugin(model_class) -> bool:
    return model_class is not None and model_class.__module__.startswith(_PACKAGE + ".")


@functools.lru_cache(maxsize=None)
def plugin_options():
    """Option names each of this plugin's model classes adds (by class), and
    the names only this plugin knows (not fairseq's own models)."""
    from fairseq.models import MODEL_REGISTRY
    from fairseq.models.lstm import LSTMModel
    from fairseq.models.transformer import TransformerModel

    fairseq_own = _option_names(TransformerModel) | _option_names(LSTMModel)
    per_class = {cls: _option_names(cls) for cls in set(MODEL_REGISTRY.values()) if _is_plugin(cls)}
    ours = set().union(*per_class.values()) - fairseq_own
    return per_class, frozenset(ours)


@functools.lru_cache(maxsize=None)
def _fairseq_transformer_options():
    from fairseq.models.transformer import TransformerModel

    return frozenset(_option_names(TransformerModel))


@functools.lru_cache(maxsize=None)
def _registry_fields():
    """Option names of fairseq's registered components (bpe, tokenizer, ...)."""
    from fairseq.registry import REGISTRIES

    names = set(REGISTRIES)
    for registry in REGISTRIES.values():
        for dataclass in registry["dataclass_registry"].values():
            names.update(getattr(dataclass, "__dataclass_fields__", {}))
    return frozenset(names)


def _config_keys(cfg):
    keys = set(cfg.keys())
    for group in cfg.values():
        if isinstance(group, argparse.Namespace):
            keys.update(vars(group))
        elif hasattr(group, "keys"):
            keys.update(group.keys())
    return keys


def _model_class(name):
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    return ARCH_MODEL_REGISTRY.get(name) or MODEL_REGISTRY.get(name)


# the plugin's architecture that decodes a checkpoint of fairseq's `transformer`
# family: the same parameters, soft attention unless the overrides say otherwise
# (tests/test_fairseq_transformers.py)
FAIRSEQ_TRANSFORMER_AS = "transformer_soft"
# fairseq transformer options the plugin's layers do not build as fairseq does
FAIRSEQ_ONLY_OPTIONS = {"cross_self_attention": "--cross-self-attention (fairseq's own)"}


def plugin_architecture_for(cfg, overrides):
    """For a checkpoint of fairseq's own ``TransformerModel`` (every preset of
    its ``transformer`` family) decoded with overrides (fairseq-generate,
    -interactive, the hub): the plugin architecture that decodes it
    (``FAIRSEQ_TRANSFORMER_AS``), so that the plugin's engine decodes it and
    the overrides apply; None otherwise, or where the checkpoint uses an
    option the plugin's layers lack (``FAIRSEQ_ONLY_OPTIONS``: fairseq's
    model and generator then, said in one line)."""
    from fairseq.models.transformer import TransformerModel

    name = _model_name(cfg, overrides)
    model_class = _model_class(name)
    if model_class is not TransformerModel:
        if (model_class is not None and issubclass(model_class, TransformerModel)
                and not _is_plugin(model_class)):  # transformer_align, bart...: fairseq's own additions
            logger.info("the checkpoint is fairseq's %s, which the plugin's engine does not build (what "
                        "it adds to the transformer): decoding with fairseq's model and generator", name)
        return None
    per_class, ours = plugin_options()
    model = cfg.get("model") if hasattr(cfg, "get") else None
    lacking = [what for option, what in FAIRSEQ_ONLY_OPTIONS.items()
               if overrides.get(option, getattr(model, option, False))]
    wanted = sorted(key for key in overrides if key in ours)
    if lacking:
        if wanted:
            raise ConfigError(f"--model-overrides {wanted[0]!r}: the checkpoint uses {lacking[0]}, which the "
                              f"plugin's models do not build; decode it without the plugin's options")
        logger.info("the checkpoint uses %s, which the plugin's engine lacks: decoding with fairseq's "
                    "model and generator", lacking[0])
        return None
    unread = [key for key in wanted if key not in per_class[_model_class(FAIRSEQ_TRANSFORMER_AS)]]
    if unread:
        users = sorted(cls.__name__ for cls, names in per_class.items() if unread[0] in names)
        raise ConfigError(
            f"--model-overrides key {unread[0]!r} does not apply to a fairseq transformer checkpoint "
            f"(options of {', '.join(users)}); its parameters lack that family's, so train or "
            f"fine-tune that family from it (--finetune-from-model)")
    return FAIRSEQ_TRANSFORMER_AS


def check_model_overrides(cfg, overrides, name=None):
    """Raise ``ConfigError`` for an override key of one of this plugin's models
    (or of fairseq's own transformer) that nothing reads, or that its family
    does not read. ``name``: the architecture that will be built, if not the
    checkpoint's."""
    from fairseq.models.transformer import TransformerModel

    name = name or _model_name(cfg, overrides)
    model_class = _model_class(name)
    if "_name" in overrides and model_class is None:
        from fairseq.models import ARCH_MODEL_REGISTRY

        close = difflib.get_close_matches(str(overrides["_name"]), sorted(ARCH_MODEL_REGISTRY), n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ConfigError(f"--model-overrides '_name' {overrides['_name']!r} is no architecture{hint}")
    per_class, ours = plugin_options()
    if _is_plugin(model_class):
        family = per_class[model_class]
    elif model_class is TransformerModel:
        family = _fairseq_transformer_options()
    else:
        return
    known = _config_keys(cfg) | _registry_fields() | ours | family | _HUB_KEYS | {"_name"}
    for key in overrides:
        if key in ours and key not in family:
            users = sorted(cls.__name__ for cls, names in per_class.items() if key in names)
            raise ConfigError(f"--model-overrides key {key!r} does not apply to {name} "
                              f"(options of {', '.join(users)})")
        if key not in known:
            close = difflib.get_close_matches(key, sorted(ours | family), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ConfigError(f"--model-overrides key {key!r} is no option of {name}{hint}")


def checked_overrides(overwrite_args_by_name):
    """Wrap fairseq's ``overwrite_args_by_name`` as ``load_checkpoint_to_cpu``
    calls it: the checkpoint's configuration, before the overrides."""

    @functools.wraps(overwrite_args_by_name)
    def overwrite(cfg, overrides):
        plugin_arch = plugin_architecture_for(cfg, overrides)
        check_model_overrides(cfg, overrides, plugin_arch)
        result = overwrite_args_by_name(cfg, overrides)
        model = cfg.get("model") if hasattr(cfg, "get") else None
        if not isinstance(model, argparse.Namespace):
            return result
        if plugin_arch is not None:
            # the model group only: an `_name` override would rename every group (the task's too)
            logger.info("decoding the fairseq %s checkpoint as the plugin's %s (the same parameters: "
                        "the plugin's engine; --model-overrides \"{'decoding_engine': 'fairseq'}\" "
                        "for fairseq's generator)", _model_name(cfg, overrides), plugin_arch)
            model._name = plugin_arch
        settle = getattr(_model_class(_model_name(cfg, {})), "settle_overrides", None)
        if settle is not None:
            settle(model, overrides)
        return result

    return overwrite


# --- the last batch of a data set -------------------------------------------

_fairseq_batch_by_size = data_utils.batch_by_size


def batch_by_size(
    indices,
    num_tokens_fn,
    num_tokens_vec=None,
    max_tokens=None,
    max_sentences=None,
    required_batch_size_multiple=1,
    fixed_shapes=None,
):
    if fixed_shapes is not None or required_batch_size_multiple <= 1:
        return _fairseq_batch_by_size(
            indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
            required_batch_size_multiple, fixed_shapes,
        )
    from fairseq.data.data_utils_fast import batch_by_size_fn, batch_by_size_vec

    max_tokens = int(max_tokens) if max_tokens is not None else -1
    max_sentences = max_sentences if max_sentences is not None else -1
    if not isinstance(indices, numpy.ndarray):
        indices = numpy.fromiter(indices, dtype=numpy.int64, count=-1)
    if num_tokens_vec is None:
        return batch_by_size_fn(
            indices, num_tokens_fn, max_tokens, max_sentences,
            required_batch_size_multiple,
        )
    if not isinstance(num_tokens_vec, numpy.ndarray):
        num_tokens_vec = numpy.fromiter(num_tokens_vec, dtype=numpy.int64, count=-1)
    return batch_by_size_vec(
        indices, num_tokens_vec, max_tokens, max_sentences,
        required_batch_size_multiple,
    )


# --- n-gram blocking ----------------------------------------------------------


def generated_tokens_only(no_repeat_ngram):
    """Wrap ``NGramRepeatBlock._no_repeat_ngram``: it reads the last n-1
    tokens of what it is given, so give it the tokens up to this step."""
    @functools.wraps(no_repeat_ngram)
    def blocked(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        return no_repeat_ngram(self, tokens[:, : step + 1], lprobs, bsz, beam_size, step)
    return blocked


# --- first contact: half precision, the hub, interactive, the command line ---


def cpu_precision_checked(prepare_for_inference):
    """Wrap ``BaseFairseqModel.prepare_for_inference_``, which fairseq-generate,
    fairseq-interactive and the hub call on every model before decoding:
    ``--fp16`` without a GPU would decode in half precision on the CPU (other
    hypotheses, several times slower) and ``--bf16`` is not applied by
    fairseq's decoding tools at all; both stop in one line instead."""

    @functools.wraps(prepare_for_inference)
    def prepare(self, cfg):
        common = getattr(cfg, "common", None)
        on_cpu = getattr(common, "cpu", False) or not torch.cuda.is_available()
        if getattr(common, "fp16", False) and on_cpu:
            raise ConfigError("--fp16 needs a CUDA GPU to decode (on the CPU fairseq would decode in "
                              "half precision: other hypotheses, several times slower): decode "
                              "without --fp16")
        if getattr(common, "bf16", False):
            raise ConfigError("--bf16 is not applied by fairseq's decoding tools (they decode in "
                              "float32, or in float16 with --fp16 on a GPU): decode without --bf16")
        return prepare_for_inference(self, cfg)

    return prepare


def _check_hub_data(model_dir, data):
    """``data_name_or_path`` as fairseq resolves it (a path starting with '.'
    is relative to the model directory): a data directory, or an archive of
    one."""
    if not isinstance(data, str) or data.startswith(("http://", "https://")):
        return
    path = os.path.join(model_dir, data) if data.startswith(".") else data
    if not os.path.exists(path):
        raise ConfigError(f"from_pretrained: no data directory {path!r} (data_name_or_path: the "
                          "directory fairseq-preprocess wrote, with the dict.*.txt files)")
    if os.path.isfile(path):
        import tarfile

        if not tarfile.is_tarfile(path):
            raise ConfigError(f"from_pretrained: data_name_or_path {path!r} is a file, not a data "
                              "directory (the one fairseq-preprocess wrote) or an archive of one")


def hub_paths_checked(from_pretrained):
    """Wrap fairseq's ``hub_utils.from_pretrained``: a model directory,
    checkpoint or data directory that does not exist (or is a plain file) is
    one ``ConfigError`` naming it (fairseq fails with a ``TypeError`` about
    ``None``, or tarfile's ``ReadError: empty file``)."""

    @functools.wraps(from_pretrained)
    def load(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
             archive_map=None, **kwargs):
        if (isinstance(model_name_or_path, str) and not (archive_map and model_name_or_path in archive_map)
                and not model_name_or_path.startswith(("http://", "https://"))):
            if not os.path.exists(model_name_or_path):
                raise ConfigError(f"from_pretrained: no model directory {model_name_or_path!r}")
            missing = [name for name in checkpoint_file.split(os.pathsep)
                       if not os.path.isfile(os.path.join(model_name_or_path, name))]
            if missing:
                found = sorted(n for n in os.listdir(model_name_or_path) if n.endswith(".pt"))
                raise ConfigError(f"from_pretrained: no checkpoint_file {missing[0]!r} in "
                                  f"{model_name_or_path} (it has: {', '.join(found) or 'no .pt file'})")
            _check_hub_data(model_name_or_path, data_name_or_path)
        return from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, archive_map,
                               **kwargs)

    return load


def _sentences_checked(method, sentences):
    """``sentences`` as the hub's ``translate`` / ``sample`` take them (a str,
    or a list of str: any iterable of str, read once); else a ``TypeError``
    naming what was passed."""
    accepted = "a str or a list of str"
    if isinstance(sentences, str):
        return sentences
    if isinstance(sentences, (bytes, bytearray)):
        raise TypeError(f"{method}: expects {accepted}, got {type(sentences).__name__} "
                        f"({bytes(sentences[:40])!r}): decode it first, e.g. .decode('utf-8')")
    try:
        sentences = list(sentences)
    except TypeError:
        raise TypeError(f"{method}: expects {accepted}, got {type(sentences).__name__} "
                        f"({sentences!r:.60})") from None
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"{method}: sentence {i + 1} of {len(sentences)} is "
                            f"{type(sentence).__name__} ({sentence!r:.60}), not a str "
                            f"(it expects {accepted})")
    return sentences


def hub_sentences_checked(method):
    """Wrap the hub's ``translate`` and ``sample``: fairseq iterates whatever
    it is given, so bytes became one translation per byte, a None in a list
    was translated as a sentence, and None or a number failed with a bare
    ``'NoneType' object is not iterable``. Anything but a str or a list of str
    is now a ``TypeError`` naming what was passed."""

    @functools.wraps(method)
    def checked(self, sentences, *args, **kwargs):
        return method(self, _sentences_checked(method.__name__, sentences), *args, **kwargs)

    return checked


def _source_positions(max_positions):
    if isinstance(max_positions, (tuple, list)):
        return max_positions[0]
    return max_positions


def long_lines_skipped(make_batches):
    """Wrap fairseq-interactive's ``make_batches``: a line longer than the
    model's source positions ended the whole session ("Size of sample #0 is
    invalid") and the lines after it were never translated. Such a line is
    now named in one line on stderr and skipped; the session goes on."""
    lines_read = [0]  # across the calls of this session, for the line numbers

    @functools.wraps(make_batches)
    def batches(lines, cfg, task, max_positions, encode_fn):
        first_line, lines_read[0] = lines_read[0], lines_read[0] + len(lines)
        limit = _source_positions(max_positions)
        if limit is not None:
            _, lengths = task.get_interactive_tokens_and_lengths(lines, encode_fn)
            too_long = [(i, n) for i, n in enumerate(lengths) if n > limit]
            for i, n in too_long:
                print(f"fairseq-hardattn: error: input line {first_line + i + 1} has {n} tokens, more "
                      f"than the model's {limit} source positions: not translated", file=sys.stderr,
                      flush=True)
            if too_long and not cfg.dataset.skip_invalid_size_inputs_valid_test:
                # fairseq's own filter drops them, keeping every other line's id
                from omegaconf import open_dict

                with open_dict(cfg):
                    cfg.dataset.skip_invalid_size_inputs_valid_test = True
                try:
                    yield from make_batches(lines, cfg, task, max_positions, encode_fn)
                finally:
                    with open_dict(cfg):
                        cfg.dataset.skip_invalid_size_inputs_valid_test = False
                return
        yield from make_batches(lines, cfg, task, max_positions, encode_fn)

    return batches


def read_ahead(make_batches):
    """fairseq-interactive's batches, able to read ahead (``workers``)."""

    from .decoding.read_ahead import InteractiveBatches

    @functools.wraps(make_batches)
    def batches(*args, **kwargs):
        return InteractiveBatches(make_batches(*args, **kwargs))

    return batches


def plugin_search_routed(build_generator):
    """Wrap ``FairseqTask.build_generator``, through which fairseq-generate,
    fairseq-interactive, ``--eval-bleu`` and the hub get their generator:
    this plugin's models decode with its beam search where they ask for it
    (``--decoding-engine``) and it supports the options
    (``decoding.generator_class``); everything else as fairseq builds it."""

    @functools.wraps(build_generator)
    def build(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
              prefix_allowed_tokens_fn=None):
        beam = getattr(args, "beam", 1)
        if beam < 1:  # fairseq fails mid-search ("cannot reshape tensor of 0 elements")
            raise ConfigError(f"--beam must be >= 1, got {beam}")
        if seq_gen_cls is None:
            from .decoding import generator_class

            chosen = generator_class(models, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
            if chosen is not None:
                seq_gen_cls, extra_gen_cls_kwargs = chosen
        return build_generator(self, models, args, seq_gen_cls=seq_gen_cls,
                               extra_gen_cls_kwargs=extra_gen_cls_kwargs,
                               prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)

    return build


def _is_fairseq_parser(parser) -> bool:
    return any("--user-dir" in action.option_strings for action in parser._actions)


def _nearest(word, choices):
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def one_line_usage_errors(error):
    """Wrap ``argparse.ArgumentParser.error`` for fairseq's parsers (those
    with ``--user-dir``): a misspelt ``--arch`` printed the whole usage and a
    line of every architecture, an unknown option the usage before the
    message. One line instead, with the nearest names."""

    @functools.wraps(error)
    def one_line(self, message):
        if not _is_fairseq_parser(self):
            return error(self, message)
        choice = re.match(r"argument (\S+): invalid choice: '(.*?)' \(choose from (.*)\)$", message, re.S)
        if choice:
            option, value, choices = choice.groups()
            names = re.findall(r"'([^']*)'", choices)
            option = option.split("/")[0]
            hint = _nearest(value, names) or (f"; choose one of: {', '.join(names)}" if len(names) <= 12 else "")
            message = f"unknown {option} {value!r}{hint}"
        elif message.startswith("unrecognized arguments: "):
            options = sorted(o for action in self._actions for o in action.option_strings)
            unknown = message.split(": ", 1)[1].split()
            hints = "".join(_nearest(u, options) for u in unknown if u.startswith("-"))
            message = f"unrecognized arguments: {' '.join(unknown)}{hints}"
        self.exit(2, f"fairseq-hardattn: error: {message} (--help lists the options)\n")

    return one_line


def _arch_in(argv):
    for i, arg in enumerate(argv):
        if arg in ("--arch", "-a") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--arch="):
            return arg.split("=", 1)[1]
    return None


def model_options_in_help(parse_known_args):
    """Wrap ``argparse.ArgumentParser.parse_known_args`` for fairseq's parsers:
    fairseq adds a model's options to its parser only after a first parse,
    which ``--help`` ends, so ``fairseq-train --arch A --help`` listed none
    of them. For this plugin's architectures they are added before that
    parse, in two groups: fairseq's Transformer options and this plugin's."""

    @functools.wraps(parse_known_args)
    def parse(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        if (_is_fairseq_parser(self) and ("-h" in argv or "--help" in argv)
                and not getattr(self, "_fairseq_hardattn_model_help", False)):
            model_class = _model_class(_arch_in(argv))
            if _is_plugin(model_class):
                self._fairseq_hardattn_model_help = True
                every = argparse.ArgumentParser(add_help=False)
                model_class.add_args(every)
                fairseq_own = _fairseq_transformer_options()
                groups = (self.add_argument_group("Model configuration (fairseq's Transformer)"),
                          self.add_argument_group(f"Model configuration (fairseq-hardattn, "
                                                  f"{_arch_in(argv)})"))
                for action in every._actions:
                    groups[action.dest not in fairseq_own]._add_action(action)
        if (_is_fairseq_parser(self) and "--beam" in self._option_string_actions
                and ("-h" in argv or "--help" in argv)
                and not getattr(self, "_fairseq_hardattn_decoding_help", False)):
            self._fairseq_hardattn_decoding_help = True
            _add_decoding_options_help(self)
        return parse_known_args(self, args, namespace)

    return parse


def _add_decoding_options_help(parser):
    """A group after fairseq's "Generation" options that lists the plugin's
    decoding settings, shown as the ``--model-overrides`` keys they are (not
    options of this command: the command would refuse them)."""
    from .models.decoding_options import DECODING_OPTIONS

    every = argparse.ArgumentParser(add_help=False)
    _model_class(FAIRSEQ_TRANSFORMER_AS).add_args(every)
    actions = {action.dest: action for action in every._actions}
    group = parser.add_argument_group(
        "fairseq-hardattn decoding (with the plugin loaded)",
        "settings of the plugin's models, given as --model-overrides keys, e.g. "
        "--model-overrides \"{'decoding_workers': 1, 'int8_decoding': True}\" (the hub: keywords "
        "of from_pretrained)")
    for dest in DECODING_OPTIONS:
        action = actions[dest]
        metavar = "True" if action.nargs == 0 else action.metavar
        group._add_action(argparse._StoreAction([f"'{dest}':"], dest=f"_help_{dest}", metavar=metavar,
                                                choices=action.choices, help=action.help))
    groups = parser._action_groups  # listed after fairseq's generation options
    groups.remove(group)
    after = next((i + 1 for i, g in enumerate(groups) if g.title == "Generation"), len(groups))
    groups.insert(after, group)


# --- noise ------------------------------------------------------------------

# (category, message pattern) of warnings about fairseq's own code
FAIRSEQ_NOISE = (
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental"),
    (UserWarning, r"\s*The version_base parameter is not specified"),
    (UserWarning, r"In '\w+': Usage of deprecated keyword in package header"),
    (UserWarning, r"\s*'\w+' is validated against ConfigStore schema"),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated"),
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated"),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found"),
    (UserWarning, r"Support for mismatched key_padding_mask and attn_mask is deprecated"),
)


def quiet_fairseq_noise():
    for category, message in FAIRSEQ_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    # Hydra's debug lines ("Setting JobRuntime") while fairseq composes its config
    logging.getLogger("hydra").setLevel(logging.INFO)


# --- installation -----------------------------------------------------------


def _wrap(module, name, wrapper):
    function = getattr(module, name)
    if not getattr(function, "_fairseq_hardattn", False):
        wrapped = wrapper(function)
        wrapped._fairseq_hardattn = True
        setattr(module, name, wrapped)


def install():
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
        torch.serialization.add_safe_globals(_safe_globals())
    data_utils.batch_by_size = batch_by_size
    if sys.excepthook is not report_error:
        sys.excepthook = report_error
    quiet_fairseq_noise()
    _wrap(checkpoint_utils, "load_checkpoint_to_cpu", readable_checkpoints)
    _wrap(checkpoint_utils, "overwrite_args_by_name", checked_overrides)
    _wrap(ngram_repeat_block.NGramRepeatBlock, "_no_repeat_ngram", generated_tokens_only)
    _wrap(fairseq_model.BaseFairseqModel, "prepare_for_inference_", cpu_precision_checked)
    _wrap(hub_utils, "from_pretrained", hub_paths_checked)
    for method in ("translate", "sample"):
        _wrap(hub_utils.GeneratorHubInterface, method, hub_sentences_checked)
    from fairseq.tasks import FairseqTask

    _wrap(FairseqTask, "build_generator", plugin_search_routed)
    _wrap(argparse.ArgumentParser, "error", one_line_usage_errors)
    _wrap(argparse.ArgumentParser, "parse_known_args", model_options_in_help)
    import fairseq_cli.interactive

    _wrap(fairseq_cli.interactive, "make_batches",
          lambda make_batches: read_ahead(long_lines_skipped(make_batches)))
    from fairseq.data import iterators

    from .decoding.read_ahead import counting_iterator_lookahead

    if not hasattr(iterators.CountingIterator, "take_ahead"):
        counting_iterator_lookahead(iterators.CountingIterator)
    from . import command_line

    if command_line.running_a_fairseq_command():
        command_line.install()
