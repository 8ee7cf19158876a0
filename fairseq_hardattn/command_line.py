"""How a fairseq command run with the plugin (fairseq-generate,
fairseq-interactive, fairseq-train, ...) ends: installed only when such a
command runs (``running_a_fairseq_command``), never by importing the plugin
elsewhere (the hub, a notebook, a server keep their own handling).

- SIGINT, SIGTERM and SIGHUP end the command at once with one line and the
  shell's usual status (128 + the signal's number: 130, 143, 129), its
  decoding workers with it; one the command was started ignoring (``nohup``:
  SIGHUP) stays ignored. fairseq's commands printed a KeyboardInterrupt
  traceback for Ctrl-C, after waiting for the workers to finish their
  batches, and SIGTERM left the workers running.
- Standard output is line-buffered, each line written in one piece (also
  under PYTHONUNBUFFERED, which writes a line's text and its end apart), and
  the command ends without flushing what is left: a command stopped at any
  moment leaves whole lines only.
- A closed output pipe (``fairseq-generate ... | head``) ends the command
  quietly, with the status of a process that SIGPIPE ended (141), as other
  command-line tools end; fairseq printed a BrokenPipeError traceback.
- Any other exception stops the workers before it is reported; and every
  process the command forks (its decoding workers, fairseq's data loader
  workers) dies with it, however it ends, SIGKILL included (Linux's parent
  death signal, or a watch of the parent: ``workers.die_with_parent``):
  none outlives the command. PyTorch's data loader workers otherwise noticed
  a dead parent after up to 5 s.
"""

import multiprocessing
import os
import select
import signal
import sys
import threading

from .decoding.workers import die_with_parent

ENDING_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_installed_in = None  # the process that installed the handlers (a worker forked from it inherits them)
# the process forking now, and whether its main thread forks (set before each
# fork; its child reads them)
_forked_by = None, False


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


def _end_now(status: int):
    _stop_children()
    os._exit(status)


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


def install():
    """The behaviours above, for the command this process runs."""
    global _installed_in
    if _installed_in == os.getpid():
        return
    if _installed_in is None:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    _installed_in = os.getpid()
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
