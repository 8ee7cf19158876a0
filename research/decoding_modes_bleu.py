#!/usr/bin/env python
"""BLEU of the decoding modes below float32 against the exact engine on the
same checkpoints: a vocabulary shortlist at several K, bfloat16 Linear
layers, int8, and int8 with a shortlist; fairseq-generate (beam 4,
``--remove-bpe``, its default batches) on the validation and test sets,
tokenized lowercased BLEU against tokenized references. K is chosen on
validation: the smallest whose BLEU is within 0.2 of the exact engine's.
Beside each difference, its 95% interval under paired bootstrap resampling
of the sentences: how much of it the set can tell from chance. And for
each mode how many translations differ from the exact engine's, and its
runaways: translations three times their reference's length or more (a
repetition loop), which move BLEU most.

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
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="resamplings for each difference's 95%% interval (default 1000; 0: none)")
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


def decode(args, checkpoint, subset, overrides):
    """The lowercased hypotheses of fairseq-generate on ``subset``."""
    from hardattn_tools.scoring import read_hypotheses

    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-generate"), args.data,
                           "--user-dir", os.path.join(REPO, "fairseq_hardattn"), "--path", checkpoint,
                           "--gen-subset", subset, "--beam", "4", "--remove-bpe",
                           "--model-overrides", repr(overrides)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"decoding_modes_bleu: fairseq-generate failed:\n{proc.stderr[-2000:]}")
    return [h.lower() for h in read_hypotheses(proc.stdout)]


def runaways(hyps, reference):
    """How many of ``hyps`` are three times their reference's tokens or more."""
    with open(reference, encoding="utf-8") as f:
        return sum(len(h.split()) >= 3 * max(len(r.split()), 1) for h, r in zip(hyps, f))


def main(argv=None):
    from hardattn_tools.reporting import write_outputs
    from hardattn_tools.scoring import paired_bootstrap, tokenized_bleu

    args = parse_args(argv)
    references = dict(item.split("=", 1) for item in args.tok_ref)
    checkpoints = dict(item.split("=", 1) for item in args.path)
    scores, exact_hyps, intervals, loops, changed = {}, {}, {}, {}, {}
    for name, checkpoint in checkpoints.items():
        for mode, overrides in modes(args).items():
            for subset, reference in references.items():
                hyps = decode(args, checkpoint, subset, overrides)
                scores[name, mode, subset] = tokenized_bleu(hyps, reference)
                loops[name, mode, subset] = runaways(hyps, reference)
                if mode == "exact":
                    exact_hyps[name, subset] = hyps
                elif args.bootstrap:
                    intervals[name, mode, subset] = paired_bootstrap(exact_hyps[name, subset], hyps, reference,
                                                                     args.bootstrap)
                changed[name, mode, subset] = sum(a != b for a, b in zip(exact_hyps[name, subset], hyps))
                print(f"[decoding_modes_bleu] {name} {mode} {subset}: {scores[name, mode, subset]:.2f}",
                      file=sys.stderr, flush=True)
    subsets = list(references)
    columns = [f"{s} vs exact" for s in subsets] + ([f"{s}, 95% interval" for s in subsets] if args.bootstrap else [])
    columns += [f"{s} changed" for s in subsets] + [f"{s} runaways" for s in subsets]
    lines = [f"| model | mode | {' | '.join(f'{s} BLEU' for s in subsets)} | {' | '.join(columns)} |",
             "|---|---|" + "---|" * (len(subsets) + len(columns))]
    for name in checkpoints:
        for mode in modes(args):
            row = [f"{scores[name, mode, s]:.2f}" for s in subsets]
            row += [f"{scores[name, mode, s] - scores[name, 'exact', s]:+.2f}" for s in subsets]
            if args.bootstrap:
                row += ["" if mode == "exact" else "[{:+.2f}, {:+.2f}]".format(*intervals[name, mode, s])
                        for s in subsets]
            row += [str(changed[name, mode, s]) for s in subsets] + [str(loops[name, mode, s]) for s in subsets]
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
    figures = {" / ".join(key): value for key, value in scores.items()}
    figures.update({" / ".join(key) + " / 95% interval vs exact": list(value) for key, value in intervals.items()})
    figures.update({" / ".join(key) + " / runaways": value for key, value in loops.items()})
    figures.update({" / ".join(key) + " / changed": value for key, value in changed.items()})
    write_outputs(figures, "\n".join(lines), args.json, args.markdown)


if __name__ == "__main__":
    main()
