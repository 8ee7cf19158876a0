#!/usr/bin/env python
"""One sentence at a time, as a service, an editor or fairseq-interactive
translates: the hub's ``translate(line)`` against CTranslate2's
``translate_batch([tokens])`` on the same weights, one thread each, each in a
process of its own, the two alternated ``--reps`` times (the best median of
each kept). Beam 4. Prints the median and p90 milliseconds a sentence, the
ratio, how many translations agree, and where the engine's time goes: the
text to ids, the encoder, the search's steps (one native call), the rest
(the generator's call, the batch, the ids to text).

A trained model (``--data``, ``--path``, ``--bpe-text``: its source lines,
tokenized and BPE'd as its data) decodes each sentence to its own end; with
``--random-dims small|base`` a fairseq ``transformer`` of random weights
decodes ``--len``-token random sentences to that length (as
``scripts/benchmark_generate_cores.py``). ``--int8``: both in int8.
``--sampling-topk K``: one sample a sentence among the K most probable
tokens instead of beam search (the hub's ``translate(line, beam=1,
sampling=True, sampling_topk=K)``; the samples are not compared).

Examples (the trained de->en model of results/corpus.md):
  research/one_sentence_latency.py --data DEEN/data-bin --path DEEN/checkpoint.pt
      --bpe-text DEEN/bpe/test_2016_flickr.de --json results/one_sentence_latency.json
  research/one_sentence_latency.py --random-dims base --sentences 60
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

ENGINE_RUN = r"""
import json, os, statistics, sys, time
import torch
torch.set_num_threads(1)
import fairseq_hardattn
from fairseq_hardattn import kernels
from fairseq_hardattn.decoding import native_search
from hardattn_tools.timing import accumulating

a = json.loads(sys.argv[1])
folder, name = os.path.split(a["path"])
hub = fairseq_hardattn.from_pretrained(folder, checkpoint_file=name, data_name_or_path=a["data"],
                                       source_lang=a["src"], target_lang=a["tgt"], **a["overrides"]).eval()
lines, options = json.load(open(a["lines"])), a["options"]
spent = dict.fromkeys(("text to ids", "encoder", "steps (native search)"), 0.0)
hub.encode = accumulating(hub.encode, spent, "text to ids")
native_search.encode = accumulating(native_search.encode, spent, "encoder")
library = kernels.native()
if library is not None:
    library.beam_search = accumulating(library.beam_search, spent, "steps (native search)")
for line in lines[:10]:
    hub.translate(line, **options)
spent.update(dict.fromkeys(spent, 0.0))
ms, out = [], []
for line in lines:
    start = time.perf_counter()
    out.append(hub.translate(line, **options))
    ms.append(1000 * (time.perf_counter() - start))
parts = {k: 1000 * v / len(lines) for k, v in spent.items()}
parts["the rest (generator call, batch, ids to text)"] = statistics.mean(ms) - sum(parts.values())
print(json.dumps(dict(ms=ms, out=out, parts=parts)))
"""

CT2_RUN = r"""
import json, sys, time
import ctranslate2
a = json.loads(sys.argv[1])
translator = ctranslate2.Translator(a["model"], device="cpu", compute_type=a["compute_type"],
                                    inter_threads=1, intra_threads=1)
lines, options = json.load(open(a["lines"])), a["ct2_options"]
for line in lines[:10]:
    translator.translate_batch([line.split()], **options)
ms, out = [], []
for line in lines:
    start = time.perf_counter()
    result = translator.translate_batch([line.split()], **options)
    ms.append(1000 * (time.perf_counter() - start))
    out.append(" ".join(t for t in result[0].hypotheses[0] if t != "</s>"))
print(json.dumps(dict(ms=ms, out=out)))
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a trained model's data-bin (with --path and --bpe-text)")
    p.add_argument("--path", help="its checkpoint (a fairseq transformer)")
    p.add_argument("--bpe-text", help="source lines, tokenized and BPE'd as its data")
    p.add_argument("--source-lang", default="de")
    p.add_argument("--target-lang", default="en")
    p.add_argument("--random-dims", choices=["small", "base"], help="random weights at these dims instead")
    p.add_argument("--len", type=int, default=30, help="with --random-dims: source and output tokens")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--int8", action="store_true", help="the engine's int8 against CTranslate2's")
    p.add_argument("--sampling-topk", type=int, default=0,
                   help="sample one translation a sentence among the K most probable tokens (0: beam search)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args()
    if args.random_dims is None and not (args.data and args.path and args.bpe_text):
        p.error("give --data, --path and --bpe-text (a trained model), or --random-dims")
    for name in ("data", "path", "bpe_text"):
        value = getattr(args, name)
        if value and not os.path.exists(value):
            p.error(f"--{name.replace('_', '-')} {value}: not found")
    return args


def prepare(args, work):
    """The checkpoint, its data, the lines and CTranslate2's converted model."""
    from ctranslate2.converters import FairseqConverter

    if args.random_dims:
        import benchmark_generate_cores

        setting = benchmark_generate_cores.parse_args(["--dims", args.random_dims, "--len", str(args.len),
                                                       "--sentences", str(args.sentences)])
        older, rows = benchmark_generate_cores.checkpoint_and_data(setting, work)
        FairseqConverter(older, f"{work}/bin", source_lang="src", target_lang="tgt").convert(f"{work}/ct2")
        lines = [" ".join(row) for row in rows]
        path, data, source, target = f"{work}/model.pt", f"{work}/bin", "src", "tgt"
        options = dict(beam=args.beam, min_len=args.len, max_len_a=0, max_len_b=args.len)
        ct2_options = dict(beam_size=args.beam, min_decoding_length=args.len + 1,
                           max_decoding_length=args.len + 1, return_end_token=True)
    else:
        with open(args.bpe_text, encoding="utf-8") as f:
            lines = [line.strip() for line in f][:args.sentences]
        path, data = os.path.abspath(args.path), os.path.abspath(args.data)
        source, target = args.source_lang, args.target_lang
        FairseqConverter(path, data, source_lang=source, target_lang=target).convert(f"{work}/ct2")
        options = dict(beam=args.beam)
        ct2_options = dict(beam_size=args.beam, max_decoding_length=201)
    if args.sampling_topk:
        options.update(beam=1, sampling=True, sampling_topk=args.sampling_topk)
        ct2_options.update(beam_size=1, sampling_topk=args.sampling_topk)
    with open(f"{work}/lines.json", "w") as f:
        json.dump(lines, f)
    return dict(path=path, data=data, src=source, tgt=target, lines=f"{work}/lines.json", options=options,
                ct2_options=ct2_options, model=f"{work}/ct2", compute_type="int8" if args.int8 else "float32",
                overrides={"int8_decoding": True} if args.int8 else {}), len(lines)


def run(code, setting):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(setting)], capture_output=True, text=True,
                         env=env)
    if out.returncode:
        raise SystemExit("one_sentence_latency: a run failed:\n" + out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    from hardattn_tools.reporting import write_outputs
    from hardattn_tools.scratch import scratch_folder

    args = parse_args()
    work = str(scratch_folder("one-sentence-"))
    setting, count = prepare(args, work)
    engine, peer = "the engine (hub translate)", f"CTranslate2 {setting['compute_type']}"
    runs = {engine: [], peer: []}
    for rep in range(args.reps):
        runs[engine].append(run(ENGINE_RUN, setting))
        runs[peer].append(run(CT2_RUN, setting))
        print(f"[one_sentence_latency] rep {rep + 1}/{args.reps}: "
              f"{statistics.median(runs[engine][-1]['ms']):.2f} / {statistics.median(runs[peer][-1]['ms']):.2f} ms",
              file=sys.stderr, flush=True)
    figures = {}
    for name, results in runs.items():
        medians = [statistics.median(r["ms"]) for r in results]
        best = results[medians.index(min(medians))]
        figures[name] = {"median_ms": round(min(medians), 3), "medians_ms": [round(m, 3) for m in medians],
                         "p90_ms": round(sorted(best["ms"])[int(0.9 * len(best["ms"]))], 3)}
    best_engine = min(runs[engine], key=lambda r: statistics.median(r["ms"]))
    parts = {k: round(v, 3) for k, v in best_engine["parts"].items()}
    # (random weights decode to a forced length, which the two force differently: not compared)
    same = None if args.random_dims or args.sampling_topk else sum(a == b for a, b in zip(runs[engine][0]["out"], runs[peer][0]["out"]))
    ratio = figures[peer]["median_ms"] / figures[engine]["median_ms"]
    where = (f"random weights, {args.random_dims} dims, {args.len}-token sources and outputs" if args.random_dims
             else f"{os.path.basename(args.bpe_text)}, each sentence to its own end")
    search = f"sampling among the {args.sampling_topk} best" if args.sampling_topk else f"beam {args.beam}"
    lines = [f"{count} sentences one at a time, {search}, one thread, {where}", "",
             "| system | median ms | p90 ms | medians of the runs |", "|---|---|---|---|"]
    lines += [f"| {n} | {f['median_ms']:.2f} | {f['p90_ms']:.2f} | {', '.join(map(str, f['medians_ms']))} |"
              for n, f in figures.items()]
    lines += ["", f"- CTranslate2's median / the engine's: {ratio:.2f}x (above 1: the engine is faster)",
              f"- the same translation: {same} of {count}" if same is not None else
              "- translations not compared (samples, or lengths forced)",
              "- the engine's time a sentence: " + ", ".join(f"{k} {v:.2f} ms" for k, v in parts.items())]
    write_outputs({"settings": vars(args), "systems": figures, "engine_parts_ms": parts, "same": same,
                   "sentences": count, "ratio": round(ratio, 3)}, "\n".join(lines), args.json, args.markdown)


if __name__ == "__main__":
    main()
