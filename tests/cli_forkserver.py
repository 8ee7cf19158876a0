"""Runs fairseq's console scripts for the tests without paying their ~3 s of
imports each time: this process imports torch and fairseq once (and
torch._dynamo, which torch's first optimizer would import), then forks a
child per command, and the child runs the console script as a fresh
interpreter would (its own argv, cwd, stdin/stdout/stderr files, exit code,
``sys.excepthook`` for an uncaught exception, atexit handlers). The plugin and
fairseq_cli are imported by each child, so ``--user-dir`` and fairseq's logging
set-up happen there as they do in a fresh process.

Protocol (one JSON object a line): the request names ``script``, ``argv``,
``cwd``, ``stdin``, ``stdout``, ``stderr`` (file paths) and ``env`` (variables
to set); a ``script`` of the form ``-m NAME`` runs module NAME as ``python -m``
does; the answer is
``{"pid": N}`` once the child runs, then ``{"returncode": N}``. Started by
``conftest.run_cli`` with the environment every tool gets (``tool_env()``);
commands that need another environment run as plain subprocesses.
"""

import atexit
import importlib.util
import json
import logging
import os
import re
import runpy
import signal
import sys
from pathlib import Path


def configures_logging_first(module_file):
    """Whether a module calls logging.basicConfig before it imports fairseq."""
    top_level = re.findall(r"^(logging\.basicConfig\(|from fairseq\b|import fairseq\b)",
                           Path(module_file).read_text(), flags=re.M)
    return bool(top_level) and top_level[0].startswith("logging")


def as_started_from_a_terminal():
    """The signal dispositions of a command typed at a terminal: Ctrl-C raises
    KeyboardInterrupt, SIGTERM and SIGHUP end the process (a server started in
    the background of a non-interactive shell would ignore SIGINT, and so
    would every child it forks)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def run_console_script(request):
    """In the forked child: run one console script and return its exit code."""
    as_started_from_a_terminal()
    os.environ.update(request.get("env") or {})
    os.chdir(request["cwd"])
    written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for fd, (path, mode) in enumerate([(request["stdin"], os.O_RDONLY),
                                       (request["stdout"], written),
                                       (request["stderr"], written)]):
        opened = os.open(path, mode, 0o644)
        os.dup2(opened, fd)
        os.close(opened)  # the file stays open as fd 0-2 only
    script = request["script"]
    module = script[3:] if script.startswith("-m ") else None
    sys.argv = [script, *request["argv"]]
    sys.path[0] = os.getcwd() if module else os.path.dirname(script)
    # the root logger as a fresh process leaves it: fairseq's import configures
    # it (stderr) unless the entry module does so first (fairseq_cli.train: stdout)
    entry = None if module else re.search(r"^from (\S+) import", Path(script).read_text(), flags=re.M)
    if entry and configures_logging_first(importlib.util.find_spec(entry.group(1)).origin):
        logging.getLogger().handlers.clear()
        logging.getLogger().setLevel(logging.WARNING)
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def serve():
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stdout is the children's, not the protocol's
    import torch  # noqa: F401  (the imports every child shares)
    import fairseq  # noqa: F401
    import torch._dynamo  # noqa: F401  (torch.optim's lazy import: ~2 s of every training)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run_console_script(request)
            finally:
                os._exit(code)
        answers.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    serve()
