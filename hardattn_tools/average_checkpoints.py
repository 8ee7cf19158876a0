"""Average the parameters of a run's last epoch checkpoints (fairseq's
``scripts/average_checkpoints.py``, which the fairseq wheel does not ship).

Usage: python -m hardattn_tools.average_checkpoints --inputs RUN_DIR
           --num-epoch-checkpoints 5 --output RUN_DIR/checkpoint_avg.pt
           [--checkpoint-upper-bound EPOCH]

``--checkpoint-upper-bound E`` averages the 5 epochs ending at E: with the
inverse-sqrt schedule (which does not depend on --max-epoch) that is the model
an E-epoch training would have produced, so one long run gives every shorter
budget.
"""

import argparse
import os
import re
import sys

import torch

import fairseq_hardattn  # noqa: F401  (torch >= 2.6 loads fairseq checkpoints)


def last_epoch_checkpoints(run_dir, count, upper_bound=None):
    pattern = re.compile(r"checkpoint(\d+)\.pt$")
    epochs = sorted(
        (int(m.group(1)), os.path.join(run_dir, name))
        for name in os.listdir(run_dir)
        if (m := pattern.fullmatch(name))
    )
    if upper_bound is not None:
        # a bound the run has not reached would silently average earlier epochs
        if upper_bound not in {epoch for epoch, _ in epochs}:
            reached = epochs[-1][0] if epochs else 0
            raise ValueError(
                f"{run_dir}: no checkpoint{upper_bound}.pt (the run has reached epoch {reached})"
            )
        epochs = [(epoch, path) for epoch, path in epochs if epoch <= upper_bound]
    if len(epochs) < count:
        raise ValueError(
            f"{run_dir}: found {len(epochs)} epoch checkpoints, need {count}"
        )
    return [path for _, path in epochs[-count:]]


def average(paths):
    """The first checkpoint's state with its model parameters averaged over ``paths``."""
    summed, state = None, None
    for path in paths:
        state = torch.load(path, map_location="cpu")
        params = state["model"]
        if summed is None:
            summed = {k: v.double() if v.is_floating_point() else v.clone()
                      for k, v in params.items()}
            first = state
        else:
            if params.keys() != summed.keys():
                raise ValueError(f"{path} has different parameters than {paths[0]}")
            for k, v in params.items():
                if v.is_floating_point():
                    summed[k] += v.double()
    first["model"] = {
        k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v
        for k, v in summed.items()
    }
    first["last_optimizer_state"] = None  # not needed to decode; halves the size
    return first


def main(argv=None):
    parser = argparse.ArgumentParser(description="Average the last epoch checkpoints of a run.")
    parser.add_argument("--inputs", required=True, help="the run's --save-dir")
    parser.add_argument("--num-epoch-checkpoints", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint-upper-bound", type=int, metavar="EPOCH",
                        help="average the checkpoints up to this epoch (a shorter budget of the run)")
    args = parser.parse_args(argv)
    try:
        paths = last_epoch_checkpoints(
            args.inputs, args.num_epoch_checkpoints, args.checkpoint_upper_bound
        )
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    print("averaging", ", ".join(os.path.basename(p) for p in paths), file=sys.stderr)
    torch.save(average(paths), args.output)
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
