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

With ``--data DATA_BIN --path CHECKPOINT`` it decodes real sentences with a
trained model instead: ``--subset`` of the binarized set (test, valid), each
sentence to its own end as fairseq-generate decodes it (nothing forced),
batched by ``--batch`` or ``--max-tokens``; CTranslate2 translates the same
source tokens with its fairseq converter on the same weights, batched by the
same limit (``max_batch_size``, its ``batch_type``), and the table also says
how many best hypotheses agree.

With ``--text`` the sources are real sentences (a BPE'd text file, its
tokens from ``--dictionary``, the dictionary padded with unused symbols to
``--vocab``), so that a vocabulary shortlist sees a real batch's tokens; with
``--shortlist`` (a table in CTranslate2's vocabulary map format, e.g. from
``python -m fairseq_hardattn shortlist``) the engine also decodes over it and
CTranslate2 with the same file as its vocabulary map (``use_vmap``).

Examples: scripts/benchmark_generate_cores.py --dims small --reps 3 --markdown results/speed_generate_cores.md
  scripts/benchmark_generate_cores.py --data DEEN/data-bin --path DEEN/checkpoint.pt --subset test --batch 64
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "fairseq_hardattn")
sys.path.insert(0, REPO)
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
    p.add_argument("--data", help="a trained model's binarized data (with --path): real sentences")
    p.add_argument("--path", help="with --data: the trained fairseq transformer checkpoint")
    p.add_argument("--subset", default="test", help="with --data: the set decoded (default: test)")
    p.add_argument("--max-tokens", type=int, help="with --data: batches of at most N source tokens "
                                                       "(instead of --batch sentences)")
    p.add_argument("--text", help="sources: a BPE'd text file (default: random words)")
    p.add_argument("--dictionary", help="with --text: its dictionary (fairseq's dict.LANG.txt)")
    p.add_argument("--shortlist", help="a shortlist table (vmap) in --dictionary's tokens")
    p.add_argument("--shortlist-k", type=int, default=None, help="the engine's shortlist_k")
    p.add_argument("--bf16", action="store_true", help="also the engine with bfloat16 Linear layers")
    p.add_argument("--systems", default=None, help="a regular expression: only the systems it finds")
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("--json", help="write the rates here")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args(argv)
    if bool(args.data) != bool(args.path):
        p.error("--data and --path go together (a trained model's data and checkpoint)")
    if args.data and (args.text or args.shortlist):
        p.error("--data decodes its own set: not with --text or --shortlist")
    for option in ("text", "dictionary", "shortlist", "path"):
        path = getattr(args, option)
        if path is not None and not os.path.isfile(path):
            p.error(f"--{option} {path}: no such file")
    if args.text and not args.dictionary:
        p.error("--text needs --dictionary (its tokens' dictionary)")
    return args


def checkpoint_and_data(args, work):
    """A random fairseq transformer (today's checkpoint format and the older
    one CTranslate2's converter reads) and a binarized test set of random
    sentences over a synthetic dictionary."""
    import torch
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.data import Dictionary

    import fairseq_hardattn  # noqa: F401  (torch >= 2.6 reads fairseq checkpoints)

    dictionary = Dictionary.load(args.dictionary) if args.text else Dictionary()
    for i in range(args.vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    if args.text:
        with open(args.text, encoding="utf-8") as f:
            rows = [line.split() for line in f.read().splitlines()[:args.sentences]]
    else:
        rows = [[dictionary[int(t)] for t in row] for row in torch.randint(
            dictionary.nspecial, len(dictionary), (args.sentences, args.len),
            generator=torch.Generator().manual_seed(1))]
    for lang in ("src", "tgt"):
        dictionary.save(os.path.join(work, f"dict.{lang}.txt"))
        with open(os.path.join(work, f"test.{lang}"), "w") as f:
            f.writelines(" ".join(row) + "\n" for row in rows)
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
    return older, rows


def real_sentences(args, work):
    """The trained model's set as CTranslate2 reads it (``work/test.src``:
    its source tokens a line, in the set's order) and its converted model."""
    from ctranslate2.converters import FairseqConverter
    from fairseq.data import Dictionary, data_utils

    import fairseq_hardattn  # noqa: F401  (torch >= 2.6 reads fairseq checkpoints)

    names = sorted(os.listdir(args.data))
    pair = next(n.split(".")[1] for n in names if n.startswith(f"{args.subset}.") and n.endswith(".idx"))
    source, target = pair.split("-")
    dictionary = Dictionary.load(os.path.join(args.data, f"dict.{source}.txt"))
    dataset = data_utils.load_indexed_dataset(os.path.join(args.data, f"{args.subset}.{pair}.{source}"),
                                              dictionary)
    with open(f"{work}/test.src", "w") as f:
        for i in range(len(dataset)):
            f.write(" ".join(dictionary[int(t)] for t in dataset[i][:-1]) + "\n")
    FairseqConverter(args.path, args.data, source_lang=source, target_lang=target).convert(f"{work}/ct2",
                                                                                         force=True)
    return len(dataset)


def generate_rate(args, work, overrides=None, threads=None, hypotheses=None):
    if args.data:
        limit = ["--max-tokens", str(args.max_tokens)] if args.max_tokens else ["--batch-size", str(args.batch)]
        command = [os.path.join(os.path.dirname(sys.executable), "fairseq-generate"), args.data,
                   "--user-dir", USER_DIR, "--path", args.path, "--beam", "4", *limit, "--gen-subset",
                   args.subset]
    else:
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
    # (its rate, not sentences / its time: the time is printed to a tenth of a second)
    found = re.search(r"Translated [\d,]+ sentences .* in [\d.]+s \(([\d.]+) sentences/s", out.stdout + out.stderr)
    if not found:
        raise SystemExit("benchmark_generate_cores: fairseq-generate failed: " + out.stderr[-600:])
    if hypotheses is not None:  # each sentence's best hypothesis (its tokens), by id
        hypotheses.update(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out.stdout, flags=re.M))
    return float(found.group(1))


CT2_RUN = """
import sys, time, ctranslate2
directory, compute_type, inter, intra, batch, steps = sys.argv[1:7]
words = [line.split() for line in open(sys.argv[7])]
translator = ctranslate2.Translator(directory, device="cpu", compute_type=compute_type,
                                    inter_threads=int(inter), intra_threads=int(intra))
batch = int(batch)
if steps == "own":  # real sentences: each to its own end, batched as fairseq batches them
    limit, batch_type = (int(sys.argv[9]), "tokens") if sys.argv[9] != "-" else (batch, "examples")
    options = dict(beam_size=4, max_decoding_length=201, max_batch_size=limit, batch_type=batch_type)
    translator.translate_batch(words[:64], **options)  # warm-up
    start = time.perf_counter()
    results = translator.translate_batch(words, **options)
    seconds = time.perf_counter() - start
    with open(sys.argv[10], "w") as f:
        f.writelines(" ".join(r.hypotheses[0]) + "\\n" for r in results)
    print(len(words) / seconds)
    sys.exit(0)
options = dict(beam_size=4, min_decoding_length=int(steps), max_decoding_length=int(steps), return_end_token=True,
               use_vmap=sys.argv[8] == "vmap")
translator.translate_batch(words[:batch], **options)  # warm-up
start = time.perf_counter()
futures = [f for i in range(0, len(words), batch)
           for f in translator.translate_batch(words[i:i + batch], asynchronous=True, **options)]
for future in futures:
    future.result()
print(len(words) / (time.perf_counter() - start))
"""


def ct2_rate(args, work, compute_type, inter, intra, vmap=False, hypotheses=None):
    steps = "own" if args.data else str(args.len + 1)
    out = subprocess.run([sys.executable, "-c", CT2_RUN, f"{work}/ct2", compute_type, str(inter), str(intra),
                          str(args.batch), steps, f"{work}/test.src", "vmap" if vmap else "-",
                          str(args.max_tokens or "-"), f"{work}/ct2.out"],
                         capture_output=True, text=True, check=True)
    if hypotheses is not None and args.data:
        with open(f"{work}/ct2.out") as f:
            hypotheses.update((str(i), line.rstrip("\n")) for i, line in enumerate(f))
    return float(out.stdout.strip().splitlines()[-1])


def summary(median, cores):
    """The ratios that the medians allow: one core to all, the engine to
    CTranslate2's best configuration, a shortlist to the exact engine."""
    def ratio(a, b):
        return f"{median[a] / median[b]:.2f}x" if a in median and b in median else None

    def ct2_best(prefix, threads):
        found = [n for n in median if n.startswith(prefix) and ("1 thread" in n) == (threads == 1)
                 and ("vmap" in n) == ("vmap" in prefix)]
        return max(found, key=median.get) if found else None

    found = []
    for name, ct2 in (("fp32", "CT2 float32 "), ("int8", "CT2 int8 "), ("int8 + shortlist", "CT2 int8 + vmap")):
        for threads, suffix in ((cores, ""), (1, ", 1 thread")):
            engine, peer = f"engine {name}{suffix}", ct2_best(ct2, threads)
            if peer and ratio(engine, peer):
                found.append(f"- {engine} / {peer}: {ratio(engine, peer)}")
    for suffix in ("", ", 1 thread"):
        if ratio(f"engine bf16{suffix}", f"engine fp32{suffix}"):
            found.append(f"- engine bf16{suffix} / engine fp32{suffix}: {ratio(f'engine bf16{suffix}', f'engine fp32{suffix}')}")
    for name in ("fp32", "int8"):
        for suffix in ("", ", 1 thread"):
            if ratio(f"engine {name} + shortlist{suffix}", f"engine {name}{suffix}"):
                found.append(f"- engine {name} + shortlist{suffix} / engine {name}{suffix}: "
                             f"{ratio(f'engine {name} + shortlist{suffix}', f'engine {name}{suffix}')}")
        if ratio(f"engine {name}", f"engine {name}, 1 thread"):
            found.append(f"- engine {name}, 1 -> {cores} cores: {ratio(f'engine {name}', f'engine {name}, 1 thread')}")
    return found


def main(argv=None):
    from hardattn_tools.reporting import write_outputs

    args = parse_args(argv)
    from hardattn_tools.scratch import scratch_folder

    work = str(scratch_folder("generate-cores-"))
    if args.data:
        args.sentences = real_sentences(args, work)
    else:
        older, _ = checkpoint_and_data(args, work)
        from ctranslate2.converters import FairseqConverter

        FairseqConverter(older, f"{work}/bin", source_lang="src", target_lang="tgt").convert(f"{work}/ct2",
                                                                                           force=True)
    cores = args.cores
    engine, int8 = "{'decoding_engine': 'auto'}", "{'decoding_engine': 'auto', 'int8_decoding': True}"
    best = {"engine": {}, "CT2": {}}  # (real sentences) each system's best hypotheses, by sentence id
    systems = {
        "fairseq's generator": lambda: generate_rate(args, work, "{'decoding_engine': 'fairseq'}"),
        "defaults (no override)": lambda: generate_rate(args, work),
        "engine fp32": lambda: generate_rate(args, work, engine, hypotheses=best["engine"]),
        "engine int8": lambda: generate_rate(args, work, int8),
        "engine fp32, 1 thread": lambda: generate_rate(args, work, engine, threads=1),
        "engine int8, 1 thread": lambda: generate_rate(args, work, int8, threads=1),
    }
    for ct in ("float32", "int8"):
        systems[f"CT2 {ct} intra {cores}"] = lambda ct=ct: ct2_rate(args, work, ct, 1, cores)
        systems[f"CT2 {ct} inter {cores} x intra 1"] = lambda ct=ct: ct2_rate(args, work, ct, cores, 1)
        systems[f"CT2 {ct} 1 thread"] = lambda ct=ct: ct2_rate(
            args, work, ct, 1, 1, hypotheses=best["CT2"] if ct == "float32" else None)
    if args.bf16:  # bfloat16 Linear layers (CPUs with AMX or AVX512-BF16)
        bf16 = "{'decoding_engine': 'auto', 'bf16_decoding': True}"
        systems["engine bf16"] = lambda: generate_rate(args, work, bf16)
        systems["engine bf16, 1 thread"] = lambda: generate_rate(args, work, bf16, threads=1)
    if args.shortlist:  # the same table: the engine's shortlist, CTranslate2's vocabulary map
        shutil.copy(args.shortlist, f"{work}/ct2/vmap.txt")
        k = f", 'shortlist_k': {args.shortlist_k}" if args.shortlist_k else ""
        listed = f"'shortlist': '{os.path.abspath(args.shortlist)}'{k}"
        for name, precision in (("fp32", ""), ("int8", ", 'int8_decoding': True")):
            overrides = f"{{'decoding_engine': 'auto'{precision}, {listed}}}"
            systems[f"engine {name} + shortlist"] = lambda o=overrides: generate_rate(args, work, o)
            systems[f"engine {name} + shortlist, 1 thread"] = lambda o=overrides: generate_rate(args, work, o, 1)
        systems[f"CT2 int8 + vmap intra {cores}"] = lambda: ct2_rate(args, work, "int8", 1, cores, True)
        systems[f"CT2 int8 + vmap inter {cores} x intra 1"] = lambda: ct2_rate(args, work, "int8", cores, 1, True)
        systems["CT2 int8 + vmap 1 thread"] = lambda: ct2_rate(args, work, "int8", 1, 1, True)
    if args.systems:
        systems = {name: run for name, run in systems.items() if re.search(args.systems, name)}
    rates = {name: [] for name in systems}
    for rep in range(args.reps):
        for name, run in systems.items():
            rates[name].append(run())
            print(f"[benchmark_generate_cores] rep {rep + 1}/{args.reps} {name}: {rates[name][-1]:.1f} sent/s",
                  file=sys.stderr, flush=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    import ctranslate2
    import torch

    where = (f"data={args.data} path={args.path} subset={args.subset} each to its own end "
             if args.data else f"dims={args.dims} len={args.len} ")
    lines = [f"{where}sentences={args.sentences} batch={args.max_tokens or args.batch}"
             f"{' tokens' if args.max_tokens else ''} vocab={args.vocab} "
             f"cores={cores} text={args.text or 'random'} shortlist={args.shortlist or '-'} "
             f"shortlist_k={args.shortlist_k or 'all'} torch={torch.__version__} "
             f"ctranslate2={ctranslate2.__version__}", "",
             "| system | sent/s (median) | runs |", "|---|---|---|"]
    lines += [f"| {n} | {median[n]:.1f} | {', '.join(f'{x:.1f}' for x in rates[n])} |" for n in systems]
    lines += ["", *summary(median, cores)]
    if best["engine"] and best["CT2"]:
        same = sum(best["engine"].get(i) == text for i, text in best["CT2"].items())
        lines.append(f"- the same best hypothesis (engine float32, CTranslate2 float32): {same} of {len(best['CT2'])}")
    write_outputs({"settings": vars(args), "rates": rates, "median": median}, "\n".join(lines),
                  args.json, args.markdown)


if __name__ == "__main__":
    main()
