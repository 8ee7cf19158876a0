#!/usr/bin/env python
"""The plugin's search against CTranslate2 on real sentences, one thread:
a trained fairseq transformer decoding a binarized set with beam search to
its own lengths (not to a fixed length, as the random-weight benchmarks
do), the same batches of sentences sorted by length through both, and
CTranslate2 on the same weights. Prints sentences/s, the output tokens, how
many translations are the same, and the engine's steps with the rows each
decoded: a batch runs until its last sentence ends, so most steps are the
tail of a few sentences, where a step's fixed cost, not its arithmetic,
decides the rate; and the time by a step's rows, with what the steps would
take were every row as cheap as in full ones. Needs ctranslate2.

Example: research/real_data_peer.py --data work/deen/data-bin
    --path work/deen/checkpoints/checkpoint_best.pt --subset test --batch-size 64
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--subset", default="test")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--ct2-hypotheses", type=int, default=1,
                   help="CTranslate2's num_hypotheses; the beam size ends a sentence as fairseq's "
                        "search does, once it has beam-many finished hypotheses")
    p.add_argument("--modules-step", action="store_true",
                   help="every decoder step through the modules' forwards (the direct step off), "
                        "to compare with it")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from fairseq import checkpoint_utils

    from fairseq_hardattn import compat
    from fairseq_hardattn.decoding import PluginBeamSearch, beam_search, direct_step
    from fairseq_hardattn.tools.ctranslate2_peer import convert
    from fairseq_hardattn.tools.scratch import scratch_folder

    with compat.loading():
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([args.path],
                                                                          arg_overrides={"data": args.data})
    model = models[0].eval()
    model.prepare_for_inference_(cfg)
    task.load_dataset(args.subset)
    batches = list(task.get_batch_iterator(task.dataset(args.subset), max_sentences=args.batch_size,
                                           disable_iterator_cache=True).next_epoch_itr(shuffle=False))
    d = task.target_dictionary
    rows, began_at = [], []  # each step's rows, and when it began (None: a batch's first step)
    step = beam_search.StepLogits.__call__

    def counted(self, prefix, one_per_sentence):
        rows.append(prefix.size(0))
        began_at.append(time.perf_counter() if prefix.size(1) > 1 else None)  # (size 1: step 0)
        return step(self, prefix, one_per_sentence)

    if args.modules_step:
        direct_step.supports = lambda decoder: "--modules-step"
    generator = PluginBeamSearch([model], d, beam_size=args.beam, max_len_b=args.max_len)
    with torch.no_grad():
        generator.generate([model], batches[0])  # warm-up
        beam_search.StepLogits.__call__ = counted
        began = time.perf_counter()
        ours = {i: d.string(h[0]["tokens"]) for b in batches
                for i, h in zip(b["id"].tolist(), generator.generate([model], b))}
        engine_seconds = time.perf_counter() - began
        beam_search.StepLogits.__call__ = step
    sentences = len(ours)

    import ctranslate2

    translator = ctranslate2.Translator(convert(model, d, str(scratch_folder("peer-"))), device="cpu",
                                        compute_type="float32", inter_threads=1, intra_threads=1)
    sources = [[[d[t] for t in row.tolist() if t not in (d.pad(), d.eos())] for row in b["net_input"]["src_tokens"]]
               for b in batches]
    options = dict(beam_size=args.beam, max_decoding_length=args.max_len + 1, num_hypotheses=args.ct2_hypotheses)
    translator.translate_batch(sources[0], **options)  # warm-up
    began = time.perf_counter()
    theirs = [r for words in sources for r in translator.translate_batch(words, max_batch_size=len(words), **options)]
    ct2_seconds = time.perf_counter() - began
    ids = [i for b in batches for i in b["id"].tolist()]
    same = sum(" ".join(r.hypotheses[0]) == ours[i] for i, r in zip(ids, theirs))
    print(f"engine: {sentences / engine_seconds:.1f} sentences/s; CTranslate2: {sentences / ct2_seconds:.1f} "
          f"({ct2_seconds / engine_seconds:.2f}x the engine's time); output tokens {sum(len(t.split()) + 1 for t in ours.values())} "
          f"and {sum(len(r.hypotheses[0]) + 1 for r in theirs)}; the same translation for {same} of {sentences}")
    print(f"engine steps: {len(rows)} over {len(batches)} batches of {args.batch_size}; rows a step: mean "
          f"{statistics.mean(rows):.0f}, first {args.batch_size * args.beam}; steps with fewer than 16 rows "
          f"(4 sentences at beam 4): {sum(r < 16 for r in rows)}")
    print(steps_by_rows(rows, began_at, args.batch_size * args.beam))


def steps_by_rows(rows, began_at, full):
    """Where the search's time goes by a step's rows: each step timed from
    its start to the next one's within a batch (the search's work between
    them included; a batch's first and last steps are not timed), and what
    the timed steps would take were every row as cheap as in steps of at
    least half the batch's rows (the bound of a search that refilled its
    batch as sentences end)."""
    spans = [(r, later - start) for r, start, later in zip(rows, began_at, began_at[1:])
             if start is not None and later is not None]
    timed = sum(t for _, t in spans)
    large = [(r, t) for r, t in spans if 2 * r >= full]
    if not large:
        return f"timed steps {timed:.2f} s; none of at least {full // 2} rows to set a row's cost"
    per_row = sum(t for _, t in large) / sum(r for r, _ in large)
    small = [(r, t) for r, t in spans if r < 16]
    return (f"timed steps {timed:.2f} s; steps with fewer than 16 rows {sum(t for _, t in small):.2f} s "
            f"({len(small)} steps, {sum(r for r, _ in small)} rows); steps of at least {full // 2} rows "
            f"{sum(t for _, t in large):.2f} s, {per_row * 1e6:.1f} us a row; every row at that cost: "
            f"{per_row * sum(r for r, _ in spans):.2f} s")


if __name__ == "__main__":
    main()
