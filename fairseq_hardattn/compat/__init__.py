"""Where the plugin works around fairseq's own behaviour, by concern
(``checkpoints``, ``batches``, ``generation``, ``text``, ``command_line``, ``hub``):
each part says which fairseq behaviour it changes and why, and is pinned by a
test (``tests/command_line/test_fairseq_compat.py`` and the first-contact tests).

What applies when:

- importing the plugin (``--user-dir``, ``import fairseq_hardattn``, the
  hub): only ``install``: torch may read the types fairseq checkpoints
  pickle (``checkpoints.safe_globals``). No function of argparse, sys or
  fairseq is replaced.
- a fairseq console script run with the plugin (fairseq-generate,
  fairseq-train, ``python -m fairseq_cli.generate`` ...):
  ``install_for_command_line`` replaces fairseq's functions where they fail
  a user (checkpoints and overrides, the last batch, fairseq-generate's
  shards and fairseq-interactive's refused, n-gram blocking, half
  precision on a CPU, fairseq-interactive's lines, the cost of the text
  read and printed) and installs the
  command's one-line errors, help, signal handling and quiet warnings.
- ``loading()``: the checkpoint checks around one load, undone after it
  (``fairseq_hardattn.from_pretrained``).

The plugin's engine attaches itself to the objects it decodes with (the
task that builds a plugin model: ``decoding.attach_to_task``), never to
fairseq's classes.
"""

import argparse
import contextlib
import sys

import torch
from fairseq import checkpoint_utils, ngram_repeat_block
from fairseq.data import data_utils, dictionary
from fairseq.models import fairseq_model
from fairseq.tasks import fairseq_task

from ..errors import report_error
from . import batches, checkpoints, command_line, generation, text
from .checkpoints import plain_args  # noqa: F401  (the models' options as they are saved)
from .command_line import running_a_fairseq_command

_MARK = "_fairseq_hardattn"


def _wrap(owner, name, wrapper):
    """Replace ``owner.name`` by ``wrapper`` of it (once); returns the original."""
    function = getattr(owner, name)
    if getattr(function, _MARK, False):
        return getattr(function, "__wrapped__", function)
    wrapped = wrapper(function)
    setattr(wrapped, _MARK, True)
    setattr(owner, name, wrapped)
    return function


def install():
    """At import: fairseq checkpoints readable under torch >= 2.6."""
    if hasattr(torch.serialization, "add_safe_globals"):  # torch >= 2.4
        torch.serialization.add_safe_globals(checkpoints.safe_globals())


# (owner, attribute, wrapper) of the checkpoint checks: ``loading`` and commands
_LOADING = ((checkpoint_utils, "load_checkpoint_to_cpu", checkpoints.readable_checkpoints),
            (checkpoint_utils, "overwrite_args_by_name", checkpoints.checked_overrides))


@contextlib.contextmanager
def loading():
    """The checkpoint checks (``checkpoints``) for the loads made within, and
    fairseq's functions as they were after (unless a command installed the
    checks for good)."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in _LOADING]
    for owner, name, wrapper in _LOADING:
        _wrap(owner, name, wrapper)
    try:
        yield
    finally:
        if not _installed_for_command_line:
            for owner, name, function in originals:
                setattr(owner, name, function)


_installed_for_command_line = False


def install_for_command_line():
    """Everything above, for the fairseq command this process runs."""
    global _installed_for_command_line
    if _installed_for_command_line:
        return
    _installed_for_command_line = True
    for owner, name, wrapper in _LOADING:
        _wrap(owner, name, wrapper)
    data_utils.batch_by_size = batches.batch_by_size
    _wrap(ngram_repeat_block.NGramRepeatBlock, "_no_repeat_ngram", generation.generated_tokens_only)
    _wrap(fairseq_model.BaseFairseqModel, "prepare_for_inference_", generation.cpu_precision_checked)
    _wrap(dictionary.Dictionary, "string", text.token_ids_as_integers)
    _wrap(dictionary.Dictionary, "encode_line", text.words_looked_up_at_once)
    _wrap(fairseq_task.FairseqTask, "build_tokenizer", text.options_read_once)
    _wrap(fairseq_task.FairseqTask, "build_bpe", text.options_read_once)
    _wrap(argparse.ArgumentParser, "error", command_line.one_line_usage_errors)
    _wrap(argparse.ArgumentParser, "parse_known_args", command_line.model_options_in_help)
    import fairseq_cli.generate
    import fairseq_cli.interactive

    _wrap(fairseq_cli.interactive, "make_batches",
          lambda make_batches: batches.read_ahead(batches.cased_input_named(
              batches.lines_kept_aligned(make_batches))))
    _wrap(fairseq_cli.generate, "_main", batches.shards_honoured)
    _wrap(fairseq_cli.interactive, "main", batches.interactive_checked)
    command_line.quiet_fairseq_noise()
    if sys.excepthook is not report_error:
        sys.excepthook = report_error
    command_line.install_endings()


__all__ = ["install", "install_for_command_line", "loading", "plain_args", "running_a_fairseq_command"]
