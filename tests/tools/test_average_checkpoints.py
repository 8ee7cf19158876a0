"""The checkpoint averaging tool (which epochs it averages, and its errors) and
examples/multi30k/budget_view.sh, which scores a shorter budget of a long run
with it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, TRAIN_FLAGS, run_cli, tiny_dim_flags, tool_env
from hardattn_tools.average_checkpoints import main


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
        [sys.executable, "-m", "hardattn_tools.average_checkpoints", "--inputs", str(run),
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


def test_budget_view_scores_the_runs_that_reached_the_epoch(tmp_path):
    """The view averages each run's checkpoints up to EPOCH, links the long
    run's data, notes the budget and scores valid and test2016 (scoring is a
    stand-in recording what it was asked; the real one is exercised elsewhere)."""
    m30k = tmp_path / "repo" / "examples" / "multi30k"
    m30k.mkdir(parents=True)
    for name in ("common.sh", "budget_view.sh"):
        (m30k / name).write_text((REPO / "examples" / "multi30k" / name).read_text())
    journal = tmp_path / "journal"
    (m30k / "evaluate.sh").write_text(
        f'[ -f "$2/runs/$3/checkpoint_avg.pt" ] && echo "score ${{SUBSET:-test}} $3 $4" >> {journal}\n')
    long = tmp_path / "long"
    (long / "data-bin").mkdir(parents=True)
    (long / "budget.json").write_text(json.dumps({"epochs": 60, "seed": 1}))
    (long / "runs").mkdir()
    write_run(long / "runs" / "soft", range(1, 9))
    write_run(long / "runs" / "hard", range(1, 5))  # has not reached epoch 6
    view = tmp_path / "view"

    def budget_view(*args):
        env = tool_env(AVERAGE_LAST="3")
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        return subprocess.run(["bash", str(m30k / "budget_view.sh"), tmp_path / "data", long, *map(str, args)],
                              env=env, capture_output=True, text=True, timeout=300)

    proc = budget_view(6, view)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (view / "data-bin").resolve() == (long / "data-bin").resolve()
    assert json.loads((view / "budget.json").read_text()) == {"epochs": 6, "seed": 1}
    state = torch.load(view / "runs" / "soft" / "checkpoint_avg.pt")
    assert torch.equal(state["model"]["w"], torch.full((2,), 5.0))  # epochs 4, 5, 6
    assert not (view / "runs" / "hard").exists()
    assert sorted(journal.read_text().splitlines()) == ["score test soft soft", "score valid soft soft"]

    proc = budget_view(6, view, "hard")  # named: it must have reached the epoch
    assert proc.returncode != 0
    assert "no checkpoint6.pt (the run has reached epoch 4)" in proc.stderr
    assert "Traceback" not in proc.stderr
    (long / "runs" / "soft" / "checkpoint7.pt").unlink()  # as --keep-last-epochs deletes
    proc = budget_view(8, tmp_path / "view8")
    assert proc.returncode == 2
    assert "soft: checkpoint7.pt was not kept (train the long run with KEEP_EPOCHS=-1)" in proc.stderr
    proc = budget_view(9, tmp_path / "view9")
    assert proc.returncode == 2 and "no run of" in proc.stderr and "has reached epoch 9" in proc.stderr


def test_a_longer_run_holds_the_shorter_budget(reorder_data, tmp_path):
    """What budget_view.sh relies on: --max-epoch changes nothing before the
    run stops (inverse-sqrt schedule, seeds per update), so epoch 2 of a 3-epoch
    run is the 2-epoch run, sampled hard retrieval included, and averaging up
    to epoch 2 gives the short run's average."""
    arch = "transformer_hard_dec"

    def train(save_dir, epochs):
        run_cli("fairseq-train", reorder_data, "--arch", arch, *TRAIN_FLAGS, *tiny_dim_flags(arch),
                "--dropout", "0.3", "--max-epoch", epochs, "--save-dir", save_dir)

    train(tmp_path / "short", 2)
    train(tmp_path / "long", 3)
    short = averaged(tmp_path / "short", tmp_path, "--num-epoch-checkpoints", "2")["model"]
    (tmp_path / "avg.pt").unlink()
    view = averaged(tmp_path / "long", tmp_path, "--num-epoch-checkpoints", "2",
                    "--checkpoint-upper-bound", "2")["model"]
    assert short.keys() == view.keys()
    assert all(torch.equal(short[k], view[k]) for k in short)
    last = torch.load(tmp_path / "long" / "checkpoint3.pt", weights_only=False)["model"]
    assert not all(torch.equal(short[k], last[k]) for k in short)  # the long run went on
