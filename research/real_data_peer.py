#!/usr/bin/env python
"""The plugin's search against CTranslate2 on real sentences, one thread.

Loads a trained checkpoint as fairseq-generate does (its data, ``--path``,
the generation options below), takes the first ``--batches`` batches of
``--batch-size`` sentences of ``--subset`` in fairseq's order (by length),
and decodes them with the plugin's search on one thread in this process,
each sentence to its own length (not to a fixed length, as the
random-weight benchmarks do). Then CTranslate2, one thread, in a process of
its own, its fairseq converter on the same weights, translates the same
source tokens at each of ``--ct2-batch-sizes``. The two never run at once.

Prints both systems' times, the output tokens and, for beam search, how
many translations are the same; where the search's time goes:

- by part: each part's wall time around its calls (the encoder, the
  decoder's step, the output projection, the sublayers, the attention and
  candidates kernels, the draws, the reorders, the finished hypotheses);
- by a step's rows: a batch runs until its last sentence ends, so many
  steps are the tail of a few sentences, where a step's fixed cost, not its
  arithmetic, decides the rate; each step is timed to the next of its batch,
  with what the steps would take were every row as cheap as in full ones.

Examples (the trained de->en model of results/corpus.md):
  research/real_data_peer.py --data work/deen/data-bin --path work/deen/checkpoints/checkpoint_best.pt
      --subset test --batch-size 64
  research/real_data_peer.py --data work/deen/data-bin --path work/deen/checkpoints/checkpoint_best.pt
      --subset train --batch-size 128 --batches 60 --beam 1 --sampling-topk 10 --ct2-batch-sizes 128 32
  research/real_data_peer.py --data work/deen/data-bin --path work/deen/checkpoints/checkpoint_best.pt
      --subset train --batch-size 4 --batches 100 --beam 1 --sampling-topk 10 --profile-ops 12
"""

import argparse
import collections
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hardattn_tools.provenance import write_json
from hardattn_tools.timing import accumulating

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CT2_RUN = r"""
import json, sys, time
import ctranslate2
args = json.loads(sys.argv[1])
translator = ctranslate2.Translator(args["model"], device="cpu", compute_type="float32",
                                    inter_threads=1, intra_threads=1)
sources = json.load(open(args["sources"]))
translator.translate_batch(sources[:args["batches"][0]], **args["options"])  # warm-up
for batch in args["batches"]:
    start = time.perf_counter()
    results = translator.translate_batch(sources, max_batch_size=batch, **args["options"])
    seconds = time.perf_counter() - start
    print(json.dumps(dict(batch=batch, seconds=seconds, hypotheses=[r.hypotheses[0] for r in results])), flush=True)
"""

# the search's parts, timed around their calls: (module, class or None, function, part)
# the step with the output projection and the candidates kernel, a block of rows at a time
BLOCKS = "step, projection, candidates (row blocks)"
PARTS = (
    ("decoding.beam_search", "PluginBeamSearch", "_generate", "whole search"),
    ("decoding.beam_search", "StepLogits", "start", "encoder"),
    ("decoding.beam_search", "StepLogits", "__call__", "decoder step with the output projection"),
    ("decoding.beam_search", "StepLogits", "candidates", BLOCKS),
    ("decoding.beam_search", "StepLogits", "features", "decoder step"),
    ("decoding.direct_step", None, "_self_attention", "self-attention sublayers (4 products, kernel)"),
    ("decoding.direct_step", None, "_cross_attention", "cross-attention sublayers (2 products, kernel)"),
    ("decoding.direct_step", None, "_feed_forward", "feed-forward sublayers"),
    ("kernels", None, "step_attention", "attention kernel calls"),
    ("kernels", None, "beam_candidates", "candidates kernel (normaliser, top k)"),
    ("decoding.sampling", "SentenceDraws", "step", "sampling draws"),
    ("decoding.beam_search", "StepLogits", "next_step", "cache reorders"),
    ("decoding.beam_search", "StepLogits", "reorder_encoder_out", "encoder output reorders"),
    ("decoding.beam_search", "PluginBeamSearch", "_finalize", "finished hypotheses"),
)


def add_decoding_args(p: argparse.ArgumentParser):
    """The checkpoint, the sentences and the search's options (``load``'s)."""
    p.add_argument("--data", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--subset", default="test")
    p.add_argument("--batch-size", type=int, default=64, help="sentences a batch")
    p.add_argument("--batches", type=int, help="only the first batches (default: every batch)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--sampling-topk", type=int, default=0, help="sample among the k best (0: beam search)")
    p.add_argument("--max-len", type=int, default=200)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_decoding_args(p)
    p.add_argument("--ct2-batch-sizes", type=int, nargs="+", help="default: --batch-size")
    p.add_argument("--ct2-hypotheses", type=int, default=1,
                   help="CTranslate2's num_hypotheses; the beam size ends a sentence as fairseq's "
                        "search does, once it has beam-many finished hypotheses")
    p.add_argument("--modules-step", action="store_true",
                   help="every decoder step through the modules' forwards (the direct step off), "
                        "to compare with it")
    p.add_argument("--profile-ops", type=int, default=0, metavar="N",
                   help="decode the batches once more under torch's profiler and print the N operators "
                        "with the most self time, with their calls (e.g. oneDNN's weight packing per call)")
    p.add_argument("--reps", type=int, default=1, help="passes of the plugin's search over the batches: "
                                                       "the fastest one's figures")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    return args


def load(args):
    import torch
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_hardattn import compat

    torch.set_num_threads(1)
    argv = [args.data, "--user-dir", str(REPO / "fairseq_hardattn"), "--path", args.path,
            "--beam", str(args.beam), "--max-len-b", str(args.max_len), "--seed", "1",
            "--model-overrides", "{'decoding_workers': 1}"]
    if args.sampling_topk:
        argv += ["--sampling", "--sampling-topk", str(args.sampling_topk)]
    # as in fairseq-generate: fairseq's transformer read as the plugin's, fairseq's noise quiet
    compat.install_for_command_line()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(), argv))
    utils.import_user_module(cfg.common)
    utils.set_torch_seed(cfg.common.seed)  # (as fairseq-generate: the sentences' generators are seeded from it)
    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble([args.path], task=task,
                                                     arg_overrides=eval(cfg.common_eval.model_overrides))
    for model in models:
        model.prepare_for_inference_(cfg)
    task.load_dataset(args.subset)
    generator = task.build_generator(models, cfg.generation)
    positions = utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in models])
    batches = task.get_batch_iterator(task.dataset(args.subset), max_sentences=args.batch_size,
                                      max_positions=positions).next_epoch_itr(shuffle=False)
    return task, models, generator, [b for i, b in enumerate(batches) if args.batches is None or i < args.batches]


def timed_parts():
    """Wrap the search's parts with timers, and record each step's rows and
    start; returns (seconds by part, calls by part, rows, began_at)."""
    import importlib

    from fairseq_hardattn.decoding import beam_search

    seconds, calls = collections.Counter(), collections.Counter()
    rows, began_at = [], []  # each step's rows, and when it began (None: a batch's first step)

    def counted(step):  # (a step makes its logits, or its candidates a block of rows at a time)
        @functools.wraps(step)
        def wrapper(self, prefix, one_per_sentence, *rest):
            rows.append(prefix.size(0))
            began_at.append(time.perf_counter() if prefix.size(1) > 1 else None)  # (size 1: step 0)
            return step(self, prefix, one_per_sentence, *rest)
        return wrapper

    for name in ("__call__", "candidates"):
        setattr(beam_search.StepLogits, name, counted(getattr(beam_search.StepLogits, name)))

    for module, owner, name, part in PARTS:
        where = importlib.import_module(f"fairseq_hardattn.{module}")
        owner = getattr(where, owner) if owner else where
        setattr(owner, name, accumulating(getattr(owner, name), seconds, part, calls))
    return seconds, calls, rows, began_at


def ctranslate2_sources(dictionary, batches):
    """The batches' source sentences as CTranslate2 reads them: token strings, no pad or EOS."""
    return [[dictionary[t] for t in row.tolist() if t not in (dictionary.pad(), dictionary.eos())]
            for b in batches for row in b["net_input"]["src_tokens"]]


def ctranslate2_options(args) -> dict:
    """``translate_batch``'s options for the search ``add_decoding_args`` gave."""
    options = dict(beam_size=args.beam, max_decoding_length=args.max_len + 1)
    if args.sampling_topk:
        options["sampling_topk"] = args.sampling_topk
    return options


def ctranslate2_run(model, dictionary, batches, args):
    """CTranslate2's runs, one per batch size: its seconds and hypotheses."""
    from hardattn_tools.ctranslate2_peer import convert

    sources = ctranslate2_sources(dictionary, batches)
    options = dict(ctranslate2_options(args), num_hypotheses=args.ct2_hypotheses)
    with tempfile.TemporaryDirectory() as folder:
        source_file = os.path.join(folder, "sources.json")
        Path(source_file).write_text(json.dumps(sources))
        setting = dict(model=convert(model, dictionary, folder), sources=source_file,
                       batches=args.ct2_batch_sizes or [args.batch_size], options=options)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, "-c", CT2_RUN, json.dumps(setting)], env=env,
                             capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main(argv=None):
    args = parse_args(argv)
    task, models, generator, batches = load(args)
    if args.modules_step:
        from fairseq_hardattn.decoding import direct_step

        direct_step.supports = lambda decoder: "--modules-step"
    seconds, calls, rows, began_at = timed_parts()
    d = task.target_dictionary
    generator.generate(models, batches[0])  # (first use: kernels loaded, buffers made)
    best = None
    for _ in range(args.reps):  # the fastest pass, its parts' figures
        seconds.clear(), calls.clear(), rows.clear(), began_at.clear()
        ours = {i: d.string(h[0]["tokens"]) for b in batches
                for i, h in zip(b["id"].tolist(), generator.generate(models, b))}
        if best is None or seconds["whole search"] < best[0]["whole search"]:
            best = (collections.Counter(seconds), collections.Counter(calls), list(rows), list(began_at), ours)
    seconds, calls, rows, began_at, ours = best
    whole = seconds["whole search"]
    # (where the candidates come a block of rows at a time, the candidates kernel runs inside those calls)
    inside = seconds["candidates kernel (normaliser, top k)"] if seconds[BLOCKS] else 0.0
    seconds["output projection"] = (seconds["decoder step with the output projection"] + seconds[BLOCKS]
                                    - seconds["decoder step"] - inside)
    sentences = len(ours)
    tokens = sum(len(t.split()) + 1 for t in ours.values())

    peers = ctranslate2_run(models[0], task.source_dictionary, batches, args)
    for peer in peers:
        peer["tokens"] = sum(len(h) + 1 for h in peer["hypotheses"])
    ids = [i for b in batches for i in b["id"].tolist()]
    print(f"plugin's search, 1 thread: {sentences} sentences, {whole:.2f} s, {sentences / whole:.1f} sentences/s, "
          f"{tokens} output tokens")
    for peer in peers:
        same = "" if args.sampling_topk else "; the same translation for {} of {}".format(
            sum(" ".join(h) == ours[i] for i, h in zip(ids, peer["hypotheses"])), sentences)
        print(f"CTranslate2, 1 thread, batch {peer['batch']}: {peer['seconds']:.2f} s, "
              f"{sentences / peer['seconds']:.1f} sentences/s ({whole / peer['seconds']:.2f}x its time for the "
              f"plugin's search), {peer['tokens']} output tokens{same}")
    full = args.batch_size * args.beam  # (sampled too: --beam N draws N samples a sentence)
    if rows:
        print(f"steps: {len(rows)} over {len(batches)} batches; rows a step: mean {statistics.mean(rows):.0f}, "
              f"first {full}; steps with fewer than 16 rows: {sum(r < 16 for r in rows)}")
        print(steps_by_rows(rows, began_at, full))
    else:  # (the native search: a batch's steps are one call)
        print(f"steps: not timed one by one ({len(batches)} batches, each one native call)")
    for part, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {part:48s} {value:7.2f} s {100 * value / whole:5.1f}%")
    if args.json:
        write_json(args.json, dict(
            sentences=sentences, tokens=tokens, parts=dict(seconds), calls=dict(calls),
            ctranslate2=[{k: p[k] for k in ("batch", "seconds", "tokens")} for p in peers]))
    if args.profile_ops:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            for b in batches:
                generator.generate(models, b)
        print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_ops))


def steps_by_rows(rows, began_at, full):
    """Where the search's time goes by a step's rows: each step timed from
    its start to the next one's within a batch (the search's work between
    them included; a batch's first and last steps are not timed), and what
    the timed steps would take were every row as cheap as in steps of at
    least half the batch's rows (the bound of a search that refilled its
    batch as sentences end)."""
    spans = [(r, later - start) for r, start, later in zip(rows, began_at, began_at[1:])
             if start is not None and later is not None]
    timed = sum(t for _, t in spans)
    large = [(r, t) for r, t in spans if 2 * r >= full]
    if not large:
        return f"timed steps {timed:.2f} s; none of at least {full // 2} rows to set a row's cost"
    per_row = sum(t for _, t in large) / sum(r for r, _ in large)
    small = [(r, t) for r, t in spans if r < 16]
    return (f"timed steps {timed:.2f} s; steps with fewer than 16 rows {sum(t for _, t in small):.2f} s "
            f"({len(small)} steps, {sum(r for r, _ in small)} rows); steps of at least {full // 2} rows "
            f"{sum(t for _, t in large):.2f} s, {per_row * 1e6:.1f} us a row; every row at that cost: "
            f"{per_row * sum(r for r, _ in spans):.2f} s")


if __name__ == "__main__":
    main()
