"""``python -m fairseq_hardattn shortlist DATA_BIN -o FILE``: the table of a
vocabulary shortlist (``decoding/shortlist.py``) from a binarized training
set: for each source token, its K best translations under IBM Model 1 (a
few EM iterations over the training pairs, a NULL source token included;
ranked by p(t|s) + p(s|t) from its expected counts), and the N most
frequent target tokens for every sentence. The
file is CTranslate2's vocabulary map, so CTranslate2 (``use_vmap``) reads
the same candidates.

Why Model 1 and not co-occurrence counts: a frequent target token ("the",
".") co-occurs with every source token, so counts (and p(t|s) estimated from
them) rank it first for every source token and crowd out the token's
translations; Model 1's expectation step gives each target token to the
source tokens that explain it best, and the frequent ones come in through the
separate list of frequent tokens (which each source token's K leave out:
they would take its places). Each source token's list starts with the
token itself where the target vocabulary has it (a joint BPE vocabulary
copies names, numbers and the pieces of rare words), which Model 1 ranks
low. Marian's lexical shortlists are made the
same way (fast_align's p(t|s), the best K per source word and the most
frequent words).
"""

import argparse
import os
import sys
import time

import numpy as np

from .errors import ConfigError


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_hardattn shortlist",
                                description=__doc__.split("\n\n")[0].replace("``", "'"))
    p.add_argument("data", metavar="DATA_BIN", help="fairseq-preprocess's output folder")
    p.add_argument("-o", "--output", required=True, help="the table (CTranslate2's vocabulary map format)")
    p.add_argument("-s", "--source-lang", help="default: from the data's file names")
    p.add_argument("-t", "--target-lang", help="default: from the data's file names")
    p.add_argument("--subset", default="train")
    p.add_argument("--k", type=int, default=100, help="candidates kept per source token (decoding may use "
                                                      "fewer: shortlist_k)")
    p.add_argument("--frequent", type=int, default=100, help="the most frequent target tokens, candidates "
                                                             "for every sentence")
    p.add_argument("--iterations", type=int, default=5, help="EM iterations of IBM Model 1")
    args = p.parse_args(argv)
    if args.k < 1 or args.frequent < 0 or args.iterations < 1:
        raise ConfigError("--k and --iterations must be at least 1, --frequent at least 0")
    return args


def languages(data: str, subset: str):
    """(source, target) from ``SUBSET.SRC-TGT.SRC.idx`` in ``data``."""
    for name in sorted(os.listdir(data)):
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == subset and parts[3] == "idx" and "-" in parts[1]:
            source, target = parts[1].split("-")
            if parts[2] == source:
                return source, target
    raise ConfigError(f"{data} holds no binarized {subset} set ({subset}.SRC-TGT.SRC.idx): "
                      f"fairseq-preprocess's output is expected")


def load_pairs(data, subset, source, target):
    from fairseq.data import Dictionary, data_utils

    dictionaries, sides = [], []
    for lang in (source, target):
        path = os.path.join(data, f"dict.{lang}.txt")
        if not os.path.exists(path):
            raise ConfigError(f"{path}: no such dictionary")
        dictionary = Dictionary.load(path)
        dataset = data_utils.load_indexed_dataset(os.path.join(data, f"{subset}.{source}-{target}.{lang}"),
                                                  dictionary)
        if dataset is None:
            raise ConfigError(f"{data}: no {subset} set for {source}-{target}")
        dictionaries.append(dictionary)
        sides.append([dataset[i].numpy() for i in range(len(dataset))])
    return dictionaries, sides


def model1(sources, targets, source_size: int, target_size: int, iterations: int):
    """IBM Model 1 over the token pairs that meet in a sentence pair:
    (source ids, target ids, p(t|s) + p(s|t) from the last iteration's
    expected counts); source id ``source_size`` is NULL. The sentences'
    final EOS is left out."""
    null = source_size
    pair_keys, pair_positions, position = [], [], 0
    for src, tgt in zip(sources, targets):
        src = np.append(src[:-1], null)  # (EOS out, NULL in)
        tgt = tgt[:-1]
        if len(tgt) == 0:
            continue
        keys = (src[:, None].astype(np.int64) * target_size + tgt[None, :]).ravel()
        pair_keys.append(keys)
        pair_positions.append(np.tile(np.arange(position, position + len(tgt)), len(src)))
        position += len(tgt)
    keys = np.concatenate(pair_keys)
    positions = np.concatenate(pair_positions)
    unique, pair = np.unique(keys, return_inverse=True)
    source_of = unique // target_size
    probabilities = np.ones(len(unique))
    for _ in range(iterations):
        p = probabilities[pair]
        share = p / np.bincount(positions, weights=p, minlength=position)[positions]
        counts = np.bincount(pair, weights=share, minlength=len(unique))
        probabilities = counts / np.bincount(source_of, weights=counts, minlength=null + 1)[source_of]
    target_of = unique % target_size
    # p(s|t) from the same expected counts: a rare target token (a piece of a rare word) is a
    # small share of its source token's translations but most of its own alignments
    inverse = counts / np.bincount(target_of, weights=counts, minlength=target_size)[target_of]
    return source_of, target_of, probabilities + inverse


def special_ids(dictionary):
    """The ids a table neither keys nor lists: BOS, padding, EOS and unk."""
    return {dictionary.bos(), dictionary.pad(), dictionary.eos(), dictionary.unk()}


def table(source_of, target_of, probabilities, k: int):
    """{source id: its k most probable target ids, best first}."""
    if len(source_of) == 0:  # every target token is among the frequent ones
        return {}
    order = np.lexsort((-probabilities, source_of))
    source_of, target_of = source_of[order], target_of[order]
    starts = np.flatnonzero(np.r_[True, source_of[1:] != source_of[:-1]])
    ends = np.r_[starts[1:], len(source_of)]
    return {int(source_of[a]): target_of[a:min(b, a + k)].tolist() for a, b in zip(starts, ends)}


def main(argv=None):
    args = parse_args(argv)
    began = time.monotonic()
    source, target = (args.source_lang, args.target_lang) if args.source_lang and args.target_lang \
        else languages(args.data, args.subset)
    (source_dict, target_dict), (sources, targets) = load_pairs(args.data, args.subset, source, target)
    print(f"fairseq-hardattn: shortlist: {len(sources):,} sentence pairs {source}-{target}; "
          f"{args.iterations} iterations of IBM Model 1", file=sys.stderr, flush=True)
    source_of, target_of, probabilities = model1(sources, targets, len(source_dict), len(target_dict),
                                                 args.iterations)
    special = special_ids(target_dict)
    counts = np.bincount(np.concatenate([t[:-1] for t in targets]), minlength=len(target_dict))
    counts[list(special)] = 0
    frequent = [int(i) for i in np.argsort(-counts, kind="stable")[:args.frequent] if counts[i] > 0]
    # each source token's k best beyond the tokens every sentence has (those would take its places)
    keep = ~np.isin(target_of, list(special | set(frequent))) & (source_of < len(source_dict))
    best = table(source_of[keep], target_of[keep], probabilities[keep], args.k)
    seen = np.bincount(np.concatenate([s[:-1] for s in sources]), minlength=len(source_dict)) > 0
    seen[list(special_ids(source_dict))] = False
    rows = 0
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("\t" + " ".join(target_dict[i] for i in frequent) + "\n")
        for source_id in np.flatnonzero(seen).tolist():  # the source tokens of the data
            # the token itself first where the target side has it: names, numbers and the
            # pieces of rare words are often copied, and Model 1 ranks them low (or not at
            # all, where every target token beside them is a frequent one)
            token = source_dict[source_id]
            itself = target_dict.index(token)
            row = [target_dict[i] for i in best.get(source_id, ()) if i != itself]
            if itself != target_dict.unk() and itself not in frequent:
                row = [token] + row[:args.k - 1]
            if row:
                f.write(f"{token}\t{' '.join(row)}\n")
                rows += 1
    print(f"fairseq-hardattn: wrote {args.output}: {rows:,} source tokens, up to {args.k} candidates "
          f"each, {len(frequent)} for every sentence ({time.monotonic() - began:.1f} s)",
          file=sys.stderr, flush=True)
