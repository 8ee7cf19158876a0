#!/usr/bin/env python
"""The main job (``make demo``): soft vs hard retrieval attention end to end.

With no data given, it writes a deterministic synthetic translation task in
which attention matters (word-by-word translation with phrase reversal, see
hardattn_tools/synthetic.py), then, through fairseq's own command-line
tools with ``--user-dir fairseq_hardattn``:

1. fairseq-preprocess the data;
2. fairseq-train the soft baseline (``transformer_soft_prenorm_h8_small``)
   and hard retrieval with its soft-to-hard curriculum
   (``transformer_hard_dec_anneal_small``), with identical settings;
3. fairseq-generate the test set with each (beam 4; the plugin's engine)
   and score it with sacreBLEU;
4. time decoding side by side in one process (same batches, interleaved
   repetitions, median), each model with fairseq's generator and with the
   plugin's engine, and print a table: arch, BLEU, sentences/s with each,
   the engine's speedup; then what the numbers mean.

Usage: scripts/demo.py [--work-dir demo_work] [--data RAW_DIR] [--epochs N]
RAW_DIR holds {train,valid,test}.{src,tgt}, one sentence per line.
"""

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USER_DIR = REPO / "fairseq_hardattn"
BIN = Path(sys.executable).parent

MODELS = [  # (label, --arch): the soft baseline first (8 decoder heads, as the curriculum's)
    ("soft baseline", "transformer_soft_prenorm_h8_small"),
    ("hard retrieval", "transformer_hard_dec_anneal_small"),
]
# step 4 times each model with fairseq's generator and with the plugin's engine
ENGINES = ("fairseq", "auto")
# the synthetic task: sentences of 2 to 12 tokens (longer ones cost the demo
# minutes, not BLEU), an epoch of 111 updates of 1,024 tokens; the curriculum
# preset goes from soft to hard over the first half of the training
MAX_LEN = 12
UPDATES_PER_EPOCH = 111


# in-process fairseq (the timing step) would log every dataset and model load
logging.basicConfig(level=logging.WARNING)
logging.getLogger("fairseq").setLevel(logging.WARNING)
warnings.filterwarnings("ignore")


def log(message):
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def tool(name):
    exe = BIN / name
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "fairseq_cli." + name.split("-", 1)[1]]


def run(cmd, log_path, show=None):
    """Run a command, keep its full output in ``log_path``, echo matching lines."""
    run_together([(cmd, log_path, show, "")], threads=None)


def run_together(jobs, threads):
    """Run (cmd, log_path, show, prefix) jobs at once, each with ``threads``
    threads (None: inherit), echoing their matching lines with the prefix.
    Two one-thread trainings on 2 cores get ~1.7x the throughput of two
    two-thread trainings one after the other."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))

    def follow(proc, log_path, show, prefix):
        with open(log_path, "w") as log_file:
            for line in proc.stdout:
                log_file.write(line)
                if show and re.search(show, line):
                    print(f"    {prefix}" + line.split("| INFO |")[-1].strip(), flush=True)

    running = []
    for cmd, log_path, show, prefix in jobs:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        reader = threading.Thread(target=follow, args=(proc, log_path, show, prefix))
        reader.start()
        running.append((proc, reader, cmd, log_path))
    for proc, reader, _, _ in running:
        proc.wait()
        reader.join()
    failed = [(cmd, log_path) for proc, _, cmd, log_path in running if proc.returncode != 0]
    if failed:
        cmd, log_path = failed[0]
        sys.exit(f"demo: {Path(cmd[0]).name} failed; see {log_path}")


def prepare_data(args, work):
    raw = work / "raw"
    if args.data:
        raw = Path(args.data)
        for split in ("train", "valid", "test"):
            for side in ("src", "tgt"):
                if not (raw / f"{split}.{side}").is_file():
                    sys.exit(f"demo: {raw}/{split}.{side} is missing")
        log(f"using the data in {raw}")
    else:
        from hardattn_tools import synthetic

        synthetic.write_task("reorder", str(raw), sizes=(12000, 300, 500), seed=1, max_len=MAX_LEN)
        log(f"wrote the synthetic reordering task to {raw} (12000/300/500 sentence pairs)")
    data_bin = work / "data-bin"
    if data_bin.exists():
        shutil.rmtree(data_bin)
    run(tool("fairseq-preprocess") + [
        "--source-lang", "src", "--target-lang", "tgt", "--joined-dictionary",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", data_bin, "--workers", 1,
    ], work / "preprocess.log")
    return raw, data_bin


def train_command(args, work, data_bin, arch):
    save_dir = work / "checkpoints" / arch
    if save_dir.exists():
        shutil.rmtree(save_dir)
    save_dir.mkdir(parents=True)
    cmd = tool("fairseq-train") + [
        data_bin, "--user-dir", USER_DIR, "--arch", arch, "--cpu", "--seed", 1,
        "--share-all-embeddings", "--dropout", 0.1,
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--clip-norm", 1.0,
        "--lr", 2e-3, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 200,
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
        "--max-tokens", 1024, "--max-epoch", args.epochs, "--num-workers", 0,
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-last-checkpoints",
        "--no-progress-bar", "--log-format", "simple", "--log-interval", 1000,
    ]
    if "anneal" in arch:
        cmd += ["--hard-anneal-updates", UPDATES_PER_EPOCH * args.epochs // 2]
    return cmd, save_dir.with_suffix(".train.log"), save_dir / "checkpoint_best.pt"


def translate(work, data_bin, checkpoint, raw, arch):
    from hardattn_tools.scoring import read_hypotheses, sacre_bleu

    gen_path = work / f"{arch}.test.gen"
    run(tool("fairseq-generate") + [
        data_bin, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
        "--beam", 4, "--batch-size", 64,
    ], gen_path)
    hyps = read_hypotheses(gen_path.read_text())
    bleu, signature = sacre_bleu(hyps, str(raw / "test.tgt"), detok_lang=None)
    return bleu, signature


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default=str(REPO / "demo_work"))
    parser.add_argument("--data", help="raw data folder (default: the synthetic task)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5, help="timing repetitions")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()

    log("step 1/4: data")
    raw, data_bin = prepare_data(args, work)
    checkpoints, scores, jobs = {}, {}, []
    at_once = max(1, min(args.threads, len(MODELS)))
    threads_each = max(1, args.threads // at_once)
    for label, arch in MODELS:
        cmd, log_path, checkpoints[arch] = train_command(args, work, data_bin, arch)
        jobs.append((cmd, log_path, r"\| valid \| epoch", f"{arch}: "))
    log(f"step 2/4: fairseq-train {', '.join(arch for _, arch in MODELS)}, {args.epochs} epochs, "
        f"identical settings ({at_once} at a time, {threads_each} thread(s) each)")
    for start in range(0, len(jobs), at_once):
        run_together(jobs[start:start + at_once], threads=threads_each)
    for label, arch in MODELS:
        log(f"step 3/4: fairseq-generate {arch} (beam 4)")
        scores[arch] = translate(work, data_bin, checkpoints[arch], raw, arch)
        log(f"    sacreBLEU {scores[arch][0]:.2f}")

    log(f"step 4/4: decoding speed, fairseq's generator and the plugin's engine side by side "
        f"({args.reps} interleaved repetitions)")
    speeds(args, data_bin, checkpoints, scores, started, work)


def speeds(args, data_bin, checkpoints, scores, started, work):
    """Step 4: each model decoded with fairseq's generator and the plugin's
    engine, timed side by side; the table and what it means."""
    import torch
    from hardattn_tools import fixtures, timing

    torch.set_num_threads(args.threads)
    task = fixtures.setup_translation_task(str(data_bin))
    specs = [fixtures.ModelSpec(name=f"{arch}/{engine}", checkpoint=str(checkpoints[arch]),
                                overrides={"decoding_engine": engine})
             for _, arch in MODELS for engine in ENGINES]
    models = fixtures.load_models(specs, task)
    batches = fixtures.test_batches(task, "test", batch_size=64)
    timings = timing.benchmark_decoding(
        models, task.target_dictionary, batches, beam=4, reps=args.reps, warmup=1,
        progress=lambda m: log("    " + m))
    rate = {name: t.rate(t.sentences, timing.median) for name, t in timings.items()}

    soft, hard = (arch for _, arch in MODELS)
    print()
    print(f"{'arch':<36} {'sacreBLEU':>9} {'sent/s, fairseq':>16} {'sent/s, engine':>15} "
          f"{'engine speedup':>15}")
    for _, arch in MODELS:
        fairseqs, ours = rate[f"{arch}/fairseq"], rate[f"{arch}/auto"]
        print(f"{arch:<36} {scores[arch][0]:>9.2f} {fairseqs:>16.1f} {ours:>15.1f} {ours / fairseqs:>14.2f}x")
    gap = scores[hard][0] - scores[soft][0]
    speedups = [rate[f"{arch}/auto"] / rate[f"{arch}/fairseq"] for _, arch in MODELS]
    print(f"\nsacreBLEU signature: {scores[soft][1]}")
    print(f"test set: {timings[specs[0].name].sentences} sentences, beam 4, batch 64, {args.threads} "
          f"thread(s), median of {args.reps}; total time {(time.time() - started) / 60:.1f} min; "
          f"logs in {work}")
    print(f"\nWhat it means: hard retrieval ({hard}) is {gap:+.2f} sacreBLEU from soft attention "
          f"trained alike on this task; the plugin's engine decodes {min(speedups):.1f}-"
          f"{max(speedups):.1f}x as fast as fairseq's generator, the same translations; hard "
          f"decodes {rate[f'{hard}/auto'] / rate[f'{soft}/auto']:.2f}x soft on the engine (these "
          "sentences are short: attention is a small part of a step; see results/decoding_engine.md).")


if __name__ == "__main__":
    main()
