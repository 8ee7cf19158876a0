"""Whatever ends a decoding command, it ends at once and nothing of it is
left: SIGINT, SIGTERM and SIGHUP at each stage (loading, the first batch,
mid-way) end fairseq-generate and fairseq-interactive with one line and the
shell's status, their worker processes with them; the hub's process ends as
Python ends it, its workers with it; a closed output pipe ends a command
quietly; SIGKILL leaves no worker; workers never hold the command's stdin."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (BIN_DIR, USER_DIR, ForkServer, preprocess, tool_env, train)
from hardattn_tools import synthetic

pytestmark = pytest.mark.xdist_group("signals")

SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
STAGES = ("loading", "first batch", "mid-way")
# slow enough to be stopped mid-way: every hypothesis runs 80 steps, two sentences a batch
SLOW = ["--beam", 8, "--batch-size", 2, "--min-len", 80, "--max-len-b", 80, "--cpu",
        "--model-overrides", "{'decoding_workers': 2}"]
# done in seconds: a decoding that ends by itself
QUICK = ["--beam", 2, "--batch-size", 50, "--cpu", "--max-len-b", 5]
ENDS_WITHIN = 1.0  # seconds from the signal to the command's end
GONE_WITHIN = 2.0  # seconds from the signal to the last of its processes' end


@pytest.fixture(scope="module")
def long_task(tmp_path_factory):
    """A tiny model and a test split of 400 sentences."""
    root = tmp_path_factory.mktemp("signals")
    synthetic.write_task("reorder", str(root / "raw"), sizes=(200, 10, 400), seed=5, max_len=10)
    data = Path(preprocess(str(root / "raw"), str(root / "bin")))
    train(data, root / "model", "transformer_soft", updates=2)
    lines = (root / "raw" / "test.src").read_text().splitlines()
    return data, root / "model" / "checkpoint_last.pt", lines


def descendants(pid):
    """The processes under ``pid`` now (from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def running(pid) -> bool:
    """Alive and not a zombie (a zombie has ended; its parent has yet to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the stage never came"
        time.sleep(0.02)


def text_of(path):
    try:
        return Path(path).read_text()
    except FileNotFoundError:  # not opened by the child yet
        return ""


def stage_reached(stage, files, first_batch_marker):
    def reached():
        err, out = text_of(files["stderr"]), text_of(files["stdout"])
        if stage == "loading":
            return "loading" in err
        if stage == "first batch":
            return first_batch_marker in err
        return len(re.findall(r"^H-", out, re.M)) >= 6
    return reached


def signalled(script, args, stage, name, input=None, first_batch_marker="worker processes"):
    """Start ``script``, send signal ``name`` at ``stage``; returns the
    finished process, the seconds it took to end, its descendants at the
    signal, and those still running GONE_WITHIN s after the signal."""
    pid, files, tmp = ForkServer.start(script, args, input=input)
    wait_for(stage_reached(stage, files, first_batch_marker))
    family = descendants(pid)
    sent = time.monotonic()
    os.kill(pid, getattr(signal, name))
    proc = ForkServer.finish(pid, files, tmp, [str(script)], timeout=60)
    took = time.monotonic() - sent
    time.sleep(max(0.0, GONE_WITHIN - (time.monotonic() - sent)))
    return proc, took, family, [p for p in family if running(p)]


def assert_ended_with_one_line(proc, took, left, name):
    number = getattr(signal, name)
    assert proc.returncode == 128 + number, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.splitlines()[-1] == f"fairseq-hardattn: stopped by {name}", proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert took < ENDS_WITHIN and left == [], (took, left)
    assert proc.stdout == "" or proc.stdout.endswith("\n")  # whole lines only


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_ends_fairseq_generate_and_its_workers(long_task, name, stage):
    data, checkpoint, _ = long_task
    proc, took, family, left = signalled(
        BIN_DIR / "fairseq-generate",
        [data, "--user-dir", USER_DIR, "--path", checkpoint, *SLOW], stage, name)
    assert_ended_with_one_line(proc, took, left, name)
    if stage != "loading":
        assert len(family) >= 2  # the workers were there, and went with it


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_ends_fairseq_interactive_and_its_workers(long_task, name, stage):
    data, checkpoint, lines = long_task
    proc, took, family, left = signalled(
        BIN_DIR / "fairseq-interactive",
        [data, "--user-dir", USER_DIR, "--path", checkpoint, "--source-lang", "src",
         "--target-lang", "tgt", "--buffer-size", 40, *SLOW], stage, name, input="\n".join(lines) + "\n")
    assert_ended_with_one_line(proc, took, left, name)
    if stage != "loading":
        assert len(family) >= 2


HUB_SCRIPT = """
import sys
from fairseq.models.transformer import TransformerModel
print("loading", file=sys.stderr, flush=True)
hub = TransformerModel.from_pretrained({directory!r}, checkpoint_file={name!r},
                                       data_name_or_path={data!r}, user_dir={user_dir!r},
                                       decoding_workers=2, batch_size=2)
lines = open({source!r}).read().splitlines()
print("first batch", file=sys.stderr, flush=True)
for start in range(0, len(lines), 20):
    for i, line in enumerate(hub.translate(lines[start:start + 20], beam=8, min_len=80, max_len_b=80)):
        print(f"H-{{start + i}}\\t{{line}}", flush=True)
"""


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_ends_a_process_using_the_hub_and_its_workers(long_task, tmp_path, name, stage):
    """The hub's process handles signals as its own program says (the plugin
    changes nothing there): SIGTERM and SIGHUP end it, Ctrl-C raises
    KeyboardInterrupt; its decoding workers end with it either way."""
    data, checkpoint, _ = long_task
    script = tmp_path / "translate.py"
    script.write_text(HUB_SCRIPT.format(directory=str(checkpoint.parent), name=checkpoint.name,
                                        data=str(data), user_dir=USER_DIR,
                                        source=str(data.parent / "raw" / "test.src")))
    proc, took, family, left = signalled(script, [], stage, name, first_batch_marker="first batch")
    if name == "SIGINT":
        assert proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr[-2000:]
    else:
        assert proc.returncode == -getattr(signal, name)
    assert took < ENDS_WITHIN and left == [], (took, family, left)


def test_a_closed_output_pipe_ends_generate_quietly(long_task):
    data, checkpoint, _ = long_task
    command = (f"set -o pipefail; {BIN_DIR / 'fairseq-generate'} {data} --user-dir {USER_DIR} "
               f"--path {checkpoint} " + " ".join(f'"{a}"' for a in SLOW) + " | head -n 3")
    proc = subprocess.run(["bash", "-c", command], env=tool_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 128 + signal.SIGPIPE, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == 3
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-2000:]


def test_sigkill_leaves_no_worker_and_no_process_holds_the_commands_stdin(long_task):
    """fairseq-interactive fed by a pipe: killed outright, its workers end
    (Linux's parent death signal), and the writer's pipe breaks at once: no
    worker ever held it."""
    data, checkpoint, lines = long_task
    command = [str(BIN_DIR / "fairseq-interactive"), str(data), "--user-dir", USER_DIR, "--path",
               str(checkpoint), "--source-lang", "src", "--target-lang", "tgt", "--buffer-size", "40",
               *map(str, SLOW)]
    proc = subprocess.Popen(command, env=tool_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    proc.stdin.write(("\n".join(lines) + "\n").encode())  # within the pipe's buffer
    proc.stdin.flush()
    assert proc.stdout.readline().startswith(b"S-")  # decoding, in the workers
    family = descendants(proc.pid)
    assert len(family) >= 2
    proc.kill()
    proc.wait()
    sent = time.monotonic()
    with pytest.raises(BrokenPipeError):  # no reader left
        for _ in range(1000):
            proc.stdin.write(b"s1 s2 s3\n" * 1000)
            proc.stdin.flush()
    time.sleep(max(0.0, GONE_WITHIN - (time.monotonic() - sent)))
    assert [p for p in family if running(p)] == []


def test_sigkill_mid_way_leaves_no_process_of_fairseq_generate(long_task):
    """Its decoding workers and fairseq's data loader worker (forked by a
    thread of the command, so watching their parent) end with it."""
    data, checkpoint, _ = long_task
    proc, took, family, left = signalled(
        BIN_DIR / "fairseq-generate",
        [data, "--user-dir", USER_DIR, "--path", checkpoint, *SLOW], "mid-way", "SIGKILL")
    assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), proc.returncode
    assert len(family) >= 3  # two decoding workers and a data loader worker
    assert left == [], left


def test_a_command_writes_whole_lines_only_also_unbuffered():
    """With PYTHONUNBUFFERED (common in containers and batch jobs) Python
    writes a print's text and its line end apart; a fairseq command with the
    plugin writes each line in one piece, so that a command ended between the
    two leaves no part of a line."""
    code = ("import os, sys; sys.argv[0] = 'fairseq-generate'; import fairseq_hardattn; "
            "print('a whole line'); sys.stdout.write('part of a line'); os._exit(0)")
    proc = subprocess.run([sys.executable, "-c", code], env=tool_env(PYTHONUNBUFFERED="1"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "a whole line\n"


def test_a_signal_the_command_was_started_ignoring_stays_ignored(long_task):
    """``nohup fairseq-generate ...``: SIGHUP (a closed terminal) changes
    nothing, in the command or its workers; SIGTERM still ends it."""
    data, checkpoint, _ = long_task
    command = [str(BIN_DIR / "fairseq-generate"), str(data), "--user-dir", USER_DIR, "--path", str(checkpoint),
               *map(str, SLOW)]
    proc = subprocess.Popen(command, env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert proc.stdout.readline().startswith("S-")  # decoding, in the workers
    family = descendants(proc.pid)
    assert len(family) >= 2
    proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert proc.poll() is None and sum(running(p) for p in family) >= 2  # the decoding workers too
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.splitlines()[-1] == "fairseq-hardattn: stopped by SIGTERM"


@pytest.fixture
def short_folder():
    """An empty folder with a short path: a worker's socket is made in the
    temporary folder, and a socket's path has at most 107 bytes (under
    pytest's ``tmp_path`` the data loader's worker failed to hand its batches
    over, and fairseq waited for them for ever)."""
    folder = tempfile.mkdtemp(prefix="tmp-")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_command_leaves_nothing_in_the_temporary_folder_however_it_ends(long_task, short_folder):
    """fairseq-generate with fairseq's data loader worker (``--num-workers
    1``, fairseq's default) and the decoding workers: finished, or stopped by
    SIGTERM mid-way, it leaves no folder of multiprocessing's
    (``pymp-*``) behind."""
    data, checkpoint, _ = long_task
    command = [str(BIN_DIR / "fairseq-generate"), str(data), "--user-dir", USER_DIR, "--path", str(checkpoint),
               "--num-workers", "1"]
    finished, stopped = short_folder / "finished", short_folder / "stopped"
    finished.mkdir()
    stopped.mkdir()
    proc = subprocess.run(command + list(map(str, QUICK)), env=tool_env(TMPDIR=str(finished)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(re.findall(r"^H-", proc.stdout, re.M)) == 400
    assert list(finished.iterdir()) == []

    proc = subprocess.Popen(command + list(map(str, SLOW)), env=tool_env(TMPDIR=str(stopped)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("S-")  # decoding, in the workers
    assert list(stopped.iterdir()) != []  # the folder is there while the command runs
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert list(stopped.iterdir()) == []


def test_a_temporary_folder_too_long_for_sockets_is_one_warning(long_task, tmp_path):
    """A TMPDIR whose sockets' paths would pass 107 bytes: fairseq's data
    loader worker could not hand batches over and the command would stall;
    the command says so at its start (and runs with ``--num-workers 0``)."""
    data, checkpoint, _ = long_task
    folder = tmp_path / ("t" * 90)
    folder.mkdir()
    proc = subprocess.run([str(BIN_DIR / "fairseq-generate"), str(data), "--user-dir", USER_DIR, "--path",
                           str(checkpoint), "--num-workers", "0", *map(str, QUICK)],
                          env=tool_env(TMPDIR=str(folder)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if "AF_UNIX path too long" in line]
    assert len(warnings) == 1 and warnings[0].startswith("fairseq-hardattn: warning: "), proc.stderr[-2000:]
    assert list(folder.iterdir()) == []
