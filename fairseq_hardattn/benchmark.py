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
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils, options, tasks
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from .errors import ConfigError


@dataclass
class ModelSpec:
    name: str
    checkpoint: Optional[str] = None
    arch: Optional[str] = None
    overrides: Dict = field(default_factory=dict)


@dataclass
class Timing:
    seconds: List[float]
    sentences: int
    tokens: int

    def rate(self, amount, how):
        return amount / how(self.seconds)

    def summary(self, unit_count, prefix):
        return {
            f"{prefix}_median": round(self.rate(unit_count, statistics.median), 2),
            f"{prefix}_min": round(self.rate(unit_count, max), 2),
            f"{prefix}_max": round(self.rate(unit_count, min), 2),
        }


def parse_model_specs(model_args, arch_args, override_args) -> List[ModelSpec]:
    specs = []
    for text, key in [(t, "checkpoint") for t in model_args or []] + [
        (t, "arch") for t in arch_args or []
    ]:
        name, sep, value = text.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"expected NAME=VALUE, got {text!r}")
        if any(s.name == name for s in specs):
            raise ConfigError(f"model name {name!r} given twice")
        specs.append(ModelSpec(name=name, **{key: value}))
    for text in override_args or []:
        name, sep, value = text.partition("=")
        spec = next((s for s in specs if s.name == name), None)
        if spec is None:
            raise ConfigError(f"--override names unknown model {name!r}")
        try:
            spec.overrides = dict(eval(value, {"__builtins__": {}}))
        except Exception:
            raise ConfigError(f"--override {name}: not a Python dict: {value!r}") from None
    if not specs:
        raise ConfigError("give at least one --model NAME=CHECKPOINT or --arch NAME=ARCH")
    return specs


def setup_translation_task(data_dir: str):
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [data_dir, "--task", "translation", "--cpu"])
    return tasks.setup_task(args)


def load_models(specs: List[ModelSpec], task, arch_overrides=None):
    """name -> model in float32 on CPU, built from a checkpoint or an arch."""
    models = {}
    for spec in specs:
        torch.manual_seed(0)
        if spec.checkpoint:
            if not os.path.exists(spec.checkpoint):
                raise ConfigError(f"checkpoint not found: {spec.checkpoint}")
            loaded, _ = checkpoint_utils.load_model_ensemble(
                [spec.checkpoint], arg_overrides=spec.overrides or None, task=task
            )
            model = loaded[0]
        else:
            if spec.arch not in ARCH_MODEL_REGISTRY:
                raise ConfigError(f"unknown architecture {spec.arch!r}")
            args = argparse.Namespace(arch=spec.arch, **(arch_overrides or {}))
            for key, value in spec.overrides.items():
                setattr(args, key, value)
            ARCH_CONFIG_REGISTRY[spec.arch](args)
            model = ARCH_MODEL_REGISTRY[spec.arch].build_model(args, task)
        models[spec.name] = model.float()
    return models


def test_batches(task, subset, batch_size, max_sentences=None, max_positions=(1024, 1024)):
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    iterator = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size, max_positions=max_positions,
        ignore_invalid_inputs=True, seed=1,
    ).next_epoch_itr(shuffle=False)
    batches, count = [], 0
    for sample in iterator:
        if max_sentences is not None and count >= max_sentences:
            break
        if max_sentences is not None and count + sample["nsentences"] > max_sentences:
            keep = max_sentences - count
            sample = {
                "id": sample["id"][:keep],
                "nsentences": keep,
                "net_input": {k: v[:keep] for k, v in sample["net_input"].items()},
                "target": None if sample["target"] is None else sample["target"][:keep],
            }
        batches.append(sample)
        count += sample["nsentences"]
    return batches


def random_batches(dictionary, num_sentences, src_len, batch_size, seed=1):
    """Sources of exactly ``src_len`` tokens (the last one EOS), in batches."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for start in range(0, num_sentences, batch_size):
        n = min(batch_size, num_sentences - start)
        src = torch.randint(dictionary.nspecial, len(dictionary), (n, src_len), generator=g)
        src[:, -1] = dictionary.eos()
        batches.append({
            "id": torch.arange(start, start + n),
            "nsentences": n,
            "net_input": {"src_tokens": src, "src_lengths": torch.full((n,), src_len)},
            "target": None,
        })
    return batches


def make_generator(model, dictionary, beam, fixed_output_len=None, max_len_b=200):
    if fixed_output_len:
        # EOS is blocked until min_len and forced at max_len: same work for all
        return SequenceGenerator([model], dictionary, beam_size=beam,
                                 min_len=fixed_output_len, max_len_a=0,
                                 max_len_b=fixed_output_len)
    return SequenceGenerator([model], dictionary, beam_size=beam, max_len_b=max_len_b)


def prepare_for_decoding(model, beam):
    """What fairseq-generate does to a model before decoding."""
    model.eval()
    model.make_generation_fast_(beamable_mm_beam_size=beam, need_attn=False)
    return model


@torch.no_grad()
def decode(generator, batches):
    tokens = 0
    for sample in batches:
        hyps = generator.generate(None, sample)
        tokens += sum(len(h[0]["tokens"]) for h in hyps)
    return tokens


@torch.no_grad()
def translate(generator, batches, dictionary, bpe_symbol="subword_nmt"):
    """Best hypothesis of every sentence, BPE removed, in data-set order."""
    by_id = {}
    for sample in batches:
        for sentence_id, hyps in zip(sample["id"].tolist(), generator.generate(None, sample)):
            by_id[sentence_id] = dictionary.string(hyps[0]["tokens"].int(), bpe_symbol)
    return [by_id[i] for i in sorted(by_id)]


def train_pass(model, batches):
    """Forward + backward of a training step (no optimizer: identical for all)."""
    tokens = 0
    for sample in batches:
        logits, _ = model(**sample["net_input"])
        target = sample["target"]
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1),
                               ignore_index=model.decoder.padding_idx, reduction="sum")
        loss.backward()
        model.zero_grad(set_to_none=True)
        tokens += int(target.ne(model.decoder.padding_idx).sum())
    return tokens


def interleaved(run_fns: Dict[str, callable], reps: int, warmup: int, progress=None):
    """name -> list of seconds; each repetition runs every function once, rotated."""
    names = list(run_fns)
    for _ in range(warmup):
        for name in names:
            run_fns[name]()
    seconds = {name: [] for name in names}
    results = {}
    for rep in range(reps):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            start = time.perf_counter()
            results[name] = run_fns[name]()
            seconds[name].append(time.perf_counter() - start)
        if progress:
            progress(f"repetition {rep + 1}/{reps}: " + ", ".join(
                f"{n} {seconds[n][-1]:.2f}s" for n in names))
    return seconds, results


def benchmark_decoding(models, dictionary, batches, beam, reps, warmup,
                       fixed_output_len=None, progress=None):
    generators = {
        name: make_generator(prepare_for_decoding(model, beam), dictionary, beam, fixed_output_len)
        for name, model in models.items()
    }
    sentences = sum(b["nsentences"] for b in batches)
    seconds, tokens = interleaved(
        {name: (lambda g=g: decode(g, batches)) for name, g in generators.items()},
        reps, warmup, progress,
    )
    return {name: Timing(seconds[name], sentences, tokens[name]) for name in models}


def profile_sublayers(models, dictionary, batches, beam, fixed_output_len=None):
    """One extra decoding pass per model with hooks on its attention sublayers
    (kept out of the timed repetitions): name -> {sublayer: share of the pass}."""
    from .profiling import timed_sublayers

    shares = {}
    for name, model in models.items():
        generator = make_generator(model, dictionary, beam, fixed_output_len)
        with timed_sublayers(model) as timer:
            start = time.perf_counter()
            decode(generator, batches)
            total = time.perf_counter() - start
        shares[name] = {kind: seconds / total for kind, seconds in sorted(timer.seconds.items())}
    return shares


def benchmark_training(models, batches, reps, warmup, progress=None):
    runs = {}
    for name, model in models.items():
        model.train()
        runs[name] = lambda m=model: train_pass(m, batches)
    seconds, tokens = interleaved(runs, reps, warmup, progress)
    return {name: Timing(seconds[name], 0, tokens[name]) for name in models}


def report(decode_timings, train_timings, baseline, param_counts, settings, shares=None):
    rows = []
    limit = None
    if shares and decode_timings:
        # the baseline's speed if its decoder attention cost nothing
        base = decode_timings[baseline]
        base_rate = base.rate(base.sentences, statistics.median)
        decoder_share = sum(v for k, v in shares[baseline].items() if k.startswith("decoder"))
        limit = base_rate / max(1e-9, 1 - decoder_share)
    base_decode = statistics.median(decode_timings[baseline].seconds) if decode_timings else None
    base_train = statistics.median(train_timings[baseline].seconds) if train_timings else None
    for name in param_counts:
        row = {"model": name, "params": param_counts[name]}
        if decode_timings:
            t = decode_timings[name]
            row.update(t.summary(t.sentences, "sentences_per_s"))
            row.update(t.summary(t.tokens, "tokens_per_s"))
            row["generated_tokens"] = t.tokens
            row["decode_speedup"] = round(base_decode / statistics.median(t.seconds), 3)
            if limit:
                row["attention_share"] = {k: round(v, 4) for k, v in shares[name].items()}
                row["pct_of_attention_free_limit"] = round(
                    100 * t.rate(t.sentences, statistics.median) / limit, 1)
        if train_timings:
            t = train_timings[name]
            row.update(t.summary(t.tokens, "train_target_tokens_per_s"))
            row["train_speed_ratio"] = round(base_train / statistics.median(t.seconds), 3)
        rows.append(row)
    result = {"settings": settings, "baseline": baseline, "results": rows}
    if limit:
        result["attention_free_limit_sentences_per_s"] = round(limit, 2)
    return result


def markdown_table(result):
    rows = result["results"]
    has_decode = "sentences_per_s_median" in rows[0]
    has_train = "train_target_tokens_per_s_median" in rows[0]
    header = ["model", "params"]
    if has_decode:
        header += ["sent/s (median [min, max])", "tok/s (median)", "decode speed vs " + result["baseline"]]
    has_share = "attention_share" in rows[0]
    if has_share:
        header += ["attention share of decoding", "% of attention-free limit"]
    if has_train:
        header += ["train tgt tok/s (median)", "train speed vs " + result["baseline"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["model"], f"{r['params']:,}"]
        if has_decode:
            cells += [
                f"{r['sentences_per_s_median']:.1f} [{r['sentences_per_s_min']:.1f}, {r['sentences_per_s_max']:.1f}]",
                f"{r['tokens_per_s_median']:.0f}",
                f"{r['decode_speedup']:.2f}x",
            ]
        if has_share:
            cells += [", ".join(f"{k.replace('-attention', '')} {100 * v:.0f}%"
                                for k, v in r["attention_share"].items()),
                      f"{r['pct_of_attention_free_limit']:.0f}%"]
        if has_train:
            cells += [f"{r['train_target_tokens_per_s_median']:.0f}", f"{r['train_speed_ratio']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: benchmark_decoding.py --data data-bin --model soft=soft.pt "
               "--model hard=hard.pt --beam 4 --batch-size 64 --reps 5",
    )
    p.add_argument("--data", help="fairseq data-bin (dictionary and test batches)")
    p.add_argument("--subset", default="test")
    p.add_argument("--model", action="append", metavar="NAME=CHECKPOINT")
    p.add_argument("--arch", action="append", metavar="NAME=ARCH",
                   help="an architecture with random weights (use --fixed-output-len)")
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
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
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


def synthetic_dictionary(size):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - d.nspecial):
        d.add_symbol(f"w{i}")
    return d


class _DictionaryTask:
    def __init__(self, d):
        self.source_dictionary = self.target_dictionary = d


def training_batches(task, count, max_tokens, dictionary, seed=1):
    if task is not None and not isinstance(task, _DictionaryTask):
        task.load_dataset("train")
        it = task.get_batch_iterator(dataset=task.dataset("train"), max_tokens=max_tokens,
                                     max_positions=(1024, 1024), ignore_invalid_inputs=True,
                                     seed=seed).next_epoch_itr(shuffle=False)
        return [b for _, b in zip(range(count), it)]
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        n, length = max(1, max_tokens // 24), 24
        src = torch.randint(dictionary.nspecial, len(dictionary), (n, length), generator=g)
        tgt = torch.randint(dictionary.nspecial, len(dictionary), (n, length), generator=g)
        prev = torch.cat([torch.full((n, 1), dictionary.eos()), tgt[:, :-1]], 1)
        batches.append({"net_input": {"src_tokens": src, "src_lengths": torch.full((n,), length),
                                      "prev_output_tokens": prev}, "target": tgt})
    return batches


def main(argv=None):
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    log = lambda msg: print(f"[benchmark] {msg}", file=sys.stderr, flush=True)
    try:
        specs = parse_model_specs(args.model, args.arch, args.override)
        if args.data:
            task = setup_translation_task(args.data)
        else:
            task = _DictionaryTask(synthetic_dictionary(args.vocab))
            if args.src_len is None:
                raise ConfigError("without --data, give --src-len for random sources")
        dictionary = task.target_dictionary
        baseline = args.baseline or specs[0].name
        if baseline not in {s.name for s in specs}:
            raise ConfigError(f"--baseline {baseline!r} is not one of the models")
        if args.src_len:
            batches = random_batches(dictionary, args.num_sentences, args.src_len, args.batch_size)
        else:
            batches = test_batches(task, args.subset, args.batch_size, args.max_sentences)
        log(f"{len(specs)} models, {sum(b['nsentences'] for b in batches)} sentences, "
            f"beam {args.beam}, batch {args.batch_size}, {args.threads} thread(s)")
        models = load_models(specs, task)
    except (ConfigError, FileNotFoundError) as err:
        print(f"benchmark: error: {err}", file=sys.stderr)
        return 2
    params = {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()}

    train_timings = None
    if args.train_batches:
        log(f"training throughput on {args.train_batches} batches")
        train_models = {n: copy.deepcopy(m) for n, m in models.items()}
        train_timings = benchmark_training(
            train_models, training_batches(task, args.train_batches, args.train_max_tokens, dictionary),
            args.reps, args.warmup, log)
    log("decoding")
    decode_timings = benchmark_decoding(models, dictionary, batches, args.beam, args.reps,
                                        args.warmup, args.fixed_output_len, log)
    shares = None
    if args.sublayer_times:
        log("attention sublayer shares (one profiled pass per model)")
        shares = profile_sublayers(models, dictionary, batches, args.beam, args.fixed_output_len)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "markdown")}
    settings["torch"] = torch.__version__
    settings["sentences"] = sum(b["nsentences"] for b in batches)
    result = report(decode_timings, train_timings, baseline, params, settings, shares)
    table = markdown_table(result)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
