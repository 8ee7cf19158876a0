"""The checkpoint averaging tool: which epochs it averages, and its errors."""

import subprocess
import sys

import pytest
import torch

from fairseq_hardattn.tools.average_checkpoints import main


def write_run(run_dir, epochs):
    """Epoch checkpoints whose one parameter equals their epoch number."""
    run_dir.mkdir()
    for epoch in epochs:
        torch.save({"model": {"w": torch.full((2,), float(epoch)), "steps": torch.tensor(epoch)},
                    "last_optimizer_state": {"unused": 1}},
                   run_dir / f"checkpoint{epoch}.pt")
    torch.save({"model": {"w": torch.zeros(2)}}, run_dir / "checkpoint_last.pt")
    return run_dir


def averaged(run_dir, tmp_path, *flags):
    output = tmp_path / "avg.pt"
    main(["--inputs", str(run_dir), "--output", str(output), *flags])
    return torch.load(output)


def test_averages_the_last_epochs_in_numeric_order(tmp_path):
    run = write_run(tmp_path / "run", [1, 2, 9, 10, 11])  # 9 < 10 < 11, not as strings
    state = averaged(run, tmp_path, "--num-epoch-checkpoints", "3")
    assert torch.equal(state["model"]["w"], torch.full((2,), 10.0))
    assert state["last_optimizer_state"] is None


def test_upper_bound_gives_a_shorter_budget_of_the_run(tmp_path):
    run = write_run(tmp_path / "run", range(1, 9))
    state = averaged(run, tmp_path, "--num-epoch-checkpoints", "2", "--checkpoint-upper-bound", "5")
    assert torch.equal(state["model"]["w"], torch.full((2,), 4.5))


def test_upper_bound_beyond_the_run_is_one_clear_error(tmp_path):
    run = write_run(tmp_path / "run", range(1, 5))
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_hardattn.tools.average_checkpoints", "--inputs", str(run),
         "--num-epoch-checkpoints", "2", "--checkpoint-upper-bound", "7",
         "--output", str(tmp_path / "avg.pt")],
        capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no checkpoint7.pt (the run has reached epoch 4)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "avg.pt").exists()


def test_too_few_checkpoints_is_an_error(tmp_path):
    run = write_run(tmp_path / "run", [1, 2, 3])
    with pytest.raises(SystemExit):
        main(["--inputs", str(run), "--num-epoch-checkpoints", "2",
              "--checkpoint-upper-bound", "1", "--output", str(tmp_path / "avg.pt")])
