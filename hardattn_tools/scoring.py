"""BLEU of ``fairseq-generate`` output, two ways.

- tokenized, lowercased BLEU against tokenized references (what published
  Multi30k/WMT numbers use; the same as multi-bleu.perl), and
- sacreBLEU on detokenized output against the raw references, with its
  signature so others can reproduce it.

Usage: python -m hardattn_tools.scoring GENERATE_OUTPUT --tok-ref REF.tok
           [--raw-ref REF.raw --detok-lang de] [--json]
"""

import argparse
import json
import re
import sys
from typing import Dict, List, Optional, Tuple

import numpy as np
import sacrebleu

# fairseq-generate's lines: S-id<TAB>source; H-/D-id<TAB>score<TAB>hypothesis
_LINES = {
    "S": re.compile(r"^S-(\d+)\t(.*)$", flags=re.M),
    "H": re.compile(r"^H-(\d+)\t[^\t]*\t(.*)$", flags=re.M),
    "D": re.compile(r"^D-(\d+)\t[^\t]*\t(.*)$", flags=re.M),
}


def read_generate_lines(generate_output: str, kind: str) -> List[str]:
    """The ``kind`` lines (``S`` sources, ``H`` hypotheses, ``D`` detokenized
    hypotheses) of ``fairseq-generate`` output, in data-set order (the first of
    each id: the best hypothesis under ``--nbest``)."""
    by_id: Dict[int, str] = {}
    for i, text in _LINES[kind].findall(generate_output):
        by_id.setdefault(int(i), text)
    if not by_id:
        raise ValueError(f"no {kind}- lines found in the fairseq-generate output")
    missing = sorted(set(range(max(by_id) + 1)) - set(by_id))
    if missing:
        raise ValueError(f"fairseq-generate output lacks sentences {missing[:10]}")
    return [by_id[i] for i in range(len(by_id))]


def read_hypotheses(generate_output: str, detokenized: bool = False) -> List[str]:
    """Hypotheses of ``fairseq-generate`` output in test-set order.

    ``H-`` lines hold the output with BPE removed when ``--remove-bpe`` is
    given; ``D-`` lines the detokenized output when ``--tokenizer`` is.
    """
    return read_generate_lines(generate_output, "D" if detokenized else "H")


def _read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _check_lengths(hyps: List[str], refs: List[str], ref_path: str):
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references in {ref_path}")


def tokenized_bleu(hyps: List[str], tok_ref_path: str) -> float:
    """Tokenized, lowercased BLEU (the published-numbers convention)."""
    refs = _read_lines(tok_ref_path)
    _check_lengths(hyps, refs, tok_ref_path)
    # force: the output is tokenized on purpose here (sacreBLEU would warn)
    metric = sacrebleu.metrics.BLEU(tokenize="none", lowercase=True, force=True)
    return metric.corpus_score(hyps, [refs]).score


def paired_bootstrap(baseline: List[str], system: List[str], tok_ref_path: str, samples: int = 1000,
                     seed: int = 12345) -> Tuple[float, float]:
    """The 95% interval of ``system``'s tokenized BLEU minus ``baseline``'s,
    from ``samples`` resamplings of the sentences, the same ones for both
    (paired bootstrap, Koehn 2004): how far a difference between two decodes
    of one test set is from what the set can tell apart."""
    refs = _read_lines(tok_ref_path)
    _check_lengths(baseline, refs, tok_ref_path)
    _check_lengths(system, refs, tok_ref_path)
    metric = sacrebleu.metrics.BLEU(tokenize="none", lowercase=True, force=True)
    # per-sentence n-gram counts (sacreBLEU's own significance tests use these)
    counts = [np.array(metric._extract_corpus_statistics(hyps, [refs]), dtype=np.int64)
              for hyps in (baseline, system)]
    picks = np.random.default_rng(seed).integers(0, len(refs), size=(samples, len(refs)))
    differences = np.array([metric._compute_score_from_stats(list(counts[1][pick].sum(0))).score
                            - metric._compute_score_from_stats(list(counts[0][pick].sum(0))).score
                            for pick in picks])
    low, high = np.percentile(differences, [2.5, 97.5])
    return float(low), float(high)


def detokenize(lines: List[str], lang: str) -> List[str]:
    """Moses detokenization (undoes the ``&apos;``-style escaping too)."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def sacre_bleu(hyps: List[str], raw_ref_path: str, detok_lang: Optional[str]):
    """sacreBLEU (13a tokenization, lowercased: our models are trained lowercased)."""
    refs = _read_lines(raw_ref_path)
    _check_lengths(hyps, refs, raw_ref_path)
    if detok_lang:
        hyps = detokenize(hyps, detok_lang)
    metric = sacrebleu.metrics.BLEU(lowercase=True)
    score = metric.corpus_score(hyps, [refs])
    return score.score, str(metric.get_signature())


def score_generate_output(generate_output, tok_ref=None, raw_ref=None, detok_lang=None):
    hyps = read_hypotheses(generate_output)
    result = {"sentences": len(hyps)}
    if tok_ref:
        result["bleu_tok_lc"] = round(tokenized_bleu(hyps, tok_ref), 2)
    if raw_ref:
        score, signature = sacre_bleu(hyps, raw_ref, detok_lang)
        result["sacrebleu"] = round(score, 2)
        result["sacrebleu_signature"] = signature
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output", help="fairseq-generate stdout (run with --remove-bpe)")
    parser.add_argument("--tok-ref", help="tokenized references, for tokenized lowercased BLEU")
    parser.add_argument("--raw-ref", help="raw references, for sacreBLEU")
    parser.add_argument("--detok-lang", help="Moses-detokenize hypotheses for sacreBLEU (e.g. de)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not (args.tok_ref or args.raw_ref):
        parser.error("give --tok-ref and/or --raw-ref")
    try:
        with open(args.generate_output, encoding="utf-8") as f:
            result = score_generate_output(f.read(), args.tok_ref, args.raw_ref, args.detok_lang)
    except (OSError, ValueError) as err:
        parser.error(str(err))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    sys.exit(main())
