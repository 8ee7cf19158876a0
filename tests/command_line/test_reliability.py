"""Reliability: multi-worker training, exact resume, decoding determinism."""

import os
import socket
import subprocess

import pytest
import torch

import fairseq_hardattn

from conftest import BIN_DIR, TRAIN_FLAGS, tiny_dim_flags, tool_env



def distinct_at_tiny_dims(archs):
    """One architecture of each configuration: the tests' tiny dims build the
    same model from a preset's ``_big``, base and ``_small`` sizes and from a
    family's default architecture (named after its model)."""
    def same_as_another(arch):
        return (arch.endswith("_big") or f"{arch}_small" in archs or not arch.startswith(("transformer_", "lstm_"))
                or arch.endswith("_iwslt_de_en"))
    return [arch for arch in archs if not same_as_another(arch)]


ARCHS = distinct_at_tiny_dims(fairseq_hardattn.registered_architectures())
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
# one worker runs this file: its tests share one torchrun launch (a module fixture)
pytestmark = pytest.mark.xdist_group("two_worker_runs")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.fixture(scope="session")
def two_worker_runs(reorder_data, tmp_path_factory):
    """Every architecture trained by 2 workers: 4 updates straight, and 2 +
    resume to 4 (see ddp_worker.py); one torchrun launch for all of them."""
    out = tmp_path_factory.mktemp("ddp")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [str(BIN_DIR / "torchrun"), "--nproc-per-node", "2", "--master-port", free_port(),
         os.path.join(HERE, "ddp_worker.py"), str(reorder_data), str(out), *ARCHS],
        env=env, capture_output=True, text=True, timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


def _load(run_dir, rank):
    return torch.load(os.path.join(run_dir, f"rank{rank}.pt"))


@pytest.mark.parametrize("arch", ARCHS)
def test_two_workers_agree_and_resume_exactly(two_worker_runs, arch):
    worker0, worker1 = _load(two_worker_runs / arch, 0), _load(two_worker_runs / arch, 1)
    assert worker0["updates"] == worker1["updates"] == 4
    for run in ("straight", "resumed"):
        for name, value in worker0[run].items():
            assert torch.equal(value, worker1[run][name]), f"workers differ: {run} {name}"
    # N updates in one go == N/2, save, resume N/2 (RNG of sampling included)
    for name, value in worker0["straight"].items():
        assert torch.equal(value, worker0["resumed"][name]), f"resume differs: {name}"


def test_the_documented_launch_script_trains_and_resumes_with_two_workers(reorder_data, tmp_path):
    """scripts/train_distributed.sh as a user runs it: 2 workers train 2
    updates and save; a second launch resumes from that checkpoint to 4."""
    script = os.path.join(HERE, os.pardir, "scripts", "train_distributed.sh")
    arch = "transformer_hard_dec_small"
    argv = [str(reorder_data), "--arch", arch, *TRAIN_FLAGS, *tiny_dim_flags(arch),
            "--save-dir", str(tmp_path), "--no-epoch-checkpoints", "--max-tokens", "300"]
    for updates in (2, 4):
        proc = subprocess.run(["bash", script, "2", *argv, "--max-update", str(updates)],
                              env=tool_env(MASTER_PORT=free_port()), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "distributed init (rank 1)" in proc.stdout + proc.stderr
    log = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in log and "(epoch 1 @ 2 updates)" in log
    assert torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)[
        "optimizer_history"][-1]["num_updates"] == 4
