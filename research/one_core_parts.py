#!/usr/bin/env python
"""One core, the same sentences: where the plugin's search spends its time,
and CTranslate2's time for them.

Loads a checkpoint as fairseq-generate does (its data, ``--path``), takes the
first ``--batches`` batches of ``--sentences`` sentences of ``--subset`` (in
fairseq's order: by length), and decodes them with the plugin's search on one
thread, in this process, with the search's parts timed (each part's wall
time around its calls: the encoder, the decoder's step, the output
projection, the attention kernels, the candidates kernel, the draws, the
reorders). Then CTranslate2 (its own process, one thread, its fairseq
converter on the same weights) translates the same source tokens at batch
``--sentences`` and 32. The two never run at once.

Example (sampling, the trained de->en model of results/corpus.md):
  research/one_core_parts.py work/deen/data-bin --path work/deen/checkpoints/checkpoint_best.pt
      --subset train --batches 60 --sampling-topk 10
"""

import argparse
import collections
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CT2_RUN = r"""
import json, sys, time
import ctranslate2
args = json.loads(sys.argv[1])
translator = ctranslate2.Translator(args["model"], device="cpu", compute_type="float32",
                                    inter_threads=1, intra_threads=1)
sources = json.load(open(args["sources"]))
for batch in args["batches"]:
    start = time.perf_counter()
    results = translator.translate_batch(sources, max_batch_size=batch, max_decoding_length=201, **args["options"])
    seconds = time.perf_counter() - start
    tokens = sum(len(r.hypotheses[0]) + 1 for r in results)
    print(json.dumps(dict(batch=batch, seconds=seconds, tokens=tokens)), flush=True)
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data")
    p.add_argument("--path", required=True)
    p.add_argument("--subset", default="valid")
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--sentences", type=int, default=128, help="sentences a batch")
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--sampling-topk", type=int, default=0, help="sample among the k best (0: beam search)")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args(argv)


def load(args):
    import torch
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_hardattn import compat

    torch.set_num_threads(1)
    argv = [args.data, "--user-dir", str(REPO / "fairseq_hardattn"), "--path", args.path,
            "--beam", str(args.beam), "--seed", "1", "--model-overrides", "{'decoding_workers': 1}"]
    if args.sampling_topk:
        argv += ["--sampling", "--sampling-topk", str(args.sampling_topk)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(), argv))
    utils.import_user_module(cfg.common)
    compat.install_for_command_line()  # (fairseq's transformer read as the plugin's, as in fairseq-generate)
    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble([args.path], task=task,
                                                     arg_overrides=eval(cfg.common_eval.model_overrides))
    for model in models:
        model.prepare_for_inference_(cfg)
    task.load_dataset(args.subset)
    generator = task.build_generator(models, cfg.generation)
    positions = utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in models])
    batches = task.get_batch_iterator(task.dataset(args.subset), max_sentences=args.sentences,
                                      max_positions=positions).next_epoch_itr(shuffle=False)
    return task, models, generator, [b for _, b in zip(range(args.batches), batches)]


def timed_parts():
    """Wrap the search's parts with timers; returns (seconds, calls) by part."""
    from fairseq_hardattn import kernels
    from fairseq_hardattn.decoding import beam_search, direct_step, sampling

    seconds, calls = collections.Counter(), collections.Counter()

    def timed(owner, name, part):
        function = getattr(owner, name)

        @functools.wraps(function)
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                seconds[part] += time.perf_counter() - start
                calls[part] += 1
        setattr(owner, name, wrapper)

    for owner, name, part in (
            (beam_search.PluginBeamSearch, "_generate", "whole search"),
            (beam_search.StepLogits, "start", "encoder"),
            (beam_search.StepLogits, "__call__", "decoder step with the output projection"),
            (beam_search.StepLogits, "features", "decoder step"),
            (direct_step, "_self_attention", "self-attention sublayers (4 products, kernel)"),
            (direct_step, "_cross_attention", "cross-attention sublayers (2 products, kernel)"),
            (direct_step, "_feed_forward", "feed-forward sublayers"),
            (kernels, "step_attention", "attention kernel calls"),
            (beam_search.kernels, "beam_candidates", "candidates kernel (normaliser, top k)"),
            (sampling.SentenceDraws, "step", "sampling draws"),
            (beam_search.StepLogits, "next_step", "cache reorders"),
            (beam_search.StepLogits, "reorder_encoder_out", "encoder output reorders"),
            (beam_search.PluginBeamSearch, "_finalize", "finished hypotheses")):
        timed(owner, name, part)
    return seconds, calls


def main(argv=None):
    args = parse_args(argv)
    task, models, generator, batches = load(args)
    seconds, calls = timed_parts()
    generator.generate(models, batches[0])  # (first use: kernels loaded, buffers made)
    seconds.clear(), calls.clear()
    tokens = 0
    for sample in batches:
        tokens += sum(len(h[0]["tokens"]) for h in generator.generate(models, sample))
    sentences = sum(int(b["nsentences"]) for b in batches)
    whole = seconds["whole search"]
    seconds["output projection"] = seconds["decoder step with the output projection"] - seconds["decoder step"]
    print(f"plugin's search, 1 thread: {sentences} sentences, {tokens} tokens, {whole:.2f} s")
    for part, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {part:48s} {value:7.2f} s {100 * value / whole:5.1f}%")

    from fairseq_hardattn.tools.ctranslate2_peer import convert

    dictionary = task.source_dictionary
    sources = [[dictionary[t] for t in row.tolist() if t not in (dictionary.pad(), dictionary.eos())]
               for b in batches for row in b["net_input"]["src_tokens"]]
    with tempfile.TemporaryDirectory() as folder:
        model_dir = convert(models[0], dictionary, folder)
        source_file = os.path.join(folder, "sources.json")
        json.dump(sources, open(source_file, "w"))
        options = dict(beam_size=args.beam)
        if args.sampling_topk:
            options["sampling_topk"] = args.sampling_topk
        setting = dict(model=model_dir, sources=source_file, batches=[args.sentences, 32], options=options)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, "-c", CT2_RUN, json.dumps(setting)], env=env,
                             capture_output=True, text=True, check=True).stdout
    peers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for peer in peers:
        print(f"CTranslate2, 1 thread, batch {peer['batch']}: {peer['seconds']:.2f} s ({peer['tokens']} tokens): "
              f"the plugin's search takes {whole / peer['seconds']:.2f}x its time")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(
            command=" ".join(sys.argv), sentences=sentences, tokens=tokens, parts=dict(seconds),
            calls=dict(calls), ctranslate2=peers), indent=1) + "\n")


if __name__ == "__main__":
    main()
