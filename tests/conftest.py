"""Shared helpers: tiny in-process models and a tiny preprocessed data set."""

import argparse
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

import fairseq_hardattn
from hardattn_tools import synthetic

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "fairseq_hardattn")
BIN_DIR = Path(sys.executable).parent


def module_at(relative_path: str):
    """The repository's Python file ``relative_path`` (a script, not a package module) loaded as a module."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# small enough to train a few updates in seconds, big enough for 4 heads
TINY_DIMS = dict(
    encoder_embed_dim=32,
    encoder_ffn_embed_dim=64,
    encoder_layers=2,
    encoder_attention_heads=4,
    decoder_embed_dim=32,
    decoder_ffn_embed_dim=64,
    decoder_layers=2,
    decoder_attention_heads=4,
)
# fairseq's LSTM has other size options
TINY_LSTM_DIMS = dict(
    encoder_embed_dim=32,
    encoder_hidden_size=32,
    decoder_embed_dim=32,
    decoder_hidden_size=32,
    decoder_out_embed_dim=32,
)


def tiny_dims(arch):
    return TINY_LSTM_DIMS if "lstm" in arch else TINY_DIMS


def tiny_dim_flags(arch):
    return [f"--{name.replace('_', '-')}={value}" for name, value in tiny_dims(arch).items()]


TINY_DIM_FLAGS = tiny_dim_flags("transformer")


def make_dictionary(size=20):
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    d.finalize(padding_factor=1)
    return d


class TinyTask:
    """What ``build_model`` needs of a translation task."""

    def __init__(self, dictionary):
        self.source_dictionary = self.target_dictionary = dictionary


def build_model(arch, dictionary=None, **overrides):
    """Build ``arch`` at tiny dims (unless overridden), dropout off, float64."""
    dictionary = dictionary or make_dictionary()
    # flexible attention's default threshold (auto) needs the mean source
    # length that training measures on the validation set; other families ignore it
    values = dict(tiny_dims(arch), dropout=0.0, attention_dropout=0.0,
                  flexible_mean_source_length=5.0, criterion="cross_entropy")
    values.update(overrides)
    args = argparse.Namespace(arch=arch, **values)
    ARCH_CONFIG_REGISTRY[arch](args)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, TinyTask(dictionary))
    return model.double()


def decisive_model(arch, dictionary, **overrides):
    """Random weights, with an output layer 20x sharper: one token dominates
    (the search repeats it), and hypotheses' scores differ by more than
    float32 rounding (a static cache sums softmax rows in another order than a
    growing one, ~1e-7 apart)."""
    torch.manual_seed(0)
    model = build_model(arch, dictionary, **overrides).eval()
    with torch.no_grad():
        model.decoder.output_projection.weight.mul_(20)
    return model


def random_batch(dictionary, lengths, tgt_len=6, seed=0):
    """Left-padded sources of the given lengths (each ends with EOS) and targets."""
    g = torch.Generator().manual_seed(seed)
    nspecial = dictionary.nspecial
    bsz, src_len = len(lengths), max(lengths)
    src = torch.full((bsz, src_len), dictionary.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):
        words = torch.randint(nspecial, len(dictionary), (n - 1,), generator=g)
        src[i, src_len - n:] = torch.cat([words, torch.tensor([dictionary.eos()])])
    prev = torch.randint(nspecial, len(dictionary), (bsz, tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    return src, torch.tensor(lengths), prev


def sample_of(dictionary, lengths=(9, 7, 6, 4, 3, 8), seed=2, ids=None):
    """A generator's sample of random sources (``random_batch``), ids 0.. or ``ids``."""
    src, src_lengths, _ = random_batch(dictionary, list(lengths), seed=seed)
    ids = torch.arange(len(lengths)) if ids is None else torch.tensor(ids)
    return {"id": ids, "net_input": {"src_tokens": src, "src_lengths": src_lengths}}


# --- the equality the engine promises (docs/decoding_engine.md) ------------------
# fairseq's hypotheses (tokens, n-best order, alignments) and, across thread
# counts, workers and chunks, its own; scores equal to float32 rounding, which
# differs between CPUs and thread counts: |a - b| <= 1e-4 + 1e-5 |b|. The
# absolute part: a positional score is a logit less the log of the sum of
# their exponentials, so it carries the rounding of numbers as large as the
# logits (the tests' decisive models: up to ~100, float32 steps of 7.6e-6)
FLOAT32_ROUNDING = dict(rtol=1e-5, atol=1e-4)


def assert_same_hypotheses(ours, theirs, scores=FLOAT32_ROUNDING):
    """The contract, for two searches' outputs (a list of n-best lists per sentence)."""
    assert len(ours) == len(theirs)
    for i, (mine, expected) in enumerate(zip(ours, theirs)):
        assert [h["tokens"].tolist() for h in mine] == [h["tokens"].tolist() for h in expected], i
        torch.testing.assert_close(torch.stack([h["score"] for h in mine]).double(),
                                   torch.stack([h["score"] for h in expected]).double(), **scores)
        for a, b in zip(mine, expected):
            torch.testing.assert_close(a["positional_scores"].double(), b["positional_scores"].double(),
                                       **scores)
            if torch.is_tensor(b.get("alignment")):
                assert torch.equal(a["alignment"], b["alignment"])
            else:  # --print-alignment: (source, target) pairs
                assert a.get("alignment") == b.get("alignment")


def assert_same_batches(ours, theirs, scores=FLOAT32_ROUNDING):
    """The contract, batch by batch (lists of a search's outputs)."""
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs):
        assert_same_hypotheses(mine, expected, scores)


# fairseq-generate's and fairseq-interactive's lines with scores: H and D (the
# score, full precision), P (positional scores, 4 decimals); W is a time
_SCORED = re.compile(r"^([HDP])-(\d+)\t(.*)$")


def output_lines(stdout):
    """The S/T/H/D/P/A lines of a fairseq-generate or -interactive output."""
    return [line for line in stdout.splitlines() if re.match(r"^[STHDPA]-\d+\t", line)]


def assert_same_output(stdout, expected, scores=FLOAT32_ROUNDING):
    """Two fairseq-generate / -interactive outputs under the contract: the
    same lines in the same order, every text and alignment the same, scores
    to float32 rounding (P's 4 decimals: to one unit of the last)."""
    ours, theirs = output_lines(stdout), output_lines(expected)
    assert len(ours) == len(theirs) and ours, (len(ours), len(theirs))
    for mine, line in zip(ours, theirs):
        a, b = _SCORED.match(mine), _SCORED.match(line)
        if b is None:
            assert mine == line
            continue
        assert a is not None and a.group(1, 2) == b.group(1, 2), (mine, line)
        if b.group(1) == "P":
            numbers = [torch.tensor([float(x) for x in m.group(3).split()], dtype=torch.float64)
                       for m in (a, b)]
            torch.testing.assert_close(*numbers, rtol=scores["rtol"], atol=scores["atol"] + 1e-4)
        else:
            (score_a, text_a), (score_b, text_b) = (m.group(3).split("\t", 1) for m in (a, b))
            assert text_a == text_b, (mine, line)
            torch.testing.assert_close(float(score_a), float(score_b), **scores)


def tool_env(**extra):
    """Environment for a tool started by a test: one thread, this environment's
    executables first on PATH, and no torch.load override (the plugin must
    load checkpoints without one)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PATH=f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    env.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.pop("LOGLEVEL", None)
    env.update(extra)
    return env


class ForkServer:
    """This test process's ``cli_forkserver``: started with ``tool_env()`` on its
    first command, it runs each console script in a forked child."""

    process = None

    @classmethod
    def start(cls, script, args, cwd=None, input=None, env=None):
        """Start ``script`` in a forked child (with the variables ``env`` set
        too); returns (pid, the files of its stdin, stdout and stderr, a
        temporary directory to clean up)."""
        if cls.process is None:
            cls.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("cli_forkserver.py"))],
                env=tool_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                bufsize=0)  # unbuffered: a line read never takes the next one, which select waits for
        tmp = tempfile.TemporaryDirectory()
        files = {name: os.path.join(tmp.name, name) for name in ("stdin", "stdout", "stderr")}
        Path(files["stdin"]).write_text(input or "")
        request = dict(script=str(script), argv=[str(a) for a in args], cwd=str(cwd or os.getcwd()),
                       env=env or {}, **files)
        cls.process.stdin.write(json.dumps(request).encode() + b"\n")
        pid = json.loads(cls.process.stdout.readline())["pid"]
        return pid, files, tmp

    @classmethod
    def finish(cls, pid, files, tmp, command, timeout):
        """Wait for the child ``start`` gave (killed after ``timeout`` s)."""
        try:
            if not select.select([cls.process.stdout], [], [], timeout)[0]:
                os.kill(pid, signal.SIGKILL)
                cls.process.stdout.readline()
                raise subprocess.TimeoutExpired(command, timeout)
            returncode = json.loads(cls.process.stdout.readline())["returncode"]
            return subprocess.CompletedProcess(command, returncode, Path(files["stdout"]).read_text(),
                                               Path(files["stderr"]).read_text())
        finally:
            tmp.cleanup()

    @classmethod
    def run(cls, script, args, cwd, input, timeout, env=None):
        pid, files, tmp = cls.start(script, args, cwd, input, env)
        return cls.finish(pid, files, tmp, [str(script), *args], timeout)


def run_cli(tool, *args, cwd=None, check=True, timeout=600, input=None, env=None):
    """Run a fairseq console script (fairseq-train, ...) of this environment: in
    a child forked from the ForkServer (no imports to repeat), or where it needs
    another environment, or TEST_CLI_FORKSERVER=0 is set, as a subprocess (as
    any other tool)."""
    exe = BIN_DIR / tool
    args = [str(a) for a in args]
    console_script = tool.startswith("fairseq-") and exe.exists()
    if console_script and env is None and os.environ.get("TEST_CLI_FORKSERVER") != "0":
        proc = ForkServer.run(exe, args, cwd, input, timeout)
    else:
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m",
                                               "fairseq_cli." + tool.split("-", 1)[1]]
        proc = subprocess.run(cmd + args, cwd=cwd, env=env or tool_env(),
                              input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{tool} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def preprocess(raw_dir, dest_dir):
    run_cli(
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", f"{raw_dir}/train", "--validpref", f"{raw_dir}/valid",
        "--testpref", f"{raw_dir}/test", "--destdir", dest_dir,
        "--joined-dictionary", "--workers", "1",
    )
    return dest_dir


TRAIN_FLAGS = [
    "--user-dir", USER_DIR, "--cpu", "--seed", "1",
    "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
    "--warmup-updates", "10", "--max-tokens", "1000",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--no-progress-bar", "--log-interval", "1", "--num-workers", "0",
]


@pytest.fixture(scope="session")
def reorder_data(tmp_path_factory):
    """A tiny preprocessed reordering task, shared by the CLI tests."""
    root = tmp_path_factory.mktemp("reorder")
    synthetic.write_task("reorder", str(root / "raw"), sizes=(300, 20, 20), seed=3,
                         max_len=10)
    return Path(preprocess(str(root / "raw"), str(root / "bin")))


@pytest.fixture(scope="session")
def all_archs():
    return fairseq_hardattn.registered_architectures()


TEST_SENTENCES = 20  # of the reorder_data test set


def train(data, save_dir, arch, *extra, updates=3):
    """fairseq-train ``arch`` at tiny dims for a few updates."""
    return run_cli(
        "fairseq-train", data, "--arch", arch, *TRAIN_FLAGS, *tiny_dim_flags(arch),
        "--max-update", updates, "--save-dir", save_dir, "--no-epoch-checkpoints",
        *extra,
    )


# the output cap of the tests' decoding commands: an untrained model never emits
# EOS, and fairseq's default cap (200 tokens) would make decoding most of a test
MAX_LEN_B = 20


def generate(data, checkpoint, *extra, check=True):
    return run_cli(
        "fairseq-generate", data, "--user-dir", USER_DIR, "--path", checkpoint,
        "--beam", 4, "--batch-size", 8, "--cpu", "--max-len-b", MAX_LEN_B, *extra,
        check=check,
    )


def load_with_overrides(checkpoint, overrides):
    """As fairseq-generate loads it: the task comes from the command line, not
    from the checkpoint (an ``_name`` override renames every config group);
    the plugin's checks on (``compat.loading``)."""
    from fairseq import checkpoint_utils, tasks

    from fairseq_hardattn import compat

    with compat.loading():  # the checks of fairseq-generate's loading
        task = tasks.setup_task(checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["cfg"].task)
        models, _ = checkpoint_utils.load_model_ensemble(
            [str(checkpoint)], arg_overrides=overrides, task=task
        )
    return models[0]


def interactive(data, checkpoint, lines, *extra):
    """fairseq-interactive on ``lines`` (it may fail: check its return code)."""
    return run_cli(
        "fairseq-interactive", data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
        "--beam", 4, "--max-len-b", MAX_LEN_B, "--source-lang", "src", "--target-lang", "tgt", *extra,
        check=False, input="\n".join(lines) + "\n",
    )


def one_error_line(proc, expected):
    """The tool failed with exactly one error line, which contains ``expected``."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("fairseq-hardattn: error: "), errors
    assert expected in errors[0], errors[0]
    return errors[0]


def hypotheses(stdout):
    return re.findall(r"^H-(\d+)\t", stdout, flags=re.M)


@pytest.fixture(scope="session")
def trained_checkpoints(reorder_data, tmp_path_factory):
    """A soft (fairseq's own ``transformer``) and a hard model, a few updates each."""
    root = tmp_path_factory.mktemp("ckpts")
    train(reorder_data, root / "soft", "transformer", updates=2)
    train(reorder_data, root / "hard", "transformer_hard_dec", updates=2)
    return {kind: root / kind / "checkpoint_last.pt" for kind in ("soft", "hard")}
