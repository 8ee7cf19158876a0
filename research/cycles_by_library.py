#!/usr/bin/env python
"""Where each system's CPU time goes, by kind of code: the plugin's search
and CTranslate2 on the same weights and sentences, one thread, each in a
process of its own under Linux ``perf record`` (999 samples a second,
recording only while the system decodes: perf's control FIFO), the samples
summed by what ran them (``CATEGORIES``) and given in seconds a decode.

The model, sentences and options are research/real_data_peer.py's (its
checkpoint, ``--subset``, ``--batch-size``, ``--beam``, ``--sampling-topk``;
CTranslate2 translates the same source tokens in batches of the same size).
Needs ``perf`` (Linux) allowed to sample user code (perf_event_paranoid at
most 2), and CTranslate2 unless ``--systems engine``.

Example (the trained de->en model of results/corpus.md, sampled):
  research/cycles_by_library.py --data work/deen/data-bin --path work/deen/checkpoints/checkpoint_best.pt
      --subset test --batch-size 128 --beam 1 --sampling-topk 10 --rounds 5
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "research"))
import real_data_peer  # noqa: E402
from hardattn_tools.provenance import write_json  # noqa: E402

# (category, test on a perf sample's shared object and symbol), the first that holds
CATEGORIES = (
    ("matrix products: generated code (oneDNN's JIT)", lambda dso, sym: dso.startswith("[JIT]")),
    ("matrix products: library code (MKL, oneDNN)", lambda dso, sym: re.search(r"gemm|gemv|dnnl|mkl_", sym)),
    ("the plugin's native kernels", lambda dso, sym: dso.startswith("_native-")),
    ("Python's interpreter", lambda dso, sym: dso.startswith("libpython")),
    ("PyTorch's Python bindings", lambda dso, sym: dso.startswith("libtorch_python")),
    ("PyTorch's operators and dispatch", lambda dso, sym: re.match(r"lib(torch|c10)", dso)),
    ("CTranslate2's operators", lambda dso, sym: dso.startswith("libctranslate2")),
    ("C library (copies, allocation, maths)", lambda dso, sym: re.match(r"(libc|libm|ld-linux|libstdc)", dso)),
    ("the operating system", lambda dso, sym: dso.startswith("[kernel")),
)
OTHER = "other"
SYSTEMS = ("engine", "ctranslate2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    real_data_peer.add_decoding_args(p)
    p.add_argument("--rounds", type=int, default=5, help="decodes of the whole set recorded, per system")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--setting", help=argparse.SUPPRESS)  # a child's: the CTranslate2 model, sources, FIFOs
    return p.parse_args(argv)


def categorize(report: str):
    """({category: its share of the samples}, the samples) of ``perf report
    -n --sort dso,sym --stdio -g none`` output (the samples counted, not
    the percentages, which are rounded)."""
    counts = {}
    for line in report.splitlines():
        match = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S.*?)\s+\[[.kgu]\]\s+(.*)$", line)
        if match is None:
            continue
        dso, symbol = match.group(2), match.group(3)
        category = next((name for name, test in CATEGORIES if test(dso, symbol)), OTHER)
        counts[category] = counts.get(category, 0) + int(match.group(1))
    samples = sum(counts.values())
    return {name: count / max(samples, 1) for name, count in counts.items()}, samples


def recording(control: str, acknowledged: str, command: str):
    """Tell the perf recording this process runs under to ``command``
    ("enable" or "disable"), and wait until it has."""
    with open(control, "w") as fifo:
        fifo.write(command + "\n")
    with open(acknowledged) as fifo:
        fifo.readline()


def child(args):
    """One system's decodes, recorded: a warm-up first, then ``--rounds``
    decodes of every batch between "enable" and "disable"; prints their
    seconds and the sentences a decode."""
    setting = json.loads(args.setting)
    if args.child == "engine":
        task, models, generator, batches = real_data_peer.load(args)
        generator.generate(models, batches[0])
        sentences = sum(len(batch["id"]) for batch in batches)

        def decode():
            for batch in batches:
                generator.generate(models, batch)
    else:
        import ctranslate2

        translator = ctranslate2.Translator(setting["model"], device="cpu", compute_type="float32",
                                            inter_threads=1, intra_threads=1)
        sources = json.loads(Path(setting["sources"]).read_text())
        options = real_data_peer.ctranslate2_options(args)
        translator.translate_batch(sources[:args.batch_size], **options)
        sentences = len(sources)

        def decode():
            translator.translate_batch(sources, max_batch_size=args.batch_size, **options)
    seconds = []
    recording(setting["control"], setting["acknowledged"], "enable")
    for _ in range(args.rounds):
        start = time.perf_counter()
        decode()
        seconds.append(time.perf_counter() - start)
    recording(setting["control"], setting["acknowledged"], "disable")
    print(json.dumps(dict(seconds=seconds, sentences=sentences)), flush=True)


def record(system: str, args, folder: Path, setting: dict):
    """``system``'s decodes under perf: (their seconds, the sentences a decode,
    {category: share}, the samples)."""
    control, acknowledged = folder / f"{system}.control", folder / f"{system}.ack"
    for fifo in (control, acknowledged):
        os.mkfifo(fifo)
    data = folder / f"{system}.perf"
    setting = dict(setting, control=str(control), acknowledged=str(acknowledged))
    command = ["perf", "record", "-F", "999", "-D", "-1", "--control", f"fifo:{control},{acknowledged}",
               "-o", str(data), "--", sys.executable, str(Path(__file__).resolve()), *child_argv(args),
               "--child", system, "--setting", json.dumps(setting)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"cycles_by_library: {system} under perf failed: {run.stderr.strip()[-1500:]}")
    decoded = next(json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))
    report = subprocess.run(["perf", "report", "-i", str(data), "-n", "--no-children", "--sort", "dso,sym",
                             "--stdio", "-g", "none"], capture_output=True, text=True, check=True).stdout
    return (decoded["seconds"], decoded["sentences"], *categorize(report))


def child_argv(args):
    """The options a child is given: the model, the sentences and the search's."""
    argv = ["--data", args.data, "--path", args.path, "--subset", args.subset, "--batch-size",
            str(args.batch_size), "--beam", str(args.beam), "--sampling-topk", str(args.sampling_topk),
            "--max-len", str(args.max_len), "--rounds", str(args.rounds)]
    return argv + (["--batches", str(args.batches)] if args.batches else [])


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child(args)
    if shutil.which("perf") is None:
        raise SystemExit("cycles_by_library: error: Linux perf is not installed (it records where the time goes)")
    figures = {}
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        setting = {}
        if "ctranslate2" in args.systems:  # (its model converted, its sources written, from the checkpoint)
            from hardattn_tools.ctranslate2_peer import convert

            task, models, _, batches = real_data_peer.load(args)
            (folder / "sources.json").write_text(json.dumps(
                real_data_peer.ctranslate2_sources(task.source_dictionary, batches)))
            setting = dict(sources=str(folder / "sources.json"),
                           model=convert(models[0], task.source_dictionary, work))
        for system in SYSTEMS:
            if system in args.systems:
                seconds, sentences, shares, samples = record(system, args, folder, setting)
                figures[system] = dict(seconds=seconds, sentences=sentences, shares=shares, samples=samples)
    print_table(figures)
    if args.json:
        write_json(args.json, figures)


def print_table(figures):
    """Seconds a decode of the set by category, the systems side by side."""
    mean = {system: sum(f["seconds"]) / len(f["seconds"]) for system, f in figures.items()}
    sentences = next(iter(figures.values()))["sentences"]
    print(f"{sentences} sentences a decode; seconds a decode: the mean of the recorded decodes times "
          "each category's share of the samples")
    print(f"{'':48s}" + "".join(f"{system:>13s}" for system in figures))
    for name in [name for name, _ in CATEGORIES] + [OTHER]:
        cells = [figures[system]["shares"].get(name, 0.0) * mean[system] for system in figures]
        if any(cells):
            print(f"{name:48s}" + "".join(f"{cell:13.3f}" for cell in cells))
    print(f"{'whole decode':48s}" + "".join(f"{mean[system]:13.3f}" for system in figures))


if __name__ == "__main__":
    main()
