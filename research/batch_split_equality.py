#!/usr/bin/env python
"""Whether a sentence's hypotheses and scores depend on the sentences that
share its batch: each batch of a binarized set decoded whole, then split by
rows into N parts (the padded width kept, so that only the rows sharing a
matrix product change), by the plugin's search on one thread; counts the
sentences whose n-best tokens or scores (bit for bit) differ. What a
batch decoded in chunks (the search's, for CPU caches and the workers)
changes in a sentence's output: results/decoding_engine.md cites it.

Example: research/batch_split_equality.py --data work/qs6/data-bin
    --path work/qs6/checkpoints/checkpoint_best.pt --parts 2 7 [--int8]
"""

import argparse
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def differs(whole, split):
    """(tokens differ, scores differ, largest score difference) of two n-best lists."""
    tokens = any(not torch.equal(a["tokens"], b["tokens"]) for a, b in zip(whole, split))
    gaps = [abs(float(a["score"]) - float(b["score"])) for a, b in zip(whole, split)]
    return tokens, max(gaps) > 0, max(gaps)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--subset", default="test")
    p.add_argument("--source-lang", default="en")
    p.add_argument("--target-lang", default="de")
    p.add_argument("--parts", type=int, nargs="+", default=[2, 7], help="the splits of each batch to try")
    p.add_argument("--max-tokens", type=int, default=12000, help="fairseq-generate's default batching")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--int8", action="store_true", help="int8 Linear layers (--int8-decoding)")
    args = p.parse_args()

    import fairseq_hardattn
    from fairseq_hardattn.decoding import workers
    from fairseq_hardattn.decoding.workers import rows_of

    torch.set_num_threads(1)
    workers.CHUNK_SENTENCES = sys.maxsize  # whole batches: the search's own chunks off
    hub = fairseq_hardattn.from_pretrained(
        os.path.dirname(os.path.abspath(args.path)), os.path.basename(args.path), data_name_or_path=args.data,
        source_lang=args.source_lang, target_lang=args.target_lang,
        decoding_workers=1, int8_decoding=args.int8)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    task, models = hub.task, list(hub.models)
    task.load_dataset(args.subset)
    generator = task.build_generator(models, argparse.Namespace(beam=args.beam, nbest=args.beam))
    batches = task.get_batch_iterator(dataset=task.dataset(args.subset), max_tokens=args.max_tokens,
                                      max_positions=hub.max_positions).next_epoch_itr(shuffle=False)
    counts = {parts: [0, 0, 0, 0.0] for parts in args.parts}  # sentences, tokens, scores, largest gap
    for sample in batches:
        whole = generator.generate(models, sample)
        for parts in args.parts:
            split = [hypotheses for part in torch.arange(len(whole)).tensor_split(parts)
                     for hypotheses in generator.generate(models, rows_of(sample, part))]
            for a, b in zip(whole, split):
                tokens, scores, gap = differs(a, b)
                count = counts[parts]
                count[0] += 1
                count[1] += tokens
                count[2] += scores
                count[3] = max(count[3], gap)
    precision = "int8" if args.int8 else "fp32"
    for parts, (sentences, tokens, scores, gap) in counts.items():
        print(f"{precision}, each batch in {parts} parts: of {sentences} sentences, {tokens} with other "
              f"n-best tokens, {scores} with other scores (largest difference {gap:.3g})", flush=True)


if __name__ == "__main__":
    main()
