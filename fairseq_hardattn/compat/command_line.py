"""A fairseq command run with the plugin (fairseq-generate, fairseq-interactive,
fairseq-train, ...): how it reports mistakes and how it ends. Installed
only when such a command runs (``compat.install_for_command_line``), never by
importing the plugin elsewhere (the hub, a notebook, a server keep their own
handling).

- Errors at the top level: fairseq's tools print a full traceback for any
  exception; a ``ConfigError`` (and fairseq's and torch's errors about a
  user's input, ``errors.one_line``) is one line instead, through
  ``sys.excepthook``.
- Usage errors: a misspelt ``--arch`` printed the whole usage and a line of
  every architecture, an unknown option the usage before the message; one
  line instead, with the nearest names (``one_line_usage_errors``).
- ``--help``: fairseq adds a model's options to its parser only after a
  first parse, which ``--help`` ends, so ``fairseq-train --arch A --help``
  listed none of them; fairseq-generate's listed none of the plugin's
  decoding settings (``model_options_in_help``).
- Warnings about fairseq's own use of its libraries (Hydra's deprecated APIs,
  ``torch.cuda.amp.autocast``, ``pin_memory`` without a GPU, torch's note on
  the mask types fairseq's attention passes): two dozen lines on every
  command, none of them about the user's run; exactly those are filtered
  (``FAIRSEQ_NOISE``).
- Signals: SIGINT, SIGTERM and SIGHUP end the command at once with one line
  and the shell's usual status (128 + the signal's number: 130, 143, 129),
  its worker processes with it; one the command was started ignoring
  (``nohup``: SIGHUP) stays ignored. fairseq's commands printed a
  KeyboardInterrupt traceback for Ctrl-C, after waiting for the workers to
  finish their batches, and SIGTERM left the workers running.
- Standard output is line-buffered, each line written in one piece (also
  under PYTHONUNBUFFERED, which writes a line's text and its end apart), and
  the command ends without flushing what is left: a command stopped at any
  moment leaves whole lines only.
- A closed output pipe (``fairseq-generate ... | head``) ends the command
  quietly, with the status of a process that SIGPIPE ended (141), as other
  command-line tools end; fairseq printed a BrokenPipeError traceback.
- The plugin's own commands (``python -m fairseq_hardattn translate``,
  ``shortlist``), once done, end without the interpreter's teardown
  (``end_finished_command``): their exit functions run and their streams
  are flushed, and the second spent freeing every loaded module is not.
- Every process the command forks (its decoding workers, fairseq's data
  loader workers) dies with it, however it ends, SIGKILL included (Linux's
  parent death signal, or a watch of the parent:
  ``die_with_parent``); PyTorch's data loader workers
  otherwise noticed a dead parent after up to 5 s.
- Nothing is left in the temporary folder. fairseq's data loader workers
  (persistent) live until the command ends, when multiprocessing stops them
  before they remove the folder each made to hand tensors over
  (``/tmp/pymp-*``): one a run. The command makes that folder first, so that
  the processes it forks use it too, and removes it however it ends
  (``_share_temporary_folder``).
"""

import argparse
import atexit
import difflib
import functools
import logging
import multiprocessing
import multiprocessing.util
import os
import re
import select
import shutil
import signal
import sys
import threading
import time
import warnings

from ..errors import report_error
from .checkpoints import (FAIRSEQ_TRANSFORMER_AS, fairseq_transformer_options, is_plugin_class,
                          model_class_named)

ENDING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_installed_in = None  # the process that installed the handlers (a worker forked from it inherits them)
# the process forking now, and whether its main thread forks (set before each
# fork; its child reads them)
_forked_by = None, False
_temporary_folder = None  # multiprocessing's, made by the command (removed by it)
SOCKET_PATH_BYTES = 107  # a Unix socket's path (sun_path, its final NUL left out)
SOCKET_NAME = "/listener-12345678"  # how multiprocessing names a socket in its folder (8 random letters)


def running_a_fairseq_command() -> bool:
    """Whether this process runs one of fairseq's console scripts
    (``fairseq-generate``, or ``python -m fairseq_cli.generate``)."""
    program = sys.argv[0] if sys.argv else ""
    return os.path.basename(program).startswith("fairseq-") or (
        os.path.basename(os.path.dirname(program)) == "fairseq_cli")


def _say(line: str):
    """One line on stderr, written past Python's buffers (a signal may arrive
    while they are in use)."""
    try:
        os.write(2, f"fairseq-hardattn: {line}\n".encode())
    except OSError:
        pass


def _stop_children():
    """Kill this command's child processes (its decoding workers, fairseq's
    data loader workers) before it ends: one killed after it would notice
    the half-done transfer it was serving (a tensor handed over a socket)
    and print a traceback."""
    if os.getpid() != _installed_in:
        return
    for child in multiprocessing.active_children():
        try:
            os.kill(child.pid, signal.SIGKILL)
        except (OSError, TypeError):  # gone already
            pass


def _share_temporary_folder():
    """multiprocessing's temporary folder of this process, made now: a process
    forked later finds it in the configuration it inherits and makes none of
    its own, and this process's exit functions remove it (``_end_now`` too)."""
    global _temporary_folder
    _temporary_folder = multiprocessing.util.get_temp_dir()
    if len(os.fsencode(_temporary_folder)) + len(SOCKET_NAME) > SOCKET_PATH_BYTES:
        _say(f"warning: the temporary folder {_temporary_folder} is too long a path for the sockets "
             f"of fairseq's data loader workers (at most {SOCKET_PATH_BYTES} bytes): with --num-workers "
             f"above 0 the command would stall (OSError: AF_UNIX path too long); set a shorter TMPDIR")


def _end_now(status: int):
    _stop_children()
    if _temporary_folder is not None and os.getpid() == _installed_in:
        shutil.rmtree(_temporary_folder, ignore_errors=True)
    os._exit(status)


def end_finished_command():
    """End a command that has done its work, status 0: its exit functions run
    (logging's last lines, multiprocessing's clean-up), its standard streams
    are flushed, and the interpreter's teardown is skipped (freeing every
    module that fairseq, PyTorch and SciPy loaded: about a second)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say there
            pass
    os._exit(0)


def _stop(number, frame):
    if os.getpid() == _installed_in:
        _say(f"stopped by {signal.Signals(number).name}")
    _end_now(128 + number)


def _stdout_closed() -> bool:
    """Whether the reader of standard output has gone (a pipe's reader ended)."""
    try:
        poll = select.poll()
        poll.register(1, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


def _uncaught(previous, exc_type, exc, tb):
    _stop_children()
    if isinstance(exc, BrokenPipeError) and _stdout_closed():
        _end_now(128 + signal.SIGPIPE)
    if isinstance(exc, KeyboardInterrupt):
        _say("stopped by SIGINT")
        _end_now(128 + signal.SIGINT)
    previous(exc_type, exc, tb)


def _before_fork():
    global _forked_by
    _forked_by = os.getpid(), threading.current_thread() is threading.main_thread()


def _after_fork_in_child():
    die_with_parent(*_forked_by)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_dies_with_parent = None  # the process that asked (a fork hook and a worker's loop both may)


def die_with_parent(parent_pid, forked_by_the_main_thread=True):
    """In a forked process: end when the process that forked it ends, however
    that ends (SIGKILL included). Linux's parent death signal comes when the
    forking *thread* ends, so only a child of the main thread (which lives as
    long as its process) asks for it; a child of another thread watches its
    parent instead (``PARENT_WATCH_SECONDS``)."""
    global _dies_with_parent
    if _dies_with_parent == os.getpid():
        return
    _dies_with_parent = os.getpid()
    if forked_by_the_main_thread:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            forked_by_the_main_thread = False
    if os.getppid() != parent_pid:  # the parent ended before the death signal was set
        os._exit(0)
    if not forked_by_the_main_thread:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True,
                         name="fairseq-hardattn parent watch").start()


PARENT_WATCH_SECONDS = 0.2


def _watch_parent(parent_pid):
    while os.getppid() == parent_pid:
        time.sleep(PARENT_WATCH_SECONDS)
    os._exit(0)


def install_endings():
    """Signals, standard output and child processes as above, for the command
    this process runs."""
    global _installed_in
    if _installed_in == os.getpid():
        return
    if _installed_in is None:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    _installed_in = os.getpid()
    _share_temporary_folder()
    for name in ENDING_SIGNALS:
        number = getattr(signal, name, None)
        # one ignored by whoever started the command stays ignored (nohup: SIGHUP;
        # a job in a script's background: SIGINT)
        if number is not None and signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, _stop)
    try:  # each line in one write (PYTHONUNBUFFERED: a line's text and its end apart)
        sys.stdout.reconfigure(line_buffering=True, write_through=False)
    except (AttributeError, ValueError):  # not a text stream of its own
        pass
    previous = sys.excepthook
    sys.excepthook = lambda *exc_info: _uncaught(previous, *exc_info)


# --- the parser -----------------------------------------------------------------


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
            model_class = model_class_named(_arch_in(argv))
            if is_plugin_class(model_class):
                self._fairseq_hardattn_model_help = True
                every = argparse.ArgumentParser(add_help=False)
                model_class.add_args(every)
                fairseq_own = fairseq_transformer_options()
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
    model_class = model_class_named(FAIRSEQ_TRANSFORMER_AS)
    every = argparse.ArgumentParser(add_help=False)
    model_class.add_args(every)
    actions = {action.dest: action for action in every._actions}
    group = parser.add_argument_group(
        "fairseq-hardattn decoding (with the plugin loaded)",
        "settings of the plugin's models, given as --model-overrides keys, e.g. "
        "--model-overrides \"{'decoding_workers': 1, 'int8_decoding': True}\" (the hub: keywords "
        "of from_pretrained)")
    for dest in model_class.decoding_options:
        action = actions[dest]
        metavar = "True" if action.nargs == 0 else action.metavar
        group._add_action(argparse._StoreAction([f"'{dest}':"], dest=f"_help_{dest}", metavar=metavar,
                                                choices=action.choices, help=action.help))
    groups = parser._action_groups  # listed after fairseq's generation options
    groups.remove(group)
    after = next((i + 1 for i, g in enumerate(groups) if g.title == "Generation"), len(groups))
    groups.insert(after, group)


# --- noise ----------------------------------------------------------------------


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
