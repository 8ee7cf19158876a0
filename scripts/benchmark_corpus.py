#!/usr/bin/env python
"""Translating a corpus, as back-translation does: lines/s and peak memory
of the corpus command (``python -m fairseq_hardattn translate``),
fairseq-interactive (``--buffer-size 1000 --max-tokens 12000``) with
fairseq's generator and with the plugin's engine, and CTranslate2's
``translate_file`` (its two configurations for the cores: intra-op threads,
or a batch per core) on the same weights and the same tokenization (the
command's Moses tokenizer and BPE, called by CTranslate2 as its tokenize and
detokenize functions), beam search and top-k sampling.

The corpus: ``--lines`` lines drawn (repeated, shuffled) from ``--text``.
The models: a trained fairseq ``transformer`` (``--path`` with its data and
BPE), and with ``--random small base`` that model's dictionaries under
random weights at those dims (every output exactly ``--random-length``
tokens). Each system runs in a process of its own, on every core, the
systems one after another; lines/s counts the whole run (start, loading,
reading, writing). ``--lines-of SYSTEM=N`` runs a slow system on the first
N lines only. Also measured for the corpus command: the memory growth after
its first 10,000 lines, and the time lost to a SIGKILL half-way (the killed
run and the resumed one, less an uninterrupted run).

Example (de->en, 2 cores):
  scripts/benchmark_corpus.py --text ../shared/data/multi30k/raw/train.de --lines 100000
    --data work/deen/data-bin --path work/deen/checkpoints/checkpoint_best.pt
    --bpe-codes work/deen/bpe/codes --bpe-vocabulary work/deen/bpe/vocab.de
    --source-lang de --target-lang en --lines-of interactive-fairseq=10000
    --markdown results/corpus_speed.md --json results/corpus_speed.json
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SYSTEMS = ("corpus", "interactive-engine", "interactive-fairseq", "ct2-inter", "ct2-intra")
MODES = {"beam4": dict(fairseq=["--beam", "4"], ct2=dict(beam_size=4)),
         "topk10": dict(fairseq=["--sampling", "--sampling-topk", "10", "--beam", "1", "--seed", "1"],
                        ct2=dict(beam_size=1, sampling_topk=10))}
DIMS = {"small": dict(embed=128, ffn=256, heads=4, layers=4), "base": dict(embed=512, ffn=2048, heads=8, layers=6)}
INTERACTIVE_BATCHING = ["--buffer-size", "1000", "--max-tokens", "12000"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True, help="source-language text to draw the corpus from")
    p.add_argument("--lines", type=int, default=100000)
    p.add_argument("--lowercase", action="store_true",
                   help="lowercase the corpus, for a model trained on lowercased text (Multi30k's tok/): "
                        "cased words would reach it as many rare subwords")
    p.add_argument("--data", required=True, help="the trained model's data-bin")
    p.add_argument("--path", required=True, help="the trained fairseq transformer checkpoint")
    p.add_argument("--bpe-codes", required=True)
    p.add_argument("--bpe-vocabulary", required=True)
    p.add_argument("--source-lang", required=True)
    p.add_argument("--target-lang", required=True)
    p.add_argument("--random", nargs="*", default=[], choices=sorted(DIMS),
                   help="also these dims with random weights")
    p.add_argument("--random-length", type=int, default=30, help="every output's tokens, random weights")
    p.add_argument("--random-lines", type=int, nargs="*", default=[],
                   help="lines of the corpus for each --random dims (default: --lines)")
    p.add_argument("--random-only", action="store_true", help="leave the trained model out (its "
                   "checkpoint still gives the dictionaries and options)")
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    p.add_argument("--systems", nargs="*", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--lines-of", action="append", default=[], metavar="SYSTEM=N")
    p.add_argument("--kill", action="store_true", help="measure a SIGKILL half-way and the resume")
    p.add_argument("--work-dir", default=None)
    p.add_argument("--markdown")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.random_only and not args.random:
        p.error("--random-only needs --random DIMS")
    return args


def log(message):
    print(f"[benchmark_corpus] {message}", file=sys.stderr, flush=True)


def make_corpus(text: str, lines: int, path: Path, seed: int = 1, lowercase: bool = False):
    """``lines`` lines of ``text``, repeated as needed, shuffled (and lowercased)."""
    text = Path(text).read_text(encoding="utf-8")
    pool = [line for line in (text.lower() if lowercase else text).splitlines() if line.strip()]
    rng = random.Random(seed)
    drawn = []
    while len(drawn) < lines:
        block = pool[:]
        rng.shuffle(block)
        drawn += block
    path.write_text("\n".join(drawn[:lines]) + "\n", encoding="utf-8")


def load(data: str, checkpoint: str):
    from fairseq import checkpoint_utils

    import fairseq_hardattn  # noqa: F401  (torch >= 2.6 reads fairseq checkpoints)
    from fairseq_hardattn import compat

    with compat.loading():
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint],
                                                                          arg_overrides={"data": data})
    return models[0], cfg, task


def random_checkpoint(trained_cfg, task, dims: str, path: Path):
    """A fairseq transformer with the trained model's dictionaries and
    options, at ``dims``, random weights."""
    import copy

    import torch
    from omegaconf import OmegaConf, open_dict

    cfg = copy.deepcopy(trained_cfg)
    d = DIMS[dims]
    sizes = {"embed_dim": d["embed"], "ffn_embed_dim": d["ffn"], "attention_heads": d["heads"],
             "layers": d["layers"], "output_dim": d["embed"], "input_dim": d["embed"]}
    with open_dict(cfg):  # (the model's options: a Namespace in checkpoints fairseq-train wrote)
        for side in ("encoder", "decoder"):
            for name, value in sizes.items():
                setattr(cfg.model, f"{side}_{name}", value)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    # a plain container, as fairseq-train saves it (torch loads checkpoints weights-only)
    torch.save({"cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(), "args": None,
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                       "lr_scheduler_state": {}, "num_updates": 0}],
                "extra_state": {}, "last_optimizer_state": None}, path)
    return model


def ct2_model(model, task, folder: Path) -> str:
    from hardattn_tools.ctranslate2_peer import convert

    folder.mkdir(parents=True, exist_ok=True)
    return convert(model, task.source_dictionary, str(folder))


CT2_RUN = r"""
import json, sys, time
args = json.loads(sys.argv[1])
import ctranslate2
from fairseq.data import encoders
import fairseq_hardattn  # noqa: F401  (the BPE it registers)
from argparse import Namespace
tokenizer = encoders.build_tokenizer(Namespace(tokenizer="moses", source_lang=args["src"], target_lang=args["tgt"],
                                               moses_no_dash_splits=False, moses_no_escape=False))
bpe = encoders.build_bpe(Namespace(bpe="subword_nmt_vocab", bpe_codes=args["codes"], bpe_vocabulary=args["vocab"]))
translator = ctranslate2.Translator(args["model"], device="cpu", compute_type="float32",
                                    inter_threads=args["inter"], intra_threads=args["intra"])
def source_tokens(line):
    return bpe.encode(tokenizer.encode(line.strip())).split()
def detokenized(tokens):
    return tokenizer.decode(bpe.decode(" ".join(tokens)))
translator.translate_file(args["input"], args["output"], max_batch_size=args["batch"], batch_type="examples",
                          source_tokenize_fn=source_tokens, target_detokenize_fn=detokenized, **args["options"])
"""


def fairseq_options(args, mode, length):
    options = list(MODES[mode]["fairseq"])
    if length:
        options += ["--min-len", str(length), "--max-len-a", "0", "--max-len-b", str(length)]
    return options


def text_options(args):
    return ["--source-lang", args.source_lang, "--target-lang", args.target_lang, "--tokenizer", "moses",
            "--bpe", "subword_nmt_vocab", "--bpe-codes", args.bpe_codes, "--bpe-vocabulary", args.bpe_vocabulary]


def command_of(system, args, checkpoint, ct2_dir, mode, length, source: Path, output: Path):
    """(argv, stdout file or None) of ``system``."""
    venv = Path(sys.executable).parent
    if system == "corpus":
        return ([sys.executable, "-m", "fairseq_hardattn", "translate", args.data, "--path", str(checkpoint),
                 *text_options(args), *fairseq_options(args, mode, length), "--input", str(source),
                 "--output", str(output), "--overwrite", "--no-progress-bar"], None)
    if system.startswith("interactive"):
        engine = "fairseq" if system == "interactive-fairseq" else "auto"
        return ([str(venv / "fairseq-interactive"), args.data, "--user-dir", str(REPO / "fairseq_hardattn"),
                 "--path", str(checkpoint), *text_options(args), *fairseq_options(args, mode, length),
                 *INTERACTIVE_BATCHING, "--input", str(source),
                 "--model-overrides", f"{{'decoding_engine': '{engine}'}}"], output)
    cores = os.cpu_count()
    # (CTranslate2 counts the tokens it returns: with a length, exactly that many and no EOS)
    options = dict(MODES[mode]["ct2"], max_decoding_length=length or 201)
    if length:
        options["min_decoding_length"] = length
    setting = dict(model=ct2_dir, inter=cores if system == "ct2-inter" else 1,
                   intra=1 if system == "ct2-inter" else cores, batch=32, input=str(source), output=str(output),
                   src=args.source_lang, tgt=args.target_lang, codes=args.bpe_codes, vocab=args.bpe_vocabulary,
                   options=options)
    return [sys.executable, "-c", CT2_RUN, json.dumps(setting)], None


def run(argv, stdout_path, progress=lambda: None, kill_after=None):
    """(wall seconds, peak MB, memory samples, exit code) of one run."""
    from hardattn_tools.process_memory import MemorySampler

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    stdout = open(stdout_path, "w") if stdout_path else subprocess.DEVNULL
    began = time.monotonic()
    process = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)
    sampler = MemorySampler(process.pid, 2.0, progress)
    sampler.start()
    try:
        _, error = process.communicate(timeout=kill_after)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        _, error = process.communicate()
    wall = time.monotonic() - began
    sampler.stop()
    if stdout_path:
        stdout.close()
    if process.returncode != 0 and kill_after is None:
        raise SystemExit(f"benchmark_corpus: {' '.join(argv[:4])} ... failed:\n{error[-3000:]}")
    return wall, sampler.peak_mb(), sampler.samples, process.returncode


def interactive_texts(path: Path):
    """fairseq-interactive's D lines in input order."""
    found = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("D-"):
            head, _, text = line.split("\t", 2)
            found[int(head[2:])] = text
    return [found[i] for i in range(len(found))]


def growth_after(samples, lines=10000):
    """The memory's growth after ``lines`` were done: its largest sample since,
    over its largest while the lines done first counted ``lines`` or more
    (``research/corpus_memory.py``'s reading: within a buffer the memory moves
    with the batches, and one sample may fall where the workers hold least)."""
    after = [(done, mb) for _, mb, done in samples if done is not None and done >= lines]
    if len(after) < 2:
        return None
    base = max(mb for done, mb in after if done == after[0][0])
    return max(mb for _, mb in after) / base - 1


def main(argv=None):
    args = parse_args(argv)
    from hardattn_tools.scratch import scratch_folder

    work = scratch_folder("corpus-bench-", keep=args.work_dir)
    caps = {k: int(v) for k, v in (item.split("=", 1) for item in args.lines_of)}
    model, cfg, task = load(args.data, args.path)
    with_ct2 = any(system.startswith("ct2") for system in args.systems)

    def converted(weights, name):  # CTranslate2's copy, where a system needs it
        return ct2_model(weights, task, work / f"ct2-{name}") if with_ct2 else None

    models = [] if args.random_only else [("trained", args.path, converted(model, "trained"), 0, args.lines)]
    for i, dims in enumerate(args.random):
        checkpoint = work / f"random-{dims}.pt"
        random_model = random_checkpoint(cfg, task, dims, checkpoint)
        lines = args.random_lines[i] if i < len(args.random_lines) else args.lines
        models.append((f"random {dims}", checkpoint, converted(random_model, dims), args.random_length, lines))
    corpus_lines = max(m[4] for m in models)
    full = work / "corpus.src"
    make_corpus(args.text, corpus_lines, full, lowercase=args.lowercase)
    log(f"corpus: {corpus_lines:,} lines from {args.text}")
    record = {"settings": vars(args), "cores": os.cpu_count(), "runs": []}
    for name, checkpoint, ct2_dir, length, model_lines in models:
        for mode in args.modes:
            texts = {}
            for system in args.systems:
                lines = min(model_lines, caps.get(system, model_lines))
                source = work / f"corpus-{lines}.src"
                if not source.exists():
                    source.write_text("".join(full.read_text(encoding="utf-8").splitlines(True)[:lines]),
                                      encoding="utf-8")
                output = work / f"{name.replace(' ', '-')}-{mode}-{system}.out"
                argv, stdout_path = command_of(system, args, checkpoint, ct2_dir, mode, length, source, output)
                parts = output.with_name(output.name + ".parts")
                buffer_lines = 5000  # the corpus command's default --buffer-size

                def done_lines():
                    return len(list(parts.glob("chunk-*"))) * buffer_lines if system == "corpus" else None

                log(f"{name}, {mode}: {system} on {lines:,} lines")
                wall, peak, samples, _ = run(argv, stdout_path, done_lines)
                rate = lines / wall
                entry = dict(model=name, mode=mode, system=system, lines=lines, seconds=round(wall, 2),
                             lines_per_s=round(rate, 1), peak_mb=round(peak))
                if system == "corpus":
                    entry["growth_after_10000"] = growth_after(samples)
                    texts[system] = output.read_text(encoding="utf-8").splitlines()
                elif system.startswith("interactive"):
                    texts[system] = interactive_texts(output)
                else:
                    texts[system] = output.read_text(encoding="utf-8").splitlines()
                record["runs"].append(entry)
                log(f"  {rate:.1f} lines/s, peak {peak:.0f} MB")
            if "corpus" in texts:
                for other in ("interactive-fairseq", "interactive-engine", "ct2-inter", "ct2-intra"):
                    if other in texts:
                        n = len(texts[other])
                        same = sum(a == b for a, b in zip(texts["corpus"][:n], texts[other]))
                        record["runs"].append(dict(model=name, mode=mode, same_lines=[other, same, n]))
            if args.kill and "corpus" in args.systems and mode == args.modes[0] and name == "trained":
                uninterrupted = next(r for r in record["runs"] if r.get("system") == "corpus" and
                                     r["model"] == name and r["mode"] == mode)
                lines = min(model_lines, caps.get("corpus", model_lines))
                source = work / f"corpus-{lines}.src"
                output = work / "killed.out"
                argv, _ = command_of("corpus", args, checkpoint, ct2_dir, mode, length, source, output)
                first, _, _, _ = run(argv, None, kill_after=uninterrupted["seconds"] / 2)
                resumed_argv = [a for a in argv if a != "--overwrite"]
                second, _, _, _ = run(resumed_argv, None)
                same = output.read_bytes() == (work / f"trained-{mode}-corpus.out").read_bytes()
                record["kill"] = dict(killed_after=round(first, 1), resumed=round(second, 1),
                                      lost=round(first + second - uninterrupted["seconds"], 1), same_output=same)
                log(f"kill half-way: {record['kill']}")
    write_tables(args, record)


def write_tables(args, record):
    from hardattn_tools.reporting import write_outputs

    runs = [r for r in record["runs"] if "system" in r]
    lines = [f"Cores: {record['cores']}. Corpus: lines drawn from {args.text}; lines/s of whole runs "
             f"(start, loading, reading, writing).", "",
             "| model | mode | system | lines | lines/s | vs CTranslate2's best | vs fairseq-interactive (fairseq's generator) | peak MB |",
             "|---|---|---|---|---|---|---|---|"]
    def ratio(x, y):
        return f"{x / y:.2f}x" if y else "—"

    for r in runs:
        peers = [p for p in runs if p["model"] == r["model"] and p["mode"] == r["mode"]]
        ct2 = max((p["lines_per_s"] for p in peers if p["system"].startswith("ct2")), default=None)
        fairseq = next((p["lines_per_s"] for p in peers if p["system"] == "interactive-fairseq"), None)
        lines.append(f"| {r['model']} | {r['mode']} | {r['system']} | {r['lines']:,} | {r['lines_per_s']} | "
                     f"{ratio(r['lines_per_s'], ct2)} | {ratio(r['lines_per_s'], fairseq)} | {r['peak_mb']} |")
    lines.append("")
    for r in record["runs"]:
        if "same_lines" in r:
            other, same, n = r["same_lines"]
            lines.append(f"- {r['model']}, {r['mode']}: the corpus command's output equals {other}'s on "
                         f"{same:,} of {n:,} lines")
        elif r.get("system") == "corpus" and r.get("growth_after_10000") is not None:
            lines.append(f"- {r['model']}, {r['mode']}: the corpus command's memory grew "
                         f"{100 * r['growth_after_10000']:.1f}% after its first 10,000 lines")
    if "kill" in record:
        k = record["kill"]
        lines.append(f"- SIGKILL half-way ({k['killed_after']} s) and the same command again ({k['resumed']} s): "
                     f"{k['lost']} s lost; the output byte for byte the uninterrupted one's: {k['same_output']}")
    write_outputs(record, "\n".join(lines), args.json, args.markdown)


if __name__ == "__main__":
    main()
