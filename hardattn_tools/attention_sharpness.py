"""How sharp a trained model's hard retrieval heads are: teacher-forced on a
data set, per decoder layer and attention, the mean softmax mass P on the key
each head retrieves (its argmax) and the effective number of keys exp(H(P)).

A head that keeps mass 1 on its argmax retrieves exactly what P·V would give,
the output the straight-through gradient assumes in training; the further
below 1, the more a hard decoding departs from what the gradient trained.
Hard heads only (soft ones have no retrieval to compare with).

Usage: python -m hardattn_tools.attention_sharpness DATA_BIN CHECKPOINT...
           [--subset valid] [--max-tokens 4096] [--json OUT.json]
"""

import argparse
import os
from collections import defaultdict
from typing import Dict

import torch
import torch.nn.functional as F

from fairseq_hardattn import USER_DIR

from .provenance import write_json


def _measure_scores(module, name: str, totals: Dict[str, list], query_rows: dict):
    """Wraps ``module.scores`` so that each call adds its rows' argmax mass and
    effective key count to ``totals[name]``; what it returns is unchanged."""
    compute = module.scores

    def scores(p, attn_mask, scaled=True):
        computed = compute(p, attn_mask, scaled=scaled)
        # the softmax of the scaled scores (inference asks for unscaled ones)
        probs = F.softmax((computed if scaled else computed * module.scaling).float(), dim=-1)
        # real target positions only, and no all-masked row (NaN)
        rows = query_rows["mask"].repeat_interleave(module.num_heads, 0)[:, :probs.size(1)]
        rows = rows & ~torch.isnan(probs[..., 0])
        probs = probs[rows]
        entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
        total = totals[name]
        total[0] += probs.amax(-1).sum().item()
        total[1] += entropy.exp().sum().item()
        total[2] += probs.size(0)
        return computed

    module.scores = scores


def sharpness(data_bin: str, checkpoint: str, subset: str = "valid",
              max_tokens: int = 4096) -> Dict[str, Dict[str, float]]:
    """{module name: {"argmax_mass", "effective_keys", "rows"}} of every hard
    retrieval attention of ``checkpoint``, teacher-forced on ``subset``."""
    from fairseq import checkpoint_utils, utils

    from fairseq_hardattn.modules import HardRetrievalAttention

    if not os.path.isfile(checkpoint):
        raise ValueError(f"no checkpoint at {checkpoint}")
    utils.import_user_module(argparse.Namespace(user_dir=USER_DIR))
    from fairseq_hardattn.compat import loading

    with loading():
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [checkpoint], arg_overrides={"data": data_bin})
    model = models[0].eval()
    hard = [(name, m) for name, m in model.named_modules() if isinstance(m, HardRetrievalAttention)]
    if not hard:
        raise ValueError(f"{checkpoint} has no hard retrieval attention: nothing to measure")
    totals = defaultdict(lambda: [0.0, 0.0, 0])
    query_rows = {}
    for name, module in hard:
        _measure_scores(module, name, totals, query_rows)
    task.load_dataset(subset)
    batches = task.get_batch_iterator(task.dataset(subset), max_tokens=max_tokens,
                                      max_positions=utils.resolve_max_positions(
                                          task.max_positions(), model.max_positions()),
                                      ignore_invalid_inputs=True).next_epoch_itr(shuffle=False)
    pad = task.target_dictionary.pad()
    with torch.no_grad():
        for sample in batches:
            query_rows["mask"] = sample["target"].ne(pad)
            model(**sample["net_input"])
    return {name: {"argmax_mass": round(top / rows, 4), "effective_keys": round(keys / rows, 3),
                   "rows": rows}
            for name, (top, keys, rows) in totals.items()}


def mean_argmax_mass(measured: Dict[str, Dict[str, float]]) -> float:
    """The argmax mass over every hard head's rows of one model."""
    rows = sum(n["rows"] for n in measured.values())
    return round(sum(n["argmax_mass"] * n["rows"] for n in measured.values()) / rows, 3)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Mean argmax mass and effective number of keys of a model's hard "
                    "retrieval heads, teacher-forced on a data set.")
    parser.add_argument("data_bin", help="the binarized data the model was trained with")
    parser.add_argument("checkpoints", nargs="+", metavar="checkpoint",
                        help="checkpoints (e.g. RUN/checkpoint_avg.pt), each named by its folder")
    parser.add_argument("--subset", default="valid", help="the data set (default: valid)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    parser.add_argument("--json", metavar="OUT",
                        help="also write the numbers to OUT: per run, all hard heads' argmax mass "
                             "and the numbers per attention")
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error("--max-tokens must be positive")
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    runs = {}
    print("run\tattention\targmax mass\teffective keys")
    for checkpoint in args.checkpoints:
        try:
            measured = sharpness(args.data_bin, checkpoint, args.subset, args.max_tokens)
        except (OSError, ValueError) as err:
            parser.error(str(err))
        run = os.path.basename(os.path.dirname(os.path.abspath(checkpoint)))
        for name, numbers in measured.items():
            print(f"{run}\t{name}\t{numbers['argmax_mass']:.3f}\t{numbers['effective_keys']:.2f}")
        runs[run] = {"all_hard_heads_argmax_mass": mean_argmax_mass(measured), "per_attention": measured}
        print(f"{run}\tall hard heads\t{runs[run]['all_hard_heads_argmax_mass']:.3f}")
    if args.json:
        write_json(args.json, runs)


if __name__ == "__main__":
    main()
