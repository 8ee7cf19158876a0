#!/usr/bin/env python
"""Throughput on all the cores as a user gets it: fairseq-generate with its
defaults (no thread or worker option: the plugin's engine as it configures
itself) on a binarized set of random sentences, a fairseq ``transformer``
checkpoint with random weights, against CTranslate2 on the same weights in
both of its multi-core configurations (intra-op threads; a batch per core,
``inter_threads``), float32 and int8, and each at one thread. Every
hypothesis is as long as its source (--min-len / --max-len-b; CTranslate2's
min/max_decoding_length). Each system runs in a process of its own, the
systems alternated, the median of --reps kept. Rates: fairseq-generate's own
"Translated N sentences ... in T s" (decoding only); CTranslate2's wall time
for the same sentences. Needs ctranslate2 (pip install -e .[bench]).

Example: scripts/benchmark_generate_cores.py --dims small --reps 3 --markdown results/speed_generate_cores.md
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "fairseq_hardattn")
SMALL = ["--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "256",
         "--decoder-ffn-embed-dim", "256", "--encoder-layers", "4", "--decoder-layers", "4",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", choices=["small", "base"], default="small")
    p.add_argument("--len", type=int, default=30, help="source and output tokens")
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("--json", help="write the rates here")
    p.add_argument("--markdown", help="write the table here")
    return p.parse_args(argv)


def checkpoint_and_data(args, work):
    """A random fairseq transformer (today's checkpoint format and the older
    one CTranslate2's converter reads) and a binarized test set of random
    sentences over a synthetic dictionary."""
    import torch
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.data import Dictionary

    import fairseq_hardattn  # noqa: F401  (torch >= 2.6 reads fairseq checkpoints)

    dictionary = Dictionary()
    for i in range(args.vocab - 4):
        dictionary.add_symbol(f"w{i}")
    rows = torch.randint(dictionary.nspecial, len(dictionary), (args.sentences, args.len),
                         generator=torch.Generator().manual_seed(1))
    for lang in ("src", "tgt"):
        dictionary.save(os.path.join(work, f"dict.{lang}.txt"))
        with open(os.path.join(work, f"test.{lang}"), "w") as f:
            f.writelines(" ".join(dictionary[int(t)] for t in row) + "\n" for row in rows)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess"), "-s", "src",
                    "-t", "tgt", "--testpref", f"{work}/test", "--srcdict", f"{work}/dict.src.txt",
                    "--tgtdict", f"{work}/dict.tgt.txt", "--destdir", f"{work}/bin", "--workers", "1"],
                   check=True, capture_output=True)
    train_args = options.parse_args_and_arch(options.get_training_parser(), [
        f"{work}/bin", "--task", "translation", "-s", "src", "-t", "tgt", "--arch", "transformer",
        "--share-all-embeddings"] + (SMALL if args.dims == "small" else []))
    torch.manual_seed(0)
    model = tasks.setup_task(train_args).build_model(train_args)
    older = os.path.join(work, "model_args.pt")
    torch.save({"args": train_args, "cfg": None, "model": model.state_dict(),
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                       "lr_scheduler_state": {}, "num_updates": 0}],
                "extra_state": {}, "last_optimizer_state": None}, older)
    state = checkpoint_utils.load_checkpoint_to_cpu(older)
    from omegaconf import OmegaConf

    state["cfg"] = OmegaConf.to_container(state["cfg"], resolve=True)
    state.pop("args", None)
    torch.save(state, os.path.join(work, "model.pt"))
    return older, [[dictionary[int(t)] for t in row] for row in rows]


def generate_rate(args, work, overrides=None, threads=None):
    command = [os.path.join(os.path.dirname(sys.executable), "fairseq-generate"), f"{work}/bin",
               "--user-dir", USER_DIR, "--path", f"{work}/model.pt", "--beam", "4",
               "--batch-size", str(args.batch), "--min-len", str(args.len), "--max-len-a", "0",
               "--max-len-b", str(args.len), "--gen-subset", "test"]
    if overrides:
        command += ["--model-overrides", overrides]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    found = re.search(r"Translated ([\d,]+) sentences .* in ([\d.]+)s", out.stdout + out.stderr)
    if not found:
        raise SystemExit("benchmark_generate_cores: fairseq-generate failed: " + out.stderr[-600:])
    return int(found.group(1).replace(",", "")) / float(found.group(2))


CT2_RUN = """
import sys, time, ctranslate2
directory, compute_type, inter, intra, batch, steps = sys.argv[1:7]
words = [line.split() for line in open(sys.argv[7])]
translator = ctranslate2.Translator(directory, device="cpu", compute_type=compute_type,
                                    inter_threads=int(inter), intra_threads=int(intra))
options = dict(beam_size=4, min_decoding_length=int(steps), max_decoding_length=int(steps), return_end_token=True)
batch = int(batch)
translator.translate_batch(words[:batch], **options)  # warm-up
start = time.perf_counter()
futures = [f for i in range(0, len(words), batch)
           for f in translator.translate_batch(words[i:i + batch], asynchronous=True, **options)]
for future in futures:
    future.result()
print(len(words) / (time.perf_counter() - start))
"""


def ct2_rate(args, work, compute_type, inter, intra):
    out = subprocess.run([sys.executable, "-c", CT2_RUN, f"{work}/ct2", compute_type, str(inter), str(intra),
                          str(args.batch), str(args.len + 1), f"{work}/test.src"],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    args = parse_args(argv)
    work = tempfile.mkdtemp(prefix="generate-cores-")
    older, _ = checkpoint_and_data(args, work)
    from ctranslate2.converters import FairseqConverter

    FairseqConverter(older, f"{work}/bin", source_lang="src", target_lang="tgt").convert(f"{work}/ct2",
                                                                                       force=True)
    cores = args.cores
    engine, int8 = "{'decoding_engine': 'auto'}", "{'decoding_engine': 'auto', 'int8_decoding': True}"
    systems = {
        "fairseq's generator": lambda: generate_rate(args, work, "{'decoding_engine': 'fairseq'}"),
        "defaults (no override)": lambda: generate_rate(args, work),
        "engine fp32": lambda: generate_rate(args, work, engine),
        "engine int8": lambda: generate_rate(args, work, int8),
        "engine fp32, 1 thread": lambda: generate_rate(args, work, engine, threads=1),
        "engine int8, 1 thread": lambda: generate_rate(args, work, int8, threads=1),
    }
    for ct in ("float32", "int8"):
        systems[f"CT2 {ct} intra {cores}"] = lambda ct=ct: ct2_rate(args, work, ct, 1, cores)
        systems[f"CT2 {ct} inter {cores} x intra 1"] = lambda ct=ct: ct2_rate(args, work, ct, cores, 1)
        systems[f"CT2 {ct} 1 thread"] = lambda ct=ct: ct2_rate(args, work, ct, 1, 1)
    rates = {name: [] for name in systems}
    for rep in range(args.reps):
        for name, run in systems.items():
            rates[name].append(run())
            print(f"[benchmark_generate_cores] rep {rep + 1}/{args.reps} {name}: {rates[name][-1]:.1f} sent/s",
                  file=sys.stderr, flush=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    best = {ct: max(v for n, v in median.items() if n.startswith(f"CT2 {ct}") and "1 thread" not in n)
            for ct in ("float32", "int8")}
    import ctranslate2
    import torch

    lines = [f"dims={args.dims} len={args.len} sentences={args.sentences} batch={args.batch} "
             f"cores={cores} torch={torch.__version__} ctranslate2={ctranslate2.__version__}", "",
             "| system | sent/s (median) | runs |", "|---|---|---|"]
    lines += [f"| {n} | {median[n]:.1f} | {', '.join(f'{x:.1f}' for x in rates[n])} |" for n in systems]
    lines += ["", f"engine 1 -> {cores} cores: fp32 {median['engine fp32'] / median['engine fp32, 1 thread']:.2f}x, "
              f"int8 {median['engine int8'] / median['engine int8, 1 thread']:.2f}x; "
              f"engine / CTranslate2's best on {cores} cores: fp32 {median['engine fp32'] / best['float32']:.2f}x, "
              f"int8 {median['engine int8'] / best['int8']:.2f}x"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "rates": rates, "median": median}, f, indent=2)


if __name__ == "__main__":
    main()
