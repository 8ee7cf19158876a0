#!/usr/bin/env python
"""Resident memory over a long run: N sentences through fairseq-interactive
(lines fed as a user's pipe would, --buffer-size lines at a time, the
engine's default workers) and through the hub (``translate`` of lists, one
process), sampling the memory of the whole process tree (proportional set
size, summed: shared pages counted once) as sentences come out. Prints the
memory after the first 1,000 sentences and at the end, and the growth
between them. results/decoding_engine.md cites it.

Example: research/long_run_memory.py --data work/qs6/data-bin
    --path work/qs6/checkpoints/checkpoint_best.pt --sentences 20000
"""

import argparse
import ctypes
import logging
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hardattn_tools.process_memory import tree_pss_mb  # noqa: E402


# random sentences make a model loop to its length limit: this one keeps runs short
MAX_LEN_B = 50


def sampled(count):
    """When the memory is read: after 1,000 sentences, every 2,500, and 100
    before the end (at the very end the workers may be leaving)."""
    return {1000, count - 100} | set(range(2500, count - 100, 2500))


def sentences(dictionary_path, count, seed=1):
    words = [line.split()[0] for line in open(dictionary_path, encoding="utf-8")]
    words = [w for w in words if not w.startswith("madeupword")]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) for _ in range(count)]


def interactive(args, lines):
    command = [os.path.join(os.path.dirname(sys.executable), "fairseq-interactive"), args.data,
               "--user-dir", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                          "fairseq_hardattn"),
               "--path", args.path, "--beam", "4", "--buffer-size", "256", "--batch-size", "64",
               "--max-len-b", str(MAX_LEN_B),
               "--source-lang", args.source_lang, "--target-lang", args.target_lang]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1)
    feeder = threading.Thread(target=lambda: (proc.stdin.write("\n".join(lines) + "\n"), proc.stdin.close()))
    feeder.start()
    samples, done = {}, 0
    for line in proc.stdout:
        if line.startswith("H-"):
            done += 1
            if done in sampled(len(lines)):
                samples[done] = tree_pss_mb(proc.pid)
    feeder.join()
    proc.wait()
    return samples, {}


def live_mb():
    """The process's memory once glibc has handed its free pages back
    (malloc_trim): what the objects alive hold, without the allocator's
    retained free blocks; None where the C library is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return tree_pss_mb(os.getpid())


def hub(args, lines):
    import fairseq_hardattn

    model = fairseq_hardattn.from_pretrained(os.path.dirname(args.path), os.path.basename(args.path),
                                             data_name_or_path=args.data,
                                             source_lang=args.source_lang, target_lang=args.target_lang)
    logging.getLogger("fairseq").setLevel(logging.WARNING)  # not a line per translate call
    samples, live, done = {}, {}, 0
    for start in range(0, len(lines), 100):
        model.translate(lines[start:start + 100], beam=4, max_len_b=MAX_LEN_B)
        done = start + len(lines[start:start + 100])
        if done in sampled(len(lines)):
            samples[done] = tree_pss_mb(os.getpid())
            if done in (1000, len(lines) - 100):
                live[done] = live_mb()
    return samples, live


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--sentences", type=int, default=20000)
    p.add_argument("--source-lang", default="en")
    p.add_argument("--target-lang", default="de")
    p.add_argument("--only", choices=("interactive", "hub"))
    args = p.parse_args()
    lines = sentences(os.path.join(args.data, f"dict.{args.source_lang}.txt"), args.sentences)
    for name, run in (("fairseq-interactive", interactive), ("hub", hub)):
        if args.only and not name.endswith(args.only):
            continue
        start = time.time()
        samples, live = run(args, lines)
        print(f"{name}: {len(lines)} sentences in {time.time() - start:.0f} s; memory (PSS, MB) "
              + ", ".join(f"{n}: {mb:.0f}" for n, mb in sorted(samples.items()))
              + growth(samples, len(lines)), flush=True)
        if all(live.values()) and live:
            print(f"{name}: without the allocator's free pages (malloc_trim), "
                  + ", ".join(f"{n}: {mb:.0f}" for n, mb in sorted(live.items())) + growth(live, len(lines)),
                  flush=True)


def growth(samples, count):
    first, last = samples.get(1000), samples.get(count - 100)
    return f"; growth after the first 1,000: {100 * (last / first - 1):+.1f}%" if first and last else ""


if __name__ == "__main__":
    main()
