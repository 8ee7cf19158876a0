"""Timing several models side by side in one process: each repetition runs
every model once, in a rotated order, after a warm-up pass, so that a change
of machine load hits all models alike (``interleaved``); decoding with
fairseq's own ``SequenceGenerator``, training as forward + backward."""

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.nn.functional as F

from .fixtures import GENERATE_MAX_LEN, make_generator, prepare_for_decoding
from .profiling import timed_sublayers

median = statistics.median


def accumulating(function, seconds, part, calls=None):
    """``function``, each call's wall time added to ``seconds[part]`` (and one
    to ``calls[part]``): where a run's time goes, by part."""

    @functools.wraps(function)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[part] += time.perf_counter() - start
            if calls is not None:
                calls[part] += 1

    return timed


@dataclass
class Timing:
    seconds: List[float]
    sentences: int
    tokens: int

    def rate(self, amount, how):
        return amount / how(self.seconds)

    def summary(self, unit_count, prefix):
        return {
            f"{prefix}_median": round(self.rate(unit_count, statistics.median), 2),
            f"{prefix}_min": round(self.rate(unit_count, max), 2),
            f"{prefix}_max": round(self.rate(unit_count, min), 2),
        }


@torch.no_grad()
def decode(generator, batches):
    """As fairseq-generate: batches from a ``CountingIterator`` that reads
    ahead, as the task of a plugin model's gives (the plugin's search decodes
    the next ones in worker processes meanwhile, where its
    ``--decoding-workers`` asks for them)."""
    from fairseq_hardattn.decoding.read_ahead import LookaheadCountingIterator

    tokens = 0
    for sample in LookaheadCountingIterator(batches):
        hyps = generator.generate(None, sample)
        tokens += sum(len(h[0]["tokens"]) for h in hyps)
    return tokens


@torch.no_grad()
def translate(generator, batches, dictionary, bpe_symbol="subword_nmt"):
    """Best hypothesis of every sentence, BPE removed, in data-set order."""
    by_id = {}
    for sample in batches:
        for sentence_id, hyps in zip(sample["id"].tolist(), generator.generate(None, sample)):
            by_id[sentence_id] = dictionary.string(hyps[0]["tokens"].tolist(), bpe_symbol)
    return [by_id[i] for i in sorted(by_id)]


def train_pass(model, batches):
    """Forward + backward of a training step (no optimizer: identical for all)."""
    tokens = 0
    for sample in batches:
        logits, _ = model(**sample["net_input"])
        target = sample["target"]
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1),
                               ignore_index=model.decoder.padding_idx, reduction="sum")
        loss.backward()
        model.zero_grad(set_to_none=True)
        tokens += int(target.ne(model.decoder.padding_idx).sum())
    return tokens


def synchronize():
    """Wait for the GPU (when there is one): a timing ends when its work does."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(run_fns: Dict[str, callable], reps: int, warmup: int, progress=None):
    """name -> list of seconds; each repetition runs every function once, rotated."""
    names = list(run_fns)
    for _ in range(warmup):
        for name in names:
            run_fns[name]()
    seconds = {name: [] for name in names}
    results = {}
    for rep in range(reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            synchronize()
            start = time.perf_counter()
            results[name] = run_fns[name]()
            synchronize()
            seconds[name].append(time.perf_counter() - start)
        if progress:
            progress(f"repetition {rep + 1}/{reps}: " + ", ".join(
                f"{n} {seconds[n][-1]:.2f}s" for n in names))
    return seconds, results


def benchmark_decoding(models, dictionary, batches, beam, reps, warmup,
                       fixed_output_len=None, progress=None, max_len=GENERATE_MAX_LEN, dtype="fp32",
                       peers=None):
    """``max_len``: fairseq-generate's (--max-len-a, --max-len-b); ``peers``:
    name -> a function decoding ``batches`` with another engine and returning
    its token count (CTranslate2: tools/ctranslate2_peer.py), timed in turn."""
    generators = {
        name: make_generator(prepare_for_decoding(model, beam, dtype), dictionary, beam,
                             fixed_output_len, max_len)
        for name, model in models.items()
    }
    runs = {name: (lambda g=g: decode(g, batches)) for name, g in generators.items()}
    runs.update(peers or {})
    sentences = sum(b["nsentences"] for b in batches)
    seconds, tokens = interleaved(runs, reps, warmup, progress)
    return {name: Timing(seconds[name], sentences, tokens[name]) for name in runs}


def profile_sublayers(models, dictionary, batches, beam, fixed_output_len=None,
                      max_len=GENERATE_MAX_LEN):
    """One extra decoding pass per model with hooks on its attention sublayers
    (kept out of the timed repetitions): name -> {sublayer: share of the pass}."""
    shares = {}
    for name, model in models.items():
        generator = make_generator(model, dictionary, beam, fixed_output_len, max_len)
        with timed_sublayers(model) as timer:
            start = time.perf_counter()
            decode(generator, batches)
            total = time.perf_counter() - start
        shares[name] = {kind: seconds / total for kind, seconds in sorted(timer.seconds.items())}
    return shares


def benchmark_training(models, batches, reps, warmup, progress=None):
    runs = {}
    for name, model in models.items():
        model.train()
        runs[name] = lambda m=model: train_pass(m, batches)
    seconds, tokens = interleaved(runs, reps, warmup, progress)
    return {name: Timing(seconds[name], 0, tokens[name]) for name in models}
