#!/usr/bin/env python
"""What smaller lists of candidates would give a vocabulary shortlist: one
decoding step's output projection over the whole vocabulary, over a batch's
candidates (the union of its sentences', what the shortlist runs) and over
those of groups of --groups consecutive sentences (1: each sentence's own),
a group's rows of the projection gathered once a batch and padded to the
batch's longest list; each followed by the search's pass over the logits
(the C candidates kernel: log-normaliser and top 2 x beam of every row;
--projection-only: without it). Real batches: the sources of --text in
consecutive batches and the table of --shortlist; random weights at the
preset's dims. One thread, the kinds alternated in one process, the median
of --rounds.

Example: research/shortlist_groups.py --dims small --vocab 10000
    --text work/deen/bpe/test_2016_flickr.de --dictionary work/deen/data-bin/dict.de.txt
    --target-dictionary work/deen/data-bin/dict.en.txt --shortlist work/deen/vmap100.txt
"""

import argparse
import os
import statistics
import sys
import time

from hardattn_tools.provenance import write_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

EMBED_DIM = {"small": 128, "base": 512}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", choices=sorted(EMBED_DIM), default="small")
    p.add_argument("--vocab", type=int, default=10000, help="target vocabulary (padded with unused tokens)")
    p.add_argument("--text", required=True, help="sources: a BPE'd text file")
    p.add_argument("--dictionary", required=True, help="its dictionary (fairseq's dict.LANG.txt)")
    p.add_argument("--target-dictionary", required=True, help="the target side's dictionary")
    p.add_argument("--shortlist", required=True, help="a shortlist table (vmap) in these dictionaries' tokens")
    p.add_argument("--shortlist-k", type=int, help="each source token's K best (default: the whole line)")
    p.add_argument("--sentences", type=int, default=512, help="(whole batches of them)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--groups", type=int, nargs="+", default=[1, 4, 8, 16],
                   help="sentences that share one list of candidates (each divides --batch)")
    p.add_argument("--packed-groups", action="store_true",
                   help="a group's rows packed for oneDNN's Linear (as the search packs a batch's), one product a group (else one batched "
                        "matrix product over the groups)")
    p.add_argument("--len", type=int, default=30, help="steps a batch decodes (the gather is paid once)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--projection-only", dest="with_top", action="store_false",
                   help="time the projections alone (without the pass over the logits)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    for group in args.groups:
        if group < 1 or args.batch % group:
            p.error(f"--groups {group} must divide --batch {args.batch}")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch
    from fairseq.data import Dictionary

    from fairseq_hardattn import kernels
    from fairseq_hardattn.decoding import packed_linear
    from fairseq_hardattn.decoding.shortlist import Shortlist

    torch.set_num_threads(1)
    torch.manual_seed(1)
    source, target = Dictionary.load(args.dictionary), Dictionary.load(args.target_dictionary)
    shortlist = Shortlist.load(args.shortlist, source, target, args.shortlist_k)
    with open(args.text, encoding="utf-8") as f:
        lines = [line.split() for _, line in zip(range(args.sentences), f)]
    sentences = [torch.tensor([source.index(t) for t in words] + [source.eos()]) for words in lines]
    batches = [sentences[i:i + args.batch] for i in range(0, len(sentences) - args.batch + 1, args.batch)]
    vocab, dim, beam = max(args.vocab, len(target)), EMBED_DIM[args.dims], args.beam
    weight = torch.randn(vocab, dim) / dim ** 0.5

    def product_of(rows):
        """x @ rows.T as the search runs the projection: oneDNN's Linear on rows packed once."""
        if packed_linear.onednn_linear_available():
            return packed_linear.packed_product(rows)
        return lambda x, transposed=rows.t().contiguous(): torch.mm(x, transposed)

    whole = product_of(weight)

    no_columns, no_adds = torch.empty(0, dtype=torch.long), torch.empty(0)

    def top(logits):
        """The search's pass over the logits: the C candidates kernel where it runs."""
        if not args.with_top:
            return logits
        if kernels.can_run_beam_candidates(logits):
            return kernels.beam_candidates(logits, no_columns, no_adds, 2 * beam)
        return torch.log_softmax(logits, -1).topk(2 * beam, dim=-1)

    def candidates_of(sentences):
        return shortlist.candidates(torch.nn.utils.rnn.pad_sequence(sentences, batch_first=True,
                                                                    padding_value=source.pad()))

    def union_step(batch):
        columns = candidates_of(batch)
        product = product_of(weight.index_select(0, columns))
        return (lambda features: top(product(features))), len(columns)

    def grouped_step(batch, size):
        """Consecutive groups of ``size`` sentences, each over its sentences' candidates."""
        groups = [batch[i:i + size] for i in range(0, len(batch), size)]
        lists = [candidates_of(g) for g in groups]
        width = max(len(c) for c in lists)
        mask = torch.full((len(groups), 1, width), float("-inf"))
        for i, c in enumerate(lists):
            mask[i, 0, :len(c)] = 0
        rows_a_group = size * beam
        if args.packed_groups:
            # a product a group, into its rows of one padded buffer
            products = [product_of(weight.index_select(0, c)) for c in lists]
            logits = mask.expand(len(groups), rows_a_group, width).contiguous()

            def step(features):
                grouped = features.view(len(groups), rows_a_group, dim)
                for g, (product, c) in enumerate(zip(products, lists)):
                    logits[g, :, :len(c)] = product(grouped[g])
                return top(logits.view(len(batch) * beam, width))
        else:
            index = torch.zeros(len(groups), width, dtype=torch.long)
            for i, c in enumerate(lists):
                index[i, :len(c)] = c
            rows = weight[index].transpose(1, 2).contiguous()  # (groups, dim, width)

            def step(features):
                logits = torch.baddbmm(mask, features.view(len(groups), rows_a_group, dim), rows)
                return top(logits.view(len(batch) * beam, width))
        return step, (statistics.mean(len(c) for c in lists), width)

    def whole_step(batch):
        return (lambda features: top(whole(features))), vocab

    kinds = {"whole vocabulary": whole_step, "batch's candidates": union_step,
             **{f"candidates of groups of {g}": (lambda batch, g=g: grouped_step(batch, g)) for g in args.groups}}
    features = [torch.randn(len(b) * beam, dim) for b in batches]
    runs = {name: [] for name in kinds}
    sizes = {name: [] for name in kinds}
    with torch.no_grad():
        for round_ in range(args.rounds + 1):  # the first round warms up
            for name, build in kinds.items():
                start = time.perf_counter()
                for batch, x in zip(batches, features):
                    step, size = build(batch)
                    for _ in range(args.len):
                        step(x)
                    if not round_:
                        sizes[name].append(size)
                if round_:
                    runs[name].append(time.perf_counter() - start)
    median = {name: statistics.median(r) for name, r in runs.items()}
    steps = len(batches) * args.len
    figures = {"settings": {k: v for k, v in vars(args).items() if k != "json"},
               "seconds": median, "ms_per_step": {n: 1000 * s / steps for n, s in median.items()},
               "runs": runs,
               "columns": {"whole vocabulary": vocab,
                           "batch's candidates": statistics.mean(sizes["batch's candidates"]),
                           **{f"groups of {g} (mean, padded width)": [
                               statistics.mean(m for m, _ in sizes[f"candidates of groups of {g}"]),
                               statistics.mean(w for _, w in sizes[f"candidates of groups of {g}"])]
                              for g in args.groups}}}
    for name, seconds in median.items():
        print(f"{name}: {1000 * seconds / steps:.3f} ms a step "
              f"({median['whole vocabulary'] / seconds:.2f}x the whole vocabulary's)")
    print("columns: " + ", ".join(f"{k} {v}" for k, v in figures["columns"].items()))
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
