#!/usr/bin/env python
"""The Multi30k experiments, declared once, one study per module of
``studies/`` (architectures: every architecture's run, the main table;
hard_parity, cross_self_parity, conversion, beam_settings and parity_targets:
the ablation toward hard/soft parity; flexible; topk; speed: the benchmarks).
This module gathers them: the runs trained from scratch, the fine-tunings
that continue them, the decoding variants of trained runs, the benchmarks,
and the rows and labels of the results tables. ``scripts/results.sh`` and
``examples/multi30k/run.sh`` read it through this command line;
``scripts/results_table.py`` imports it.

Usage: experiments.py runs | finetunes | decodes      (tab-separated lines; - for none)
       experiments.py benchmarks | gpu-benchmarks      (their names)
       experiments.py benchmark NAME WORK_DIR          (its arguments, one per line)
       experiments.py retired                         (runs kept for their records: name, commit)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the studies, however this file is loaded

from studies import (architectures, beam_settings, conversion, cross_self_parity, flexible,  # noqa: E402
                     hard_parity, speed, topk)
from studies.architectures import HEADLINE_PEERS, HEADLINE_SPEED, HEADLINES, RUNS, TABLE_EXTRA_ROWS  # noqa: E402,F401
from studies.beam_settings import SEARCH_GRID, SEARCH_PAIRS  # noqa: E402,F401
from studies.flexible import CPS_ROWS  # noqa: E402,F401
from studies.manifest import searched_with  # noqa: E402,F401
from studies.parity_targets import PARITY_PAIRS, PARITY_TARGETS  # noqa: E402,F401
from studies.speed import (ENGINE_BENCHMARKS, GPU_BENCHMARKS, TABLE_BASE_SPEED_BENCHMARKS,  # noqa: E402,F401
                           TABLE_GPU_BENCHMARK, TABLE_SPEED_BENCHMARKS)

# every run trained from scratch, and with its fine-tunings every trained run
FROM_SCRATCH = RUNS + hard_parity.RUNS + cross_self_parity.RUNS + topk.RUNS
FINETUNES = flexible.FINETUNES + conversion.FINETUNES
TRAINED = FROM_SCRATCH + FINETUNES
DECODES = (architectures.DECODES + hard_parity.DECODES + conversion.DECODES + flexible.DECODES
           + beam_settings.DECODES + topk.DECODES + speed.DECODES)
# every CPU benchmark scripts/results.sh runs (after all training), and what each output shows
# (speed.OUTPUTS describes speed.py's own benchmarks; these the other studies' and speed.py's GENERATE_TRAINED)
_SELF_DESCRIBED = (speed.GENERATE_TRAINED,) + topk.BENCHMARKS + (architectures.HEADLINE_SPEED,
                                                                 architectures.HEADLINE_SPEED_CORES)
BENCHMARKS = speed.BENCHMARKS + ENGINE_BENCHMARKS + _SELF_DESCRIBED
OUTPUTS = {**speed.OUTPUTS, **{b.name: b.what for b in _SELF_DESCRIBED}}


def decodes_by_name():
    return {decode.name: decode for decode in DECODES}


def benchmark_models(benchmark, work_dir):
    """--model NAME=CHECKPOINT (and --override NAME=DICT) for each model of
    ``benchmark`` whose run is trained in ``work_dir``."""
    decodes = decodes_by_name()
    args = []
    for name in benchmark.models:
        decode = decodes.get(name)
        run = decode.run if decode else name
        checkpoint = Path(work_dir) / "runs" / run / "checkpoint_avg.pt"
        if not checkpoint.is_file():
            continue
        args += ["--model", f"{name}={checkpoint}"]
        if decode and decode.overrides:
            args += ["--override", f"{name}={decode.overrides!r}"]
    return args


def main(argv):
    command = argv[0] if argv else ""
    if command == "runs":
        lines = [f"{r.name}\t{r.arch}\t{r.corpus or '-'}\t{r.flags}" for r in FROM_SCRATCH if not r.retired]
    elif command == "finetunes":
        lines = [f"{f.name}\t{f.start}\t{f.arch}\t{f.epochs}\t{f.average}\t{f.warmup}\t"
                 f"{f.lr:g}\t{f.teacher or '-'}\t{f.corpus or '-'}\t{f.flags}" for f in FINETUNES
                 if not f.retired]
    elif command == "retired":
        lines = [f"{r.name}\t{r.retired}" for r in TRAINED if r.retired]
    elif command == "decodes":
        retired = {r.name for r in TRAINED if r.retired}
        lines = [f"{d.name}\t{d.run}\t{d.model_overrides()!r}\t{d.search or '-'}" for d in DECODES
                 if d.run not in retired]
    elif command == "benchmarks":
        lines = [b.name for b in BENCHMARKS]
    elif command == "gpu-benchmarks":
        lines = [b.name for b in GPU_BENCHMARKS]
    elif command == "benchmark" and len(argv) == 3:
        # one argument per line: the benchmark's models, its data, its settings
        benchmark = next((b for b in BENCHMARKS + GPU_BENCHMARKS if b.name == argv[1]), None)
        if benchmark is None:
            sys.exit(f"experiments.py: no benchmark {argv[1]!r}")
        lines = benchmark_models(benchmark, argv[2]) + benchmark.args.split()
        if benchmark.data:
            lines += ["--data", str(Path(argv[2]) / "data-bin")]
    else:
        sys.exit(__doc__.split("\n\n")[1])
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
