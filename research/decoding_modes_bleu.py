#!/usr/bin/env python
"""BLEU of the decoding modes below float32 against the exact engine on the
same checkpoints: a vocabulary shortlist at several K, bfloat16 Linear
layers, int8, and int8 with a shortlist; fairseq-generate (beam 4,
``--remove-bpe``, its default batches) on the validation and test sets,
tokenized lowercased BLEU against tokenized references. K is chosen on
validation: the smallest whose BLEU is within 0.2 of the exact engine's.

Example: research/decoding_modes_bleu.py --data work/deen/data-bin
    --path soft=work/deen/checkpoints/checkpoint_best.pt --shortlist work/deen/vmap.txt
    --tok-ref valid=../shared/data/multi30k/tok/val.en --tok-ref test=../shared/data/multi30k/tok/test_2016_flickr.en
    --markdown results/decoding_modes_bleu.md
"""

import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MODES = {"exact": {}, "int8": {"int8_decoding": True}, "bf16": {"bf16_decoding": True}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--path", action="append", required=True, metavar="NAME=CHECKPOINT")
    p.add_argument("--shortlist", required=True, help="the table (vmap) to decode with")
    p.add_argument("--ks", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument("--tok-ref", action="append", required=True, metavar="SUBSET=FILE",
                   help="tokenized lowercased references of a subset (valid=..., test=...)")
    p.add_argument("--no-bf16", action="store_true", help="leave bf16 out (a CPU without it)")
    p.add_argument("--markdown")
    p.add_argument("--json")
    return p.parse_args(argv)


def modes(args):
    found = dict(MODES)
    if args.no_bf16:
        found.pop("bf16")
    for k in args.ks:
        found[f"shortlist k={k}"] = {"shortlist": os.path.abspath(args.shortlist), "shortlist_k": k}
        found[f"int8 + shortlist k={k}"] = {"int8_decoding": True, "shortlist": os.path.abspath(args.shortlist),
                                            "shortlist_k": k}
    return found


def bleu(args, checkpoint, subset, reference, overrides):
    from fairseq_hardattn.tools.scoring import read_hypotheses, tokenized_bleu

    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-generate"), args.data,
                           "--user-dir", os.path.join(REPO, "fairseq_hardattn"), "--path", checkpoint,
                           "--gen-subset", subset, "--beam", "4", "--remove-bpe",
                           "--model-overrides", repr(overrides)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"decoding_modes_bleu: fairseq-generate failed:\n{proc.stderr[-2000:]}")
    return tokenized_bleu([h.lower() for h in read_hypotheses(proc.stdout)], reference)


def main(argv=None):
    from fairseq_hardattn.tools.reporting import write_outputs

    args = parse_args(argv)
    references = dict(item.split("=", 1) for item in args.tok_ref)
    checkpoints = dict(item.split("=", 1) for item in args.path)
    scores = {}
    for name, checkpoint in checkpoints.items():
        for mode, overrides in modes(args).items():
            for subset, reference in references.items():
                scores[name, mode, subset] = bleu(args, checkpoint, subset, reference, overrides)
                print(f"[decoding_modes_bleu] {name} {mode} {subset}: {scores[name, mode, subset]:.2f}",
                      file=sys.stderr, flush=True)
    subsets = list(references)
    lines = [f"| model | mode | {' | '.join(f'{s} BLEU' for s in subsets)} | "
             f"{' | '.join(f'{s} vs exact' for s in subsets)} |",
             "|---|---|" + "---|" * (2 * len(subsets))]
    for name in checkpoints:
        for mode in modes(args):
            row = [f"{scores[name, mode, s]:.2f}" for s in subsets]
            row += [f"{scores[name, mode, s] - scores[name, 'exact', s]:+.2f}" for s in subsets]
            lines.append(f"| {name} | {mode} | {' | '.join(row)} |")
    lines.append("")
    chosen_on = subsets[0]
    for name in checkpoints:
        for prefix in ("shortlist", "int8 + shortlist"):
            base = "exact" if prefix == "shortlist" else "int8"
            within = [k for k in sorted(args.ks)
                      if scores[name, f"{prefix} k={k}", chosen_on] >= scores[name, base, chosen_on] - 0.2]
            if within:
                k = within[0]
                lines.append(f"- {name}, {prefix}: k = {k} chosen on {chosen_on} (the smallest within 0.2 of "
                             f"{base}); " + ", ".join(f"{s} {scores[name, f'{prefix} k={k}', s] - scores[name, base, s]:+.2f}"
                                                     for s in subsets))
            else:
                lines.append(f"- {name}, {prefix}: no k within 0.2 of {base} on {chosen_on}")
    write_outputs({" / ".join(key): value for key, value in scores.items()}, "\n".join(lines),
                  args.json, args.markdown)


if __name__ == "__main__":
    main()
