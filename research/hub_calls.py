#!/usr/bin/env python
"""The hub translating a text in calls of a few sentences each, as a script
or a server does: the seconds all the calls take, after one call to warm up.

Each call builds its own generator, so a call whose batches go to worker
processes starts them anew; compare ``--decoding-workers 1`` (one process,
its steps over all its threads) with 2 at several ``--lines-a-call``. Run
each setting in its own process, alternating them.

Example (the trained de->en model of results/corpus.md):
  research/hub_calls.py --checkpoint-dir work/deen/checkpoints --data work/deen/data-bin
      --bpe-codes work/deen/bpe/codes --text test_2016_flickr.de --lines 320
      --lines-a-call 32 --batch-size 16 --decoding-workers 2
"""

import argparse
import logging
import os
import time

import fairseq_hardattn


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--checkpoint-file", default="checkpoint_best.pt")
    parser.add_argument("--data", required=True, help="the model's data-bin")
    parser.add_argument("--bpe-codes", required=True, help="subword-nmt codes")
    parser.add_argument("--source-lang", default="de")
    parser.add_argument("--target-lang", default="en")
    parser.add_argument("--text", required=True, help="source-language lines, one sentence each")
    parser.add_argument("--lines", type=int, default=320)
    parser.add_argument("--lines-a-call", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--decoding-workers", type=int, default=2)
    args = parser.parse_args()
    if not os.path.isfile(args.text):
        parser.error(f"--text {args.text}: no such file")
    logging.disable(logging.INFO)
    hub = fairseq_hardattn.from_pretrained(
        args.checkpoint_dir, checkpoint_file=args.checkpoint_file, data_name_or_path=args.data,
        source_lang=args.source_lang, target_lang=args.target_lang, tokenizer="moses",
        bpe="subword_nmt", bpe_codes=args.bpe_codes, decoding_workers=args.decoding_workers,
        batch_size=args.batch_size)
    with open(args.text, encoding="utf-8") as text:
        lines = text.read().splitlines()[:args.lines]
    hub.translate(lines[:args.lines_a_call], beam=args.beam)  # loads what the first call loads
    start = time.perf_counter()
    for first in range(0, len(lines), args.lines_a_call):
        hub.translate(lines[first:first + args.lines_a_call], beam=args.beam)
    print(f"decoding_workers {args.decoding_workers}, {args.lines_a_call} lines a call: "
          f"{time.perf_counter() - start:.2f} s for {len(lines)} lines")


if __name__ == "__main__":
    main()
