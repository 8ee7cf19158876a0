"""One error type for invalid configurations and inputs, reported in one line.

fairseq's command-line tools print a full traceback for any exception raised
while building a model or loading a checkpoint. For the mistakes a user makes
(an unknown attention kind, contradictory options, a checkpoint of another
family) a traceback from deep inside fairseq hides the one line that matters,
so the plugin's exception hook (``report_error``, installed by
``compat`` in a fairseq command) prints only that line: for ``ConfigError`` and for
fairseq's and torch's errors about a user's input (``one_line``).
"""

import errno
import os
import re
import sys
import traceback


class ConfigError(ValueError):
    """An invalid option, option combination, checkpoint or input."""


_CUDA_FLAGS = ("--fp16", "--memory-efficient-fp16", "--amp", "--bf16", "--memory-efficient-bf16")


def _cuda_missing(match):
    flags = [flag for flag in _CUDA_FLAGS if flag in sys.argv]
    if flags:
        return (f"{flags[0]} needs a CUDA GPU and torch finds none: train or decode on "
                f"the CPU without {flags[0]}")
    return "this command runs on a CUDA GPU and torch finds none: add --cpu"


def _missing_file(match):
    path = match.group(1)
    if os.path.basename(path).startswith("dict."):
        return (f"no dictionary {path}: give the data directory that fairseq-preprocess wrote "
                "(it holds dict.*.txt and the binarized splits)")
    return f"no such file or directory: {path}"


def _missing_split(match):
    return (f"no {match.group(1)!r} split in {match.group(2)} (--gen-subset / --valid-subset name "
            "a split that fairseq-preprocess binarized: train, valid, test, ...)")


# errors fairseq and torch raise for a user's input, as (exception type, exact
# type only, pattern of the message, what to say: None = the message itself)
_INPUT_ERRORS = (
    (Exception, True, re.compile(r"Size of sample #\d+ is invalid"), None),
    (FileNotFoundError, False, re.compile(r"Dataset not found: (\S+) \((.*)\)"), _missing_split),
    (FileNotFoundError, False, re.compile(r"No such file or directory: '(.*)'"), _missing_file),
    (AssertionError, False, re.compile(r"Torch not compiled with CUDA enabled"), _cuda_missing),
    (RuntimeError, False, re.compile(r"Found no NVIDIA driver|No CUDA GPUs are available"),
     _cuda_missing),
    (OSError, False, re.compile(r"Model file not found: (.*)"),
     lambda match: f"no checkpoint at {match.group(1)} (--path)"),
    (AssertionError, False, re.compile(r"Sentences lengths should not exceed max_tokens=(\d+)"),
     lambda match: f"--max-tokens {match.group(1)} is smaller than a sentence of the data set: "
                   "raise it to hold the longest sentence"),
    (Exception, True, re.compile(r"The dataset is empty"),
     lambda match: "no batch to train on: every sentence was left out (longer than --max-tokens "
                   "or the model's --max-source-positions / --max-target-positions?)"),
)


# options of fairseq's commands that name a file or a directory (by their words)
_PATH_OPTION = re.compile(r"^--[\w-]*(dir|path|file|pref|dict|codes|model|vocab|input|output)[\w-]*$")
# why a path could not be made or opened, by errno
_PATH_REASONS = {errno.EEXIST: "it exists and is a file, not a directory",
                 errno.EISDIR: "it is a directory, not a file",
                 errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                 errno.EROFS: "the file system is read-only",
                 errno.ENOSPC: "no space left on the device",
                 errno.ENAMETOOLONG: "the name is too long"}


def _given_as(path):
    """How the user gave ``path`` (or a folder above it) on the command line:
    '--save-dir f/ckpt', 'the data directory f', or the path itself."""
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        option, _, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if not value and option and i + 1 < len(argv):
            continue  # its value is the next word
        if value and (path == value or path.startswith(value.rstrip("/") + "/")):
            previous = argv[i - 1] if i > 0 and not option else option
            if _PATH_OPTION.match(previous or ""):
                return f"{previous} {value}"
            if not option and not (previous or "").startswith("-"):
                return f"the data directory {value}"
    return path


def _path_problem(exc):
    """A line for an OSError about a path the user gave: a folder that is a
    file, a file that is a folder, no permission, a read-only disk."""
    path = exc.filename
    if not isinstance(path, str) or exc.errno not in _PATH_REASONS and exc.errno != errno.ENOTDIR:
        return None
    reason = _PATH_REASONS.get(exc.errno)
    if exc.errno == errno.ENOTDIR:  # a part of the path is a file
        part = path
        while part and not os.path.exists(part):
            part = os.path.dirname(part.rstrip("/"))
        reason = (f"{part} is a file, not a directory" if part and not os.path.isdir(part)
                  else "a part of it is not a directory")
    return f"{_given_as(path)}: {reason}"


def _raised_in_literal_eval(exc) -> bool:
    """fairseq reads --model-overrides with ``ast.literal_eval``."""
    return isinstance(exc, (ValueError, SyntaxError)) and any(
        frame.name == "literal_eval" for frame in traceback.extract_tb(exc.__traceback__))


def one_line(exc):
    """The line to print for ``exc``, or None when it is not a user's error."""
    if isinstance(exc, ConfigError):
        return str(exc)
    if _raised_in_literal_eval(exc):
        option = "--model-overrides" if "--model-overrides" in sys.argv else "an option's value"
        return (f"{option} must be a Python literal, every string quoted, e.g. "
                f"\"{{'dec_self_attn_kind': 'soft'}}\" [{type(exc).__name__}: {exc}]")
    cause = exc.__cause__ or exc.__context__
    while cause is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:  # fairseq re-raised it, e.g. "Cannot load model parameters from ..."
        return f"{cause} [{exc}]"
    for exc_type, exact, pattern, say in _INPUT_ERRORS:
        if type(exc) is exc_type if exact else isinstance(exc, exc_type):
            match = pattern.search(str(exc))
            if match:
                return str(exc) if say is None else f"{say(match)} [{type(exc).__name__}: {exc}]"
    problem = _path_problem(exc) if isinstance(exc, OSError) else None
    return f"{problem} [{type(exc).__name__}: {exc}]" if problem else None


def _debugging():
    # fairseq's command-line tools take their log level from LOGLEVEL (Hydra
    # turns the root logger to DEBUG while it composes configurations)
    return os.environ.get("LOGLEVEL", "").upper() == "DEBUG"


def report_error(exc_type, exc, tb, _previous=sys.excepthook):
    """``sys.excepthook`` (installed by ``compat`` in a fairseq command): ``ConfigError``s
    and known input errors in one line (``LOGLEVEL=DEBUG`` adds the
    traceback), anything else as Python reports it."""
    line = one_line(exc)
    if line is None:
        _previous(exc_type, exc, tb)
        return
    if _debugging():  # LOGLEVEL=DEBUG: the whole story, then the line
        traceback.print_exception(exc_type, exc, tb)
    print(f"fairseq-hardattn: error: {line}", file=sys.stderr)


def cased_input_warning(dictionary, lines, first_line: int, where: str):
    """The warning where a model that learned from lowercased text
    (no capital letter in its source ``dictionary``) is given ``lines`` of
    which at least half have some: cased words reach it as rare subwords,
    and it translates them worse and slower. None otherwise."""
    lines = [line for line in lines if line.strip()]
    if not lines or any(symbol != symbol.lower() for symbol in dictionary.symbols):
        return None
    cased = sum(line != line.lower() for line in lines)
    if 2 * cased < len(lines):
        return None
    return (f"the model's source dictionary has no capital letters, but {cased:,} of {len(lines):,} lines "
            f"from line {first_line + 1} of {where} have some: a model trained on lowercased text reads "
            f"cased words as rare subwords and translates them worse and slower; lowercase the input")


def data_dir(task):
    """The data directory a task reads its dictionaries from, if it says."""
    return getattr(getattr(task, "cfg", None), "data", None) or getattr(
        getattr(task, "args", None), "data", None)


def check_joined_dictionary(args, task):
    """``--share-all-embeddings`` needs one dictionary for both languages
    (fairseq raises a bare ValueError deep in its build_model)."""
    if not getattr(args, "share_all_embeddings", False):
        return
    src, tgt = task.source_dictionary, task.target_dictionary
    if src != tgt:
        data = data_dir(task) or "the data directory"
        raise ConfigError(
            f"--share-all-embeddings needs one dictionary for both languages, but {data} has "
            f"two ({len(src)} and {len(tgt)} entries): binarize with fairseq-preprocess "
            "--joined-dictionary, or drop --share-all-embeddings")


# parameters whose first dimension is a dictionary's size, by the side they belong to
_VOCABULARY_PARAMETERS = {"encoder.embed_tokens.weight": "source",
                          "decoder.embed_tokens.weight": "target",
                          "decoder.output_projection.weight": "target"}


class ClearCheckpointErrors:
    """Model mixin: a checkpoint of another family (or size, or vocabulary)
    fails with one line naming what does not fit, not torch's list of every
    parameter."""

    # the data directory whose dictionaries built the model (set by build_model)
    data_dir = None

    def vocabulary_mismatch(self, state_dict):
        """A line naming both dictionary sizes, or None when they agree."""
        expected = self.state_dict()
        for name, side in _VOCABULARY_PARAMETERS.items():
            if name in state_dict and name in expected:
                trained, built = state_dict[name].size(0), expected[name].size(0)
                if trained != built:
                    data = self.data_dir or "the data directory"
                    return (f"the checkpoint's {side} dictionary has {trained} entries, but "
                            f"the one in {data} has {built}: decode with the binarized data "
                            "(dict.*.txt) the model was trained with")
        return None

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            vocabulary = self.vocabulary_mismatch(state_dict)
            if vocabulary:
                raise ConfigError(vocabulary) from None
            expected = self.state_dict()
            missing = sorted(set(expected) - set(state_dict))
            unexpected = sorted(set(state_dict) - set(expected))
            problems = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
            detail = "; ".join(
                part for part in (
                    missing and f"{len(missing)} parameters missing (e.g. {missing[0]})",
                    unexpected and f"{len(unexpected)} unexpected (e.g. {unexpected[0]})",
                    not (missing or unexpected) and problems and problems[0][:200],
                ) if part)
            name = getattr(model_cfg, "_name", None) or getattr(model_cfg, "arch", None) \
                or type(self).__name__
            final_norms = {f"{side}.layer_norm.{p}" for side in ("encoder", "decoder")
                           for p in ("weight", "bias")}
            if missing and set(missing) <= final_norms and not unexpected:
                raise ConfigError(
                    f"the checkpoint does not fit {name}: it has no final layer norms "
                    f"({', '.join(missing)}), so it was trained with post-norm layers; {name} "
                    "normalizes before each layer (--encoder-normalize-before "
                    "--decoder-normalize-before, the _prenorm presets): use the preset without "
                    "_prenorm") from None
            if unexpected and set(unexpected) <= final_norms and not missing:
                raise ConfigError(
                    f"the checkpoint does not fit {name}: it has final layer norms "
                    f"({', '.join(unexpected)}), so it was trained with pre-norm layers; {name} "
                    "normalizes after each layer (post-norm): use its _prenorm preset (or "
                    "--encoder-normalize-before --decoder-normalize-before)") from None
            raise ConfigError(
                f"the checkpoint does not fit {name}: {detail}. Checkpoints convert between "
                "attention kinds of the same sublayers (soft/hard, + fresh gates for flexible or "
                "local cross-attention), not between families or sizes"
            ) from None
