#!/usr/bin/env python
"""BLEU against score computations per step (CPS) for flexible attention over
several test-time thresholds τ (Shu & Nakayama's Figure 4), as a PNG and JSON.

Each τ decodes the whole test set with the same checkpoint (beam search as
fairseq-generate runs it) and counts the positions scored; BLEU is
tokenized and lowercased against --tok-ref (BPE removed). Several
checkpoints (``--checkpoint LABEL=PATH``, repeated) give one curve each in
the same plot.

Example: research/bleu_vs_cps.py --data data-bin --checkpoint flexible.pt \
           --tok-ref multi30k/tok/test_2016_flickr.de --thresholds 0.25 0.5 1 1.38 2 inf --out curve.png
"""

import argparse
import logging
import os

import sys
import warnings

warnings.filterwarnings("ignore")
logging.getLogger("fairseq").setLevel(logging.WARNING)

import torch  # noqa: E402
from fairseq import checkpoint_utils  # noqa: E402

from fairseq_hardattn import ConfigError, compat  # noqa: E402
from hardattn_tools import fixtures, timing  # noqa: E402
from hardattn_tools.plotting import pyplot, save_line_plot  # noqa: E402
from hardattn_tools.reporting import write_outputs  # noqa: E402
from hardattn_tools.scoring import tokenized_bleu  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--checkpoint", required=True, action="append", metavar="[LABEL=]PATH",
                   help="a flexible-attention checkpoint, optionally labelled (no '=' in "
                        "the label); repeat for one curve each")
    p.add_argument("--tok-ref", required=True, help="tokenized references of the test set")
    p.add_argument("--thresholds", nargs="+", default=["0.25", "0.5", "1", "auto", "2", "4", "inf"])
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--label", default="flexible", help="label of an unlabelled --checkpoint")
    p.add_argument("--extra", action="append", default=[], metavar="LABEL=CPS,BLEU",
                   help="reference points to draw (e.g. global or local attention)")
    p.add_argument("--out", required=True, help="PNG path")
    p.add_argument("--json")
    args = p.parse_args(argv)
    checkpoints = []
    for spec in args.checkpoint:
        label, sep, path = spec.partition("=")
        if not sep:
            label, path = args.label, spec
        if not os.path.isfile(path):
            p.error(f"--checkpoint {path}: no such file (labels may not contain '=')")
        checkpoints.append((label, path))
    torch.set_num_threads(args.threads)
    task = fixtures.setup_translation_task(args.data)
    batches = fixtures.test_batches(task, "test", args.batch_size)
    curves = []
    for label, path in checkpoints:
        curves.append({"label": label, "checkpoint": path,
                       "points": [measure(p, task, batches, label, path, threshold, args)
                                  for threshold in args.thresholds]})

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for curve in curves:
        ordered = sorted(curve["points"], key=lambda q: q["cps"])
        line, = ax.plot([q["cps"] for q in ordered], [q["bleu"] for q in ordered], marker="o",
                        label=curve["label"])
        for q in ordered:
            ax.annotate(f"τ={q['threshold']}", (q["cps"], q["bleu"]), fontsize=7,
                        color=line.get_color(), textcoords="offset points", xytext=(3, 3))
    for extra in args.extra:
        label, _, values = extra.partition("=")
        cps, bleu = map(float, values.split(","))
        ax.scatter([cps], [bleu], marker="s", label=label)
    ax.set_xlabel("score computations per decoding step (CPS)")
    ax.set_ylabel("BLEU (tokenized, lowercased)")
    ax.set_title("BLEU vs attention computations")
    save_line_plot(fig, ax, args.out)
    write_outputs({"beam": args.beam, "curves": curves}, "", args.json, echo=False)


def measure(parser, task, batches, label, checkpoint, threshold, args):
    """Decode the test set with one checkpoint at one τ: its CPS and BLEU."""
    try:
        with compat.loading():
            models, _ = checkpoint_utils.load_model_ensemble(
                [checkpoint], arg_overrides={"flexible_threshold": threshold}, task=task)
    except ConfigError as error:  # e.g. the threshold does not apply to its family
        parser.error(f"{checkpoint} has no flexible attention ({error})")
    model = models[0]
    if not hasattr(model, "cps_summary"):
        parser.error(f"{checkpoint} has no flexible attention")
    model.enable_cps_counting()
    generator = fixtures.make_generator(fixtures.prepare_for_decoding(model, args.beam),
                                         task.target_dictionary, args.beam)
    hyps = timing.translate(generator, batches, task.target_dictionary)
    cps = model.cps_summary()
    point = {"threshold": threshold, "cps": round(cps["cps"], 3),
             "global_cps": round(cps["global_cps"], 3),
             "bleu": round(tokenized_bleu(hyps, args.tok_ref), 2)}
    print(f"[bleu_vs_cps] {label}, tau {threshold}: CPS {point['cps']:.2f} of "
          f"{point['global_cps']:.2f}, BLEU {point['bleu']:.2f}", file=sys.stderr, flush=True)
    return point


if __name__ == "__main__":
    main()
