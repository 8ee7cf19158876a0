#!/usr/bin/env python
"""Does torch.compile pay for a CPU decoding step? The plugin's search with
its eager step (the default on a CPU: lineage decoding, the C kernels)
against the same search stepping through the static engine's layers
compiled by inductor (``torch.compile(fixed_shape_step.layers_step)``): the
compile time (the first pass, cold and from inductor's cache) and the
steady-state speed, one model, random weights, fixed output lengths.

Usage: research/compile_step_cost.py [--arch transformer_soft] [--dims small]
       [--sentences 256] [--batch 64] [--src-len 30] [--reps 3] [--markdown OUT.md]
"""

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

from fairseq_hardattn.decoding import fixed_shape_step  # noqa: E402
from fairseq_hardattn.models.attention_kind_base import SMALL_DIMS  # noqa: E402
from hardattn_tools.fixtures import (DictionaryTask, load_models, make_generator,  # noqa: E402
                                             parse_model_specs, prepare_for_decoding, random_batches,
                                             synthetic_dictionary)
from hardattn_tools.reporting import write_outputs  # noqa: E402
from hardattn_tools.timing import decode  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="transformer_soft")
    p.add_argument("--dims", choices=("preset", "small"), default="small")
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--markdown")
    args = p.parse_args()
    torch.set_num_threads(1)
    d = synthetic_dictionary(10000)
    model = load_models(parse_model_specs(None, [f"m={args.arch}"], None), DictionaryTask(d),
                        arch_overrides=SMALL_DIMS if args.dims == "small" else None)["m"]
    generator = make_generator(prepare_for_decoding(model, 4), d, 4, args.src_len)
    batches = random_batches(d, args.sentences, args.src_len, args.batch)

    def timed():
        start = time.perf_counter()
        decode(generator, batches)
        return time.perf_counter() - start

    timed()
    eager = min(timed() for _ in range(args.reps))
    model.decoder.decoding_engine = "static"  # fixed shapes: one compiled graph per capacity
    eager_static = min(timed() for _ in range(args.reps))
    fixed_shape_step.layers_step = torch.compile(fixed_shape_step.layers_step, dynamic=False)
    first = timed()  # compiles (inductor's cache may hold earlier compilations)
    compiled = min(timed() for _ in range(args.reps))
    rows = [("the search, eager step (the default)", eager), ("the search, static step, eager", eager_static),
            ("the search, static step compiled (steady state)", compiled)]
    lines = [f"{args.arch}, {args.dims} dims, {args.sentences} sentences x {args.src_len} tokens, batch "
             f"{args.batch}, beam 4, 1 thread, torch {torch.__version__}", "",
             "| step | sent/s | vs eager |", "|---|---|---|"]
    lines += [f"| {what} | {args.sentences / seconds:.1f} | {eager / seconds:.2f}x |" for what, seconds in rows]
    saving = (eager - compiled) / args.sentences  # seconds per sentence
    pays = (f"pays after {first / saving:.0f} sentences" if saving > 0
            else "never pays: the compiled step is not faster")
    lines += ["", f"first compiled pass (compiling included): {first:.1f} s, against {eager:.1f} s for "
                  f"the eager search to decode all {args.sentences} sentences: compiling {pays}"]
    write_outputs(None, "\n".join(lines), markdown_path=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
