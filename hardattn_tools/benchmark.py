"""Side-by-side decoding and training speed of several models, in one process.

Every model decodes exactly the same batches with fairseq's own
``SequenceGenerator`` (as ``fairseq-generate`` does, after the same
``prepare_for_inference_``), interleaved: each repetition times every model
once, in a rotated order, after a warm-up pass, so that a change of machine
load hits all models alike. Reported: sentences/s and tokens/s (median, min,
max over repetitions) and the speed ratio to a baseline model.

Models are trained checkpoints (``--model NAME=PATH``) or architectures with
random weights (``--arch NAME=ARCH``); with random weights, use
``--fixed-output-len`` so every model generates the same number of tokens.

On several cores (``--threads N`` > 1, or ``--workers`` > 1) each system
decodes in a process of its own, one process per system and repetition
(torch's and CTranslate2's OpenMP runtimes in one process slow each other),
in the same rotated order: the plugin's models with ``--workers`` batches at
once (``auto``: as fairseq-generate decides), CTranslate2 in both of its
configurations.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch

from fairseq_hardattn.errors import ConfigError
from fairseq_hardattn.models.attention_kind_base import SMALL_DIMS
from fairseq_hardattn.models.decoding_options import ENGINES, check_workers
from .fixtures import (DTYPES, GENERATE_MAX_LEN, DictionaryTask, check_device, device_name, every_member, load_models,
                       parse_model_specs, random_batches, set_decoding_engine,
                       setup_translation_task, synthetic_dictionary, test_batches, to_device,
                       training_batches)
from . import ctranslate2_peer
from .reporting import markdown_table, report, write_outputs
from .timing import Timing, benchmark_decoding, benchmark_training, profile_sublayers


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: benchmark_decoding.py --data data-bin --model soft=soft.pt "
               "--model hard=hard.pt --beam 4 --batch-size 64 --reps 5",
    )
    p.add_argument("--data", help="fairseq data-bin (dictionary and test batches)")
    p.add_argument("--subset", default="test")
    p.add_argument("--model", action="append", metavar="NAME=CHECKPOINT",
                   help="a trained checkpoint; NAME=a.pt:b.pt an ensemble of them (as --path a.pt:b.pt)")
    p.add_argument("--arch", action="append", metavar="NAME=ARCH",
                   help="an architecture with random weights (use --fixed-output-len)")
    p.add_argument("--dims", choices=("preset", "small"), default="preset",
                   help="--arch models: each architecture's own dims, or the small preset's "
                        "(4+4 layers, d=128, FFN 256, 4 heads) for those that are not a _small "
                        "preset already (fairseq's transformer; a _small preset keeps its own, "
                        "e.g. 8 decoder heads)")
    p.add_argument("--override", action="append", metavar="NAME=DICT",
                   help="model overrides for one model, e.g. hard=\"{'dec_self_attn_kind': 'soft'}\"")
    p.add_argument("--baseline", help="model the ratios refer to (default: the first)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    p.add_argument("--max-sentences", type=int, help="use only the first N test sentences")
    p.add_argument("--vocab", type=int, default=10000, help="without --data: dictionary size")
    p.add_argument("--src-len", type=int, help="random sources of this length instead of --data's")
    p.add_argument("--num-sentences", type=int, default=256, help="with --src-len")
    p.add_argument("--fixed-output-len", type=int, help="generate exactly this many tokens")
    p.add_argument("--max-len-a", type=float,
                   help="as fairseq-generate's: outputs of at most a * source length + b tokens "
                        f"(default {GENERATE_MAX_LEN[0]:g})")
    p.add_argument("--max-len-b", type=int,
                   help=f"as fairseq-generate's (default {GENERATE_MAX_LEN[1]})")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=threads_arg, default=1,
                   help="threads of each system, or 'all': the cores this process may use (more "
                        "than one: each system in its own process)")
    p.add_argument("--workers", metavar="N",
                   help="the plugin's models: batches decoded at once (--decoding-workers: 'auto' "
                        "or N; default: each model's own, auto)")
    p.add_argument("--only", help=argparse.SUPPRESS)  # a child of the isolated runs: this system
    p.add_argument("--timings-json", help=argparse.SUPPRESS)  # where such a child writes its timings
    p.add_argument("--device", default="cpu", help="cpu or cuda (timed with CUDA synchronisation)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--decoding-engine", choices=ENGINES,
                   help="decoding engine of the plugin's models (default: each model's own)")
    ctranslate2_peer.add_args(p)
    p.add_argument("--train-batches", type=int, default=0,
                   help="also time forward+backward on this many training batches")
    p.add_argument("--train-max-tokens", type=int, default=4096)
    p.add_argument("--sublayer-times", action="store_true",
                   help="also profile the share of decoding time spent in each attention "
                        "sublayer (one extra, untimed pass per model), and the baseline's "
                        "attention-free limit")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--markdown", help="write the table here")
    return p


# this module, as the isolated runs' children run it (also when it runs as __main__)
MODULE = "hardattn_tools.benchmark"


def threads_arg(text: str) -> int:
    if text == "all":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return int(text)


def max_len_of(args):
    """fairseq-generate's (--max-len-a, --max-len-b) as given, else its defaults."""
    return tuple(default if given is None else given
                 for given, default in zip((args.max_len_a, args.max_len_b), GENERATE_MAX_LEN))


def isolated(args) -> bool:
    """Whether each system decodes in a process of its own."""
    return args.only is None and (args.threads > 1 or check_workers(args.workers) not in ("auto", 1))


def run_isolated(argv, systems, args, log):
    """name -> Timing: each repetition runs every system once, rotated, each
    in a fresh process (this script with ``--only``) after its warm-up."""
    seconds = {name: [] for name in systems}
    counts = {}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "timings.json")
        for rep in range(args.reps):
            order = systems[rep % len(systems):] + systems[:rep % len(systems)]
            for name in order:
                subprocess.run([sys.executable, "-m", MODULE, *argv, "--only", name, "--reps", "1",
                                "--timings-json", path], env=env, check=True, stdout=subprocess.DEVNULL)
                with open(path) as f:
                    timing = json.load(f)[name]
                seconds[name].append(timing["seconds"][0])
                counts[name] = (timing["sentences"], timing["tokens"])
            log(f"repetition {rep + 1}/{args.reps}: " + ", ".join(
                f"{n} {seconds[n][-1]:.2f}s" for n in systems))
    return {name: Timing(seconds[name], *counts[name]) for name in systems}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    log = lambda msg: print(f"[benchmark] {msg}", file=sys.stderr, flush=True)
    try:
        check_device(args.device)
        workers = None if args.workers is None else check_workers(args.workers)
        if isolated(args) and args.train_batches:
            raise ConfigError("--train-batches runs on one thread (--threads 1)")
        if args.fixed_output_len and (args.max_len_a is not None or args.max_len_b is not None):
            raise ConfigError("--fixed-output-len sets the output length: drop --max-len-a/--max-len-b")
        specs = parse_model_specs(args.model, args.arch, args.override)
        peer_names = ctranslate2_peer.peer_names(args.ctranslate2, args.threads)
        if args.only is not None:  # a child: the system asked for (a peer needs its source model)
            sources = {t.partition("=")[0]: t.partition("=")[2].partition(":")[0] for t in args.ctranslate2 or []}
            wanted = sources.get(args.only.removesuffix("_inter"), args.only)
            specs = [s for s in specs if s.name == wanted]
        if args.data:
            task = setup_translation_task(args.data)
        else:
            task = DictionaryTask(synthetic_dictionary(args.vocab))
            if args.src_len is None:
                raise ConfigError("without --data, give --src-len for random sources")
        dictionary = task.target_dictionary
        baseline = args.baseline or specs[0].name
        if args.only is None and baseline not in {s.name for s in specs}:
            raise ConfigError(f"--baseline {baseline!r} is not one of the models")
        if args.src_len:
            batches = random_batches(dictionary, args.num_sentences, args.src_len, args.batch_size)
        else:
            batches = test_batches(task, args.subset, args.batch_size, args.max_sentences)
        batches = [to_device(batch, args.device) for batch in batches]
        log(f"{len(specs)} models, {sum(b['nsentences'] for b in batches)} sentences, "
            f"beam {args.beam}, batch {args.batch_size}, {args.device} {args.dtype}, "
            f"{args.threads} thread(s)")
        models = load_models(specs, task, device=args.device, dtype=args.dtype,
                             arch_overrides=SMALL_DIMS if args.dims == "small" else None,
                             keep_small_presets=True)
        set_decoding_engine(models, args.decoding_engine)
        if workers is not None:
            for model in every_member(models):
                model.decoding_workers = workers
        peers = {}
        if args.ctranslate2 and not isolated(args) and (args.only is None or args.only in peer_names):
            peers = ctranslate2_peer.peers(args.ctranslate2, models, dictionary, batches, args.beam,
                                           args.fixed_output_len, args.threads, args.only)
    except (ConfigError, FileNotFoundError) as err:
        print(f"benchmark: error: {err}", file=sys.stderr)
        return 2
    if args.only is not None:
        decoded = {} if args.only in peers else models
        timings = benchmark_decoding(decoded, dictionary, batches, args.beam, args.reps, args.warmup,
                                     args.fixed_output_len, None, max_len_of(args), args.dtype, peers)
        with open(args.timings_json, "w") as f:
            json.dump({name: {"seconds": t.seconds, "sentences": t.sentences, "tokens": t.tokens}
                       for name, t in timings.items()}, f)
        return 0
    params = {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()}
    for text in args.ctranslate2 or []:  # a peer has its source model's parameters
        name, _, source = text.partition("=")
        for peer in ctranslate2_peer.peer_names([text], args.threads):
            params[peer] = params[source.partition(":")[0]]

    train_timings = None
    if args.train_batches:
        log(f"training throughput on {args.train_batches} batches")
        train_models = {n: copy.deepcopy(m) for n, m in models.items()}
        train_timings = benchmark_training(
            train_models, [to_device(batch, args.device) for batch in training_batches(
                task, args.train_batches, args.train_max_tokens, dictionary)],
            args.reps, args.warmup, log)
    log("decoding" + (f", each system in its own process on {args.threads} thread(s)"
                       if isolated(args) else ""))
    if isolated(args):
        decode_timings = run_isolated(argv, list(models) + peer_names, args, log)
    else:
        decode_timings = benchmark_decoding(models, dictionary, batches, args.beam, args.reps,
                                            args.warmup, args.fixed_output_len, log, max_len_of(args),
                                            args.dtype, peers)
    shares = None
    if args.sublayer_times:
        log("attention sublayer shares (one profiled pass per model, in this process: no workers)")
        for model in every_member(models):
            model.decoding_workers = 1
        shares = profile_sublayers(models, dictionary, batches, args.beam, args.fixed_output_len,
                                   max_len_of(args))
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "markdown", "only", "timings_json")}
    settings["torch"] = torch.__version__
    settings["device_name"] = device_name(args.device)
    settings["sentences"] = sum(b["nsentences"] for b in batches)
    result = report(decode_timings, train_timings, baseline, params, settings, shares)
    write_outputs(result, markdown_table(result), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
