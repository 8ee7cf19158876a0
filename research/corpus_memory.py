#!/usr/bin/env python
"""The corpus command's memory over a long run: the proportional set size
of its process and workers, sampled every few seconds, against the lines
committed so far (its parts); prints, per count of lines done, the largest
and smallest sample (the largest as the command's own process plus its
workers), and the growth of the largest, and of each of its two parts,
after the first ``--after`` lines.

Example: research/corpus_memory.py --after 10000 -- work/deen/data-bin
    --path work/deen/checkpoints/checkpoint_best.pt --source-lang de --target-lang en
    --tokenizer moses --bpe subword_nmt_vocab --bpe-codes work/deen/bpe/codes
    --bpe-vocabulary work/deen/bpe/vocab.de --beam 4 --buffer-size 2000 --input corpus.de
(the arguments after ``--`` are the corpus command's, without --output)
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--after", type=int, default=10000, help="lines done before the growth is counted")
    p.add_argument("--seconds", type=float, default=3.0, help="between samples")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the corpus command's arguments")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if "--buffer-size" not in args.command:
        p.error("give the corpus command's --buffer-size (lines done are counted in buffers)")
    return args


def main(argv=None):
    from hardattn_tools.process_memory import process_tree, pss_mb
    from hardattn_tools.scratch import scratch_folder

    args = parse_args(argv)
    buffer_lines = int(args.command[args.command.index("--buffer-size") + 1])
    folder = scratch_folder("corpus-memory-")
    output, log = folder / "out.txt", folder / "stderr.txt"
    parts = output.with_name(output.name + ".parts")
    with open(log, "w") as stderr:  # (a pipe left unread would stop the command once full)
        process = subprocess.Popen([sys.executable, "-m", "fairseq_hardattn", "translate", *args.command,
                                    "--output", str(output), "--no-progress-bar"],
                                   stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        samples = {}  # lines done -> [(the tree's MB, the command's own process's MB)]
        while process.poll() is None:
            done = len(list(parts.glob("chunk-*"))) * buffer_lines if parts.exists() else 0
            own, *workers = (pss_mb(pid) for pid in process_tree(process.pid))  # (one reading each)
            mb = own + sum(workers)
            if mb:
                samples.setdefault(done, []).append((mb, own))
            time.sleep(args.seconds)
    if process.returncode != 0:
        raise SystemExit(f"corpus_memory: the command failed:\n{log.read_text()[-2000:]}")
    print("lines done: largest / smallest MB; of the largest, the command's own process + its workers")
    largest = {done: max(found) for done, found in samples.items()}
    for done in sorted(samples):
        mb, own = largest[done]
        print(f"{done}: {mb:.0f} / {min(found[0] for found in samples[done]):.0f}; {own:.0f} + {mb - own:.0f}")
    at = [largest[done] for done in sorted(largest) if done >= args.after]
    if at:
        for name, of in (("the largest", lambda x: x[0]), ("its command's own process", lambda x: x[1]),
                         ("its workers", lambda x: x[0] - x[1])):
            growth = 100 * (max(of(x) for x in at) / max(of(at[0]), 1e-9) - 1)
            print(f"growth of {name} after the first {args.after:,} lines: {growth:+.1f}%")


if __name__ == "__main__":
    main()
