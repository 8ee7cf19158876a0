"""fairseq's checkpoints, as the plugin reads them.

- torch >= 2.6 reads checkpoints with ``weights_only=True``, which refuses
  any pickled Python object it does not know, and fairseq calls ``torch.load``
  without that argument. fairseq checkpoints hold a few such objects: the
  ``argparse.Namespace`` of legacy (``--arch``) models, numpy scalars/arrays
  where metrics were recorded (e.g. ``--eval-bleu`` with
  ``--best-checkpoint-metric bleu``). Rather than switching the protection
  off, exactly those types are allowed (``safe_globals``; the plugin does so
  when it is imported, ``compat.install``).
- A file torch cannot unpickle: fairseq hands torch's unpickling error (a
  dozen frames of ``torch.serialization``) to the user; here it is one
  ``ConfigError`` naming the file and what is wrong with it
  (``readable_checkpoints``).
- ``--model-overrides`` keys: fairseq sets every key of the dict on a legacy
  model's options, so a misspelt key (``dec_cross_attn_knd``) or one that
  the model's family does not read (``print_cps`` on a hard model) changes
  nothing, silently. For this plugin's models, and fairseq's transformer,
  both are refused in one line naming the key and the closest known ones
  (``checked_overrides``).
- A checkpoint of fairseq's own ``transformer`` family decodes as the
  plugin's ``transformer_soft`` (the same parameters), so that the plugin's
  engine and overrides apply (``plugin_architecture_for``).
- Checkpoints without the plugin: this plugin's models keep their options as
  a plain ``argparse.Namespace``, as fairseq's own do, so a checkpoint needs
  none of the plugin's classes to be read (``plain_args``; until 2026-11 they
  were a ``PluginModelArgs``, which still loads).

The wrappers apply where ``compat`` installs them: in a fairseq command run
with the plugin, and within ``compat.loading()`` (the plugin's
``from_pretrained``).
"""

import argparse
import difflib
import functools
import logging
import os
import re
import traceback

from fairseq import checkpoint_utils

from ..errors import ConfigError

logger = logging.getLogger(__name__)

_PACKAGE = __name__.split(".", 1)[0]
# keys fairseq's hub interface passes along with the user's own
_HUB_KEYS = {"is_vocoder", "generation_args"}


class PluginModelArgs(argparse.Namespace):
    """The options of this plugin's models in checkpoints saved until 2026-11
    (keep this name: those checkpoints refer to it)."""


def plain_args(args):
    """``args`` (a model's options, saved with its checkpoints) as fairseq's
    own ``argparse.Namespace``: readable without this plugin's classes."""
    if type(args) is PluginModelArgs:
        args.__class__ = argparse.Namespace
    return args


def safe_globals():
    """What fairseq checkpoints pickle besides tensors (``startup_hook``), and
    this plugin's former options class."""
    from ..startup_hook import fairseq_safe_globals

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


def model_name_in(cfg, overrides):
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


def is_plugin_class(model_class) -> bool:
    return model_class is not None and model_class.__module__.startswith(_PACKAGE + ".")


@functools.lru_cache(maxsize=None)
def plugin_options():
    """Option names each of this plugin's model classes adds (by class), and
    the names only this plugin knows (not fairseq's own models)."""
    from fairseq.models import MODEL_REGISTRY
    from fairseq.models.lstm import LSTMModel
    from fairseq.models.transformer import TransformerModel

    fairseq_own = _option_names(TransformerModel) | _option_names(LSTMModel)
    per_class = {cls: _option_names(cls) for cls in set(MODEL_REGISTRY.values()) if is_plugin_class(cls)}
    ours = set().union(*per_class.values()) - fairseq_own
    return per_class, frozenset(ours)


@functools.lru_cache(maxsize=None)
def fairseq_transformer_options():
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


def model_class_named(name):
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    return ARCH_MODEL_REGISTRY.get(name) or MODEL_REGISTRY.get(name)


# the plugin's architecture that decodes a checkpoint of fairseq's `transformer`
# family: the same parameters, soft attention unless the overrides say otherwise
# (tests/unit/test_fairseq_transformers.py)
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

    name = model_name_in(cfg, overrides)
    model_class = model_class_named(name)
    if model_class is not TransformerModel:
        if (model_class is not None and issubclass(model_class, TransformerModel)
                and not is_plugin_class(model_class)):  # transformer_align, bart...: fairseq's own additions
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
    unread = [key for key in wanted if key not in per_class[model_class_named(FAIRSEQ_TRANSFORMER_AS)]]
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

    name = name or model_name_in(cfg, overrides)
    model_class = model_class_named(name)
    if "_name" in overrides and model_class is None:
        from fairseq.models import ARCH_MODEL_REGISTRY

        close = difflib.get_close_matches(str(overrides["_name"]), sorted(ARCH_MODEL_REGISTRY), n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ConfigError(f"--model-overrides '_name' {overrides['_name']!r} is no architecture{hint}")
    per_class, ours = plugin_options()
    if is_plugin_class(model_class):
        family = per_class[model_class]
    elif model_class is TransformerModel:
        family = fairseq_transformer_options()
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
                        "for fairseq's generator)", model_name_in(cfg, overrides), plugin_arch)
            model._name = plugin_arch
        settle = getattr(model_class_named(model_name_in(cfg, {})), "settle_overrides", None)
        if settle is not None:
            settle(model, overrides)
        return result

    return overwrite
