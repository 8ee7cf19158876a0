#!/usr/bin/env python
"""What giving the heap's free pages back costs the search
(decoding/heap.py): a set decoded on one thread in rounds, alternately with
a give-back after every batch and with none, the same batches; prints each
round's seconds and the cost of one give-back (the difference over the
give-backs made), which includes the pages the next steps fault in again.

The model, sentences and options are research/real_data_peer.py's.

Example (the trained de->en model of results/corpus.md):
  research/heap_give_back_cost.py --data work/deen/data-bin --path work/deen/checkpoints/checkpoint_best.pt
      --subset valid --batch-size 128 --beam 4 --rounds 6
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "research"))


def main(argv=None):
    import real_data_peer

    from fairseq_hardattn.decoding import heap

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    real_data_peer.add_decoding_args(p)
    p.add_argument("--rounds", type=int, default=6, help="rounds of each kind, alternated")
    args = p.parse_args(argv)
    task, models, generator, batches = real_data_peer.load(args)
    generator.generate(models, batches[0])  # (first use: kernels loaded, buffers made)
    if not heap.keeps_large_blocks():
        raise SystemExit("heap_give_back_cost: this decoding keeps no large blocks in the heap "
                         "(no oneDNN packed or int8 Linear): nothing is given back")
    given_back = [0]
    give_back = heap.give_back_free_memory

    def counted(now=None):  # (the search's own call, at the end of each batch)
        done = give_back(now)
        given_back[0] += done
        return done

    heap.give_back_free_memory = counted
    seconds = {"none": [], "after every batch": []}
    for _ in range(args.rounds):
        for mode in seconds:
            heap.GIVE_BACK_EVERY_SECONDS = float("inf") if mode == "none" else 0.0
            start = time.perf_counter()
            for batch in batches:
                generator.generate(models, batch)
            seconds[mode].append(time.perf_counter() - start)
    for mode, values in seconds.items():
        print(f"{mode}: " + " ".join(f"{v:.3f}" for v in values) + f" s; sum {sum(values):.2f} s")
    extra = sum(seconds["after every batch"]) - sum(seconds["none"])
    print(f"{given_back[0]} give-backs, {len(batches)} a round: {1000 * extra / max(given_back[0], 1):.1f} ms "
          f"each; {100 * extra / sum(seconds['none']):+.1f}% on the search")


if __name__ == "__main__":
    main()
