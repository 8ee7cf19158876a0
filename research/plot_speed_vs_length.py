#!/usr/bin/env python
"""Decoding speed against source length for several architectures, side by
side: for each source length, random sources of exactly that length, every
model decodes the same batches (interleaved repetitions, median) generating
--output-len tokens (or as many as the source with --output-len 0).

Example: research/plot_speed_vs_length.py --arch soft=transformer --arch hard=transformer_hard_dec \
           --lengths 10 25 50 100 200 --out speed_vs_length.png --json speed_vs_length.json
"""

import argparse
import logging
import sys
import warnings

warnings.filterwarnings("ignore")
logging.getLogger("fairseq").setLevel(logging.WARNING)

import torch  # noqa: E402

from hardattn_tools import fixtures, timing  # noqa: E402
from hardattn_tools.plotting import pyplot, save_line_plot  # noqa: E402
from hardattn_tools.reporting import write_outputs  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", action="append", required=True, metavar="NAME=ARCH")
    p.add_argument("--override", action="append", metavar="NAME=DICT")
    p.add_argument("--lengths", type=int, nargs="+", default=[10, 25, 50, 100, 200])
    p.add_argument("--output-len", type=int, default=20, help="0: as long as the source")
    p.add_argument("--num-sentences", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True, help="PNG path")
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = fixtures.DictionaryTask(fixtures.synthetic_dictionary(args.vocab))
    specs = fixtures.parse_model_specs(None, args.arch, args.override)
    rates = {s.name: [] for s in specs}
    for length in args.lengths:
        # flexible attention's auto threshold uses the mean source length
        models = fixtures.load_models(specs, task, arch_overrides={
            "flexible_mean_source_length": float(length), "max_source_positions": 4096,
            "max_target_positions": 4096})
        batches = fixtures.random_batches(task.target_dictionary, args.num_sentences, length,
                                           args.batch_size)
        timings = timing.benchmark_decoding(
            models, task.target_dictionary, batches, args.beam, args.reps, warmup=1,
            fixed_output_len=args.output_len or length)
        for name, t in timings.items():
            rates[name].append(round(t.rate(t.sentences, timing.median), 2))
        print(f"[speed_vs_length] source length {length}: " + ", ".join(
            f"{n} {r[-1]:.1f} sent/s" for n, r in rates.items()), file=sys.stderr, flush=True)

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in rates.items():
        ax.plot(args.lengths, values, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xticks(args.lengths, [str(n) for n in args.lengths])
    ax.set_xlabel("source length (tokens)")
    ax.set_ylabel("sentences / s")
    ax.set_title(f"decoding speed, beam {args.beam}, {args.output_len or 'source-length'} output tokens")
    save_line_plot(fig, ax, args.out)
    write_outputs({"settings": vars(args), "lengths": args.lengths, "sentences_per_s": rates},
                  "", args.json, echo=False)


if __name__ == "__main__":
    main()
