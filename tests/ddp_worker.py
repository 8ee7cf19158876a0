"""One worker of the multi-worker test, started by torchrun (see test_reliability.py).

For every architecture given, with 2 workers (gloo, legacy_ddp, as
scripts/train_distributed.sh launches fairseq-train):
  A: train 4 updates in one go;
  B: train 2 updates, save, resume from the checkpoint to 4 updates.
Each worker saves its own final parameters of A and B, so the test can check
that the workers agree and that B (resumed) equals A exactly.

Usage: torchrun --nproc-per-node 2 tests/ddp_worker.py DATA OUT ARCH [ARCH...]
"""

import os
import sys

import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.trainer import Trainer
from fairseq_cli import train

sys.path.insert(0, os.path.dirname(__file__))
from conftest import TRAIN_FLAGS, tiny_dim_flags  # noqa: E402

trainers = []
_trainer_init = Trainer.__init__


def _remember_trainer(self, *args, **kwargs):
    _trainer_init(self, *args, **kwargs)
    trainers.append(self)


Trainer.__init__ = _remember_trainer


def run(data, save_dir, arch, updates):
    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    argv = [data, "--arch", arch, *TRAIN_FLAGS, *tiny_dim_flags(arch),
            "--max-update", str(updates), "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--distributed-world-size", world, "--distributed-backend", "gloo",
            "--distributed-init-method", "env://", "--distributed-no-spawn",
            "--distributed-rank", rank, "--ddp-backend", "legacy_ddp",
            "--load-checkpoint-on-all-dp-ranks", "--max-tokens", "300"]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(a) for a in argv])
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)
    model = trainers[-1].get_model()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main():
    data, out, *archs = sys.argv[1:]
    rank = os.environ["RANK"]
    for arch in archs:
        straight = run(data, os.path.join(out, arch, "straight"), arch, 4)
        run(data, os.path.join(out, arch, "resumed"), arch, 2)
        resumed = run(data, os.path.join(out, arch, "resumed"), arch, 4)
        torch.save({"straight": straight, "resumed": resumed,
                    "updates": trainers[-1].get_num_updates()},
                   os.path.join(out, arch, f"rank{rank}.pt"))
        print(f"[ddp_worker {rank}] {arch} done", flush=True)


if __name__ == "__main__":
    main()
