#!/usr/bin/env python
"""What a vocabulary shortlist can gain on this CPU: the share of a decoding
step's time that goes over the vocabulary (the output projection and the
candidates kernel's pass over the logits), the share of the tokens a batch
keeps, and the bound they set, 1 / (1 - share x (1 - kept)), beside the
speed-up measured. The same random fairseq transformer and batches as
scripts/benchmark_generate_cores.py (beam 4, every hypothesis --len tokens),
one thread, the exact engine and the shortlist alternated in one process, the
median of --rounds kept.

A bound from multiply-adds (the projection is two thirds of a step's at the
small dims) overstates what a CPU gives where the other layers' small
matrices run far from its peak: this script measures the share in time.

Example: research/shortlist_bound.py --dims small --vocab 10000
    --text work/deen/bpe/test_2016_flickr.de --dictionary work/deen/data-bin/dict.de.txt
    --shortlist work/deen/vmap100.txt
"""

import argparse
import importlib.util
import os
import statistics
import sys
import time
import warnings

from hardattn_tools.provenance import write_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", choices=["small", "base"], default="small")
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--text", required=True, help="sources: a BPE'd text file")
    p.add_argument("--dictionary", required=True, help="its dictionary (fairseq's dict.LANG.txt)")
    p.add_argument("--shortlist", required=True, help="a shortlist table (vmap) in --dictionary's tokens")
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--len", type=int, default=30, help="output tokens of every hypothesis")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def benchmark_module():
    path = os.path.join(REPO, "scripts", "benchmark_generate_cores.py")
    spec = importlib.util.spec_from_file_location("benchmark_generate_cores", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class VocabularyTime:
    """Seconds spent over the vocabulary while it is installed: each step's
    logits from the features (the projection, whole or restricted) and the
    candidates kernel."""

    def __init__(self, beam_search, kernels):
        self.seconds = 0.0
        step, features, candidates = (beam_search.StepLogits.__call__, beam_search.StepLogits.features,
                                      kernels.beam_candidates)
        timer = self

        def timed_step(self, prefix, one_per_sentence):
            self._features_seconds = 0.0
            start = time.perf_counter()
            logits = step(self, prefix, one_per_sentence)
            timer.seconds += time.perf_counter() - start - self._features_seconds
            return logits

        def timed_features(self, prefix, encoder_out):
            start = time.perf_counter()
            found = features(self, prefix, encoder_out)
            self._features_seconds += time.perf_counter() - start  # (set to 0 by its step)
            return found

        def timed_candidates(*args, **kwargs):
            start = time.perf_counter()
            found = candidates(*args, **kwargs)
            timer.seconds += time.perf_counter() - start
            return found

        beam_search.StepLogits.__call__ = timed_step
        beam_search.StepLogits.features = timed_features
        kernels.beam_candidates = timed_candidates


def main(argv=None):
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from fairseq import checkpoint_utils

    from fairseq_hardattn import compat, kernels
    from fairseq_hardattn.decoding import PluginBeamSearch, beam_search, native_search
    from hardattn_tools.scratch import scratch_folder

    work = str(scratch_folder("shortlist-bound-"))
    with warnings.catch_warnings():  # (hydra's deprecation notes, as a training parser leaves them)
        warnings.simplefilter("ignore")
        benchmark_module().checkpoint_and_data(argparse.Namespace(**vars(args), shortlist_k=None), work)

    def load(shortlist):
        overrides = {"data": f"{work}/bin", **({"shortlist": shortlist} if shortlist else {})}
        with compat.loading():
            models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([f"{work}/model.pt"],
                                                                              arg_overrides=overrides)
        model = models[0].eval()
        model.prepare_for_inference_(cfg)
        model.decoding_workers = 1
        return model, task

    (exact, task), (short, _) = load(None), load(args.shortlist)
    task.load_dataset("test")
    batches = list(task.get_batch_iterator(task.dataset("test"), max_sentences=args.batch,
                                           disable_iterator_cache=True).next_epoch_itr(shuffle=False))
    vocab = len(task.target_dictionary)
    kept = statistics.mean(len(short.shortlist.candidates(b["net_input"]["src_tokens"])) / vocab
                           for b in batches)
    generators = {name: PluginBeamSearch([model], task.target_dictionary, beam_size=4, min_len=args.len,
                                         max_len_a=0, max_len_b=args.len)
                  for name, model in (("exact", exact), ("shortlist", short))}
    # both systems on the Python search, whose steps this timer reads (the native
    # search decodes the exact model in one call, and takes no shortlist)
    native_search.why_not = lambda *args: "the Python search's steps are timed"
    timer = VocabularyTime(beam_search, kernels)
    runs = {name: [] for name in generators}
    with torch.no_grad():
        for round_ in range(args.rounds + 1):  # the first round warms up
            for name, generator in generators.items():
                timer.seconds = 0.0
                start = time.perf_counter()
                for batch in batches:
                    generator.generate(generator.model.models, batch)
                total = time.perf_counter() - start
                if round_:
                    runs[name].append((total, timer.seconds))
    median = {name: (statistics.median(t for t, _ in r), statistics.median(v for _, v in r))
              for name, r in runs.items()}
    (exact_total, exact_vocab), (short_total, short_vocab) = median["exact"], median["shortlist"]
    share = exact_vocab / exact_total
    figures = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "kept": kept, "vocabulary_share": share,
        "bound": 1 / (1 - share * (1 - kept)),
        "measured": exact_total / short_total,
        "seconds": {name: {"total": t, "vocabulary": v} for name, (t, v) in median.items()},
        "runs": runs,
    }
    print(f"exact: {exact_total:.2f} s, {exact_vocab:.2f} s of it over the vocabulary ({share:.0%})")
    print(f"shortlist: {short_total:.2f} s, {short_vocab:.2f} s over its columns; a batch keeps "
          f"{kept:.0%} of the {vocab} tokens (the exact's vocabulary time x kept: {exact_vocab * kept:.2f} s)")
    print(f"bound 1 / (1 - {share:.2f} x {1 - kept:.2f}) = {figures['bound']:.2f}x; "
          f"measured {figures['measured']:.2f}x")
    if args.json:
        write_json(args.json, figures)


if __name__ == "__main__":
    main()
