#!/usr/bin/env python
"""How far the engine's scores are from fairseq's generator's, and from its
own at another thread count, on a binarized set: each batch decoded by
fairseq's generator (one thread), and by the plugin's search on one thread
and on two; counts the sentences whose n-best tokens differ, those whose
scores differ in any bit, and the largest score and positional-score
differences. The equality contract in docs/decoding_engine.md cites it.

Example: research/score_equality.py --data work/qs6/data-bin
    --path work/qs6/checkpoints/checkpoint_best.pt [--kinds hard]
"""

import argparse
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compared(found, reference):
    """(tokens differ, scores differ in a bit, largest |score difference|,
    largest |positional score difference|) of two n-best lists."""
    tokens = [h["tokens"].tolist() for h in found] != [h["tokens"].tolist() for h in reference]
    if tokens:
        return True, True, 0.0, 0.0
    scores = max(abs(float(a["score"]) - float(b["score"])) for a, b in zip(found, reference))
    positional = max(float((a["positional_scores"].double() - b["positional_scores"].double()).abs().max())
                     for a, b in zip(found, reference))
    return False, scores > 0 or positional > 0, scores, positional


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--subset", default="test")
    p.add_argument("--source-lang", default="en")
    p.add_argument("--target-lang", default="de")
    p.add_argument("--max-tokens", type=int, default=12000, help="fairseq-generate's default batching")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--nbest", type=int, default=1)
    p.add_argument("--kinds", choices=["soft", "hard"], help="decode both decoder attention kinds so")
    args = p.parse_args()

    import fairseq_hardattn

    kinds = {f"dec_{side}_attn_kind": args.kinds for side in ("self", "cross")} if args.kinds else {}
    hub = fairseq_hardattn.from_pretrained(
        os.path.dirname(os.path.abspath(args.path)), os.path.basename(args.path), data_name_or_path=args.data,
        source_lang=args.source_lang, target_lang=args.target_lang,
        decoding_workers=1, **kinds)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    task, models = hub.task, list(hub.models)
    task.load_dataset(args.subset)
    options = argparse.Namespace(beam=args.beam, nbest=args.nbest)
    engine = task.build_generator(models, options)
    for model in models:
        model.decoder.decoding_engine = "fairseq"
    fairseqs = task.build_generator(models, options)
    batches = task.get_batch_iterator(dataset=task.dataset(args.subset), max_tokens=args.max_tokens,
                                      max_positions=hub.max_positions).next_epoch_itr(shuffle=False)
    rows = {"engine, 1 thread vs fairseq's generator": [0, 0, 0, 0.0, 0.0],
            "engine, 2 threads vs 1 thread": [0, 0, 0, 0.0, 0.0]}
    for sample in batches:
        torch.set_num_threads(1)
        for model in models:
            model.decoder.decoding_engine = "fairseq"
        reference = fairseqs.generate(models, sample)
        for model in models:
            model.decoder.decoding_engine = "auto"
        one = engine.generate(models, sample)
        torch.set_num_threads(2)
        two = engine.generate(models, sample)
        for name, pairs in zip(rows, (zip(one, reference), zip(two, one))):
            for found, expected in pairs:
                tokens, bits, score, positional = compared(found, expected)
                row = rows[name]
                row[0] += 1
                row[1] += tokens
                row[2] += bits
                row[3], row[4] = max(row[3], score), max(row[4], positional)
    for name, (sentences, tokens, bits, score, positional) in rows.items():
        print(f"{name}: of {sentences} sentences, {tokens} with other n-best tokens, {bits} with scores "
              f"that differ in any bit; largest difference: score {score:.3g}, positional score "
              f"{positional:.3g}", flush=True)


if __name__ == "__main__":
    main()
