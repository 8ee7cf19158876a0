"""Deterministic synthetic translation tasks, for the demo and the tests.

- ``copy``: the target is the source (the sanity check of Amato et al.: a
  correct implementation learns it to ~100% exact match).
- ``reorder``: a toy translation in which attention matters. Source words
  ``s0..s{V-1}`` translate word by word into target words ``t0..t{V-1}``
  through a fixed permutation, and the target reverses the order of each
  phrase (a phrase ends at one of the marker words ``s0``, ``s1``, ``s2``), so every
  target word is found at a different source position than the copy task
  would suggest.

Usage: ``python -m hardattn_tools.synthetic reorder OUT_DIR`` writes
``{train,valid,test}.{src,tgt}`` for ``fairseq-preprocess``.
"""

import argparse
import os
import random
from typing import List, Tuple

TASKS = ("copy", "reorder")
SPLITS = {"train": 0, "valid": 1, "test": 2}
PHRASE_MARKERS = 3  # source words s0..s2 end a phrase


def _reorder_target(words: List[int], permutation: List[int]) -> List[int]:
    """Translate word by word, then reverse each phrase (phrases end at a marker)."""
    out, phrase = [], []
    for w in words:
        phrase.append(permutation[w])
        if w < PHRASE_MARKERS:
            out.extend(reversed(phrase))
            phrase = []
    out.extend(reversed(phrase))
    return out


def make_pairs(
    task: str,
    count: int,
    seed: int,
    vocab: int = 24,
    min_len: int = 4,
    max_len: int = 16,
) -> List[Tuple[str, str]]:
    """``count`` (source, target) sentence pairs of the given task, deterministically."""
    if task not in TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; choose one of {TASKS}")
    if not 2 <= min_len <= max_len:
        raise ValueError(f"need 2 <= min_len <= max_len, got {min_len}, {max_len}")
    # the permutation is a property of the task, the same for every split
    permutation = list(range(vocab))
    random.Random(1234).shuffle(permutation)
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.randrange(vocab) for _ in range(rng.randint(min_len, max_len))]
        if task == "copy":
            src = tgt = " ".join(f"w{w}" for w in words)
        else:
            src = " ".join(f"s{w}" for w in words)
            tgt = " ".join(f"t{w}" for w in _reorder_target(words, permutation))
        pairs.append((src, tgt))
    return pairs


def write_task(
    task: str,
    out_dir: str,
    sizes=(8000, 300, 300),
    seed: int = 1,
    **kwargs,
) -> str:
    """Write train/valid/test ``.src``/``.tgt`` files; returns ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    for (split, offset), count in zip(SPLITS.items(), sizes):
        pairs = make_pairs(task, count, seed=seed * 1000 + offset, **kwargs)
        for side, column in (("src", 0), ("tgt", 1)):
            with open(os.path.join(out_dir, f"{split}.{side}"), "w") as f:
                f.writelines(pair[column] + "\n" for pair in pairs)
    return out_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("out_dir")
    parser.add_argument("--sizes", type=int, nargs=3, default=(8000, 300, 300),
                        metavar=("TRAIN", "VALID", "TEST"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=24)
    parser.add_argument("--min-len", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        write_task(args.task, args.out_dir, tuple(args.sizes), args.seed,
                   vocab=args.vocab, min_len=args.min_len, max_len=args.max_len)
    except ValueError as err:
        parser.error(str(err))
    print(f"wrote {args.task} task to {args.out_dir}")


if __name__ == "__main__":
    main()
