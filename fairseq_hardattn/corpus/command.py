"""``python -m fairseq_hardattn translate DATA_BIN --path CKPT --input FILE
--output FILE`` with fairseq-interactive's options: a text file of any size
translated line by line into another (see docs/corpus.md).

The input is read in chunks of ``--buffer-size`` lines; each chunk's lines
are encoded as fairseq-interactive encodes them (``--tokenizer``, ``--bpe``),
sorted by length into ``--max-tokens`` batches and decoded by fairseq's
generator for the options, which is the plugin's engine where it runs them
(its workers reading the batches ahead, across chunks). A chunk's
translations are committed as a whole (``parts``); a command killed and
run again continues with the chunks not committed. Under a launcher
(``lines.launcher_rank``), or as shard ``--shard-id`` of ``--num-shards``
(a job array, machines started by hand), each rank decodes every rank-th
chunk. fairseq's options that this command does not read are refused
(``UNREAD``) and left out of its ``--help``.
"""

import argparse
import ast
import contextlib
import hashlib
import itertools
import logging
import math
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from ..errors import ConfigError, cased_input_warning
from . import lines as input_lines
from .parts import Parts

logger = logging.getLogger("fairseq_hardattn.corpus")

DEFAULT_BUFFER_LINES = 5000
DEFAULT_MAX_TOKENS = 12000  # fairseq-generate's
SHORTEST_LINE_TOKENS = 2  # a line of one word and its end of sentence
# fairseq-interactive's options that print what this command does not write
NOT_WRITTEN = (("nbest", lambda v: v > 1, "--nbest above 1 (it writes one translation per line)"),
               ("print_alignment", bool, "--print-alignment (it writes translations only)"),
               ("constraints", bool, "--constraints"),
               ("prefix_size", lambda v: v > 0, "--prefix-size"),
               ("score_reference", bool, "--score-reference"),
               ("print_step", bool, "--print-step"),
               ("retain_iter_history", bool, "--retain-iter-history"))
# fairseq's option groups (by title) and options that this command does not
# read, with what to do instead: each is refused when given (fairseq-interactive
# would ignore it), and kept out of --help
_RANKS_INSTEAD = ("the ranks come from torchrun (RANK, WORLD_SIZE), SLURM (SLURM_PROCID, SLURM_NTASKS) "
                  "or --num-shards and --shard-id")
UNREAD_GROUPS = {
    "distributed_training": _RANKS_INSTEAD,
    "checkpoint": "it reads checkpoints only (--path, --checkpoint-suffix, --checkpoint-shard-count)",
    "dataset_data_loading": "it reads --input and batches it by --max-tokens and --batch-size",
}
READ_IN_UNREAD_GROUPS = ("checkpoint_suffix", "checkpoint_shard_count", "max_tokens", "batch_size",
                         "skip_invalid_size_inputs_valid_test", "num_shards", "shard_id")
UNREAD = {
    "results_path": "the translations go to --output",
    **dict.fromkeys(("sacrebleu", "scoring"), "there is no reference to score"),
    **dict.fromkeys(("lm_path", "lm_weight"), "fairseq-interactive has no language model fusion"),
    **dict.fromkeys(("decoding_format", "iter_decode_eos_penalty", "iter_decode_max_iter",
                     "iter_decode_force_max_iter", "iter_decode_with_beam", "iter_decode_with_external_reranker"),
                    "options of fairseq's iterative refinement models"),
    **dict.fromkeys(("beam_mt", "lenpen_mt", "max_len_a_mt", "max_len_b_mt"),
                    "options of fairseq's speech-to-speech models"),
    "log_format": "it logs plain lines (LOGLEVEL sets their level)",
    "log_interval": "it reports progress every --progress-seconds",
    "log_file": "it logs to standard error",
    "tpu": "it decodes on a CPU or a CUDA GPU",
    **dict.fromkeys(("criterion", "optimizer", "lr_scheduler", "fp16_no_flatten_grads", "fp16_init_scale",
                     "fp16_scale_window", "fp16_scale_tolerance", "on_cpu_convert_precision", "min_loss_scale",
                     "threshold_loss_scale", "amp", "amp_batch_retries", "amp_init_scale", "amp_scale_window",
                     "memory_efficient_bf16", "memory_efficient_fp16", "empty_cache_freq", "all_gather_list_size",
                     "profile", "reset_logging", "suppress_crashes", "aim_repo", "aim_run_hash",
                     "tensorboard_logdir", "wandb_project", "azureml_logging", "use_plasma_view", "plasma_path"),
                    "a training option"),
}


def build_parser():
    from fairseq import options

    parser = options.get_interactive_generation_parser(default_task="translation")
    parser.prog = "python -m fairseq_hardattn translate"
    parser.description = ("Translate a text file line by line into another, resumable, on every core or "
                          "under a launcher's ranks; fairseq-interactive's options (docs/corpus.md).")
    group = parser.add_argument_group("corpus")
    group.add_argument("--output", metavar="FILE", help="the translations, one line per input line")
    group.add_argument("--overwrite", action="store_true",
                       help="replace an output, or the parts of another command, left in --output's place")
    group.add_argument("--merge", action="store_true",
                       help="assemble --output from the parts every rank has committed (normally the "
                            "last rank to finish does it); nothing is decoded")
    group.add_argument("--progress-seconds", type=float, default=30.0, metavar="S",
                       help="without a terminal (or with --no-progress-bar), a progress line every S seconds")
    for action in unread_actions(parser):
        action.help = argparse.SUPPRESS
    helps = {"input": "the text to translate, one sentence per line: a file (the command resumes from "
                      "the parts it committed, so standard input is not read)",
             "path": "the checkpoint(s) to translate with (required)",
             "quiet": "no progress bar or progress lines",
             "num_shards": "split the input's buffers into N shards, each decoded by its own command "
                           "(--shard-id): machines started by hand, a job array",
             "shard_id": "the shard this command decodes; the last shard to finish writes --output"}
    for action in parser._actions:
        action.help = helps.get(action.dest, action.help)
    return parser


def unread_actions(parser) -> Dict[argparse.Action, str]:
    """The parser's actions of options this command does not read, each with
    what to do instead."""
    found = {}
    for group in parser._action_groups:
        instead = UNREAD_GROUPS.get(group.title)
        for action in group._group_actions:
            if instead is not None and action.dest not in READ_IN_UNREAD_GROUPS:
                found[action] = instead
            elif action.dest in UNREAD:
                found[action] = UNREAD[action.dest]
    return found


def refuse_unread(parser, argv: List[str]):
    """A one-line error for the first option in ``argv`` that this command
    does not read (fairseq's parsers take no abbreviations)."""
    unread = {option: (action, instead) for action, instead in unread_actions(parser).items()
              for option in action.option_strings}
    for word in argv:
        if word == "--":
            break
        option = word.split("=", 1)[0]
        if option in unread:
            raise ConfigError(f"the corpus command does not read {option} ({unread[option][1]})")


def rank_and_world(args) -> Tuple[int, int, str]:
    """This process's share of the chunks (rank, ranks) and its progress
    label: shard --shard-id of --num-shards, else its launcher's rank."""
    from ..compat.batches import check_shard

    rank, world = input_lines.launcher_rank()
    shards, shard = args.num_shards, args.shard_id
    check_shard(shards, shard)
    if shards == 1:
        return rank, world, "translate" if world == 1 else f"translate, rank {rank} of {world}"
    if world > 1:
        raise ConfigError(f"--num-shards and a launcher's {world} ranks both split the input: use one")
    return shard, shards, f"translate, shard {shard} of {shards}"


def parse(argv):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = build_parser()
    refuse_unread(parser, argv)
    args = options.parse_args_and_arch(parser, input_args=argv)
    if not args.path:
        raise ConfigError("--path CHECKPOINT is required: the model to translate with")
    if not args.output:
        raise ConfigError("--output FILE is required: where the translations go")
    if args.input in (None, "-"):
        raise ConfigError("--input FILE is required: a file (standard input cannot be resumed)")
    if not os.path.isfile(args.input) or not os.access(args.input, os.R_OK):
        raise ConfigError(f"--input {args.input}: no such readable file")
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        raise ConfigError(f"--output {args.output}: the folder {folder} does not exist")
    for name, applies, what in NOT_WRITTEN:
        if applies(getattr(args, name, None) or 0):
            raise ConfigError(f"the corpus command does not take {what}")
    if args.buffer_size in (None, 0):
        args.buffer_size = DEFAULT_BUFFER_LINES
    if args.max_tokens is None and args.batch_size is None:
        args.max_tokens = DEFAULT_MAX_TOKENS
    if args.max_tokens is not None and args.max_tokens < SHORTEST_LINE_TOKENS:
        raise ConfigError(f"--max-tokens {args.max_tokens} fits no line (the shortest takes "
                          f"{SHORTEST_LINE_TOKENS} tokens: a word and the end of sentence)")
    return args, convert_namespace_to_omegaconf(args)


def file_identity(path: str) -> Dict:
    """A file's size and a digest of its first and last MiB: the same file
    (a copy, another mount) without reading all of it."""
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            digest.update(f.read())
    return {"size": size, "sha256_head_tail": digest.hexdigest()}


def command_identity(args, cfg) -> Dict:
    """What decides the output: the input and the checkpoints (by content),
    the data's dictionaries, the generation, tokenizer and BPE options, the
    model overrides that change translations, the batching, the seed."""
    from fairseq import utils
    from omegaconf import OmegaConf

    overrides = ast.literal_eval(cfg.common_eval.model_overrides)
    overrides.pop("decoding_workers", None)  # the same translations with any number
    return {
        "input": file_identity(args.input),
        "checkpoints": [file_identity(path) for path in utils.split_paths(cfg.common_eval.path)],
        "dictionaries": [file_identity(os.path.join(utils.split_paths(cfg.task.data)[0], name))
                         for name in sorted(os.listdir(utils.split_paths(cfg.task.data)[0]))
                         if name.startswith("dict.")],
        "languages": [cfg.task.source_lang, cfg.task.target_lang],
        "generation": OmegaConf.to_container(cfg.generation, resolve=True),
        "tokenizer": OmegaConf.to_container(cfg.tokenizer, resolve=True) if cfg.tokenizer else None,
        "bpe": OmegaConf.to_container(cfg.bpe, resolve=True) if cfg.bpe else None,
        "post_process": cfg.common_eval.post_process,
        "model_overrides": repr(sorted(overrides.items())),
        "shortlist": file_identity(overrides["shortlist"]) if overrides.get("shortlist") else None,
        "batching": [args.buffer_size, args.max_tokens, args.batch_size],
        "seed": cfg.common.seed,
    }


class Progress:
    """Lines done of this rank's share: tqdm on a terminal (lines, lines/s,
    time left), else a line every ``seconds``."""

    def __init__(self, total: int, done: int, seconds: float, bar: bool, label: str):
        self.total, self.done, self.seconds, self.label = total, done, seconds, label
        self.started, self.started_done, self.last = time.monotonic(), done, time.monotonic()
        self.bar = None
        if bar and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit=" lines", desc=label, dynamic_ncols=True,
                            smoothing=0.1)

    def update(self, lines: int):
        self.done += lines
        if self.bar is not None:
            self.bar.update(lines)
        elif time.monotonic() - self.last >= self.seconds:
            self.last = time.monotonic()
            print(f"fairseq-hardattn: {self.line()}", file=sys.stderr, flush=True)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = (self.done - self.started_done) / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = "" if math.isinf(left) else f", {time.strftime('%H:%M:%S', time.gmtime(left))} left"
        return f"{self.label}: {self.done:,} of {self.total:,} lines ({rate:.1f} lines/s{eta})"

    def logging(self):
        """Log records written above the bar on a terminal (else as they are)."""
        if self.bar is None:
            return contextlib.nullcontext()
        from tqdm.contrib.logging import logging_redirect_tqdm

        return logging_redirect_tqdm()

    def close(self):
        if self.bar is not None:
            self.bar.close()


class ChunkOutput:
    """One chunk's translations as they come (empty lines and lines too long
    for the model are empty already)."""

    def __init__(self, index: int, first: int, count: int):
        self.index, self.first = index, first
        self.texts: List[Optional[str]] = [None] * count
        self.remaining = count

    def fill(self, line: int, text: str):
        self.texts[line - self.first] = text
        self.remaining -= 1


class CorpusBatches:
    """The batches of the chunks to decode, in order, each sample's ``id``
    its line's index in the input; able to read ahead across chunks
    (``take_ahead``: the engine's workers decode the next batches while this
    process waits for one)."""

    def __init__(self, chunks, prepare):
        from ..decoding.read_ahead import note_yielded

        self._note_yielded = note_yielded
        self._chunks, self._prepare = chunks, prepare
        self._ahead = deque()
        self.opened: Dict[int, ChunkOutput] = {}  # the chunks read and not committed, by index

    def _read_chunk(self) -> bool:
        try:
            index, first, lines = next(self._chunks)
        except StopIteration:
            return False
        output, samples = self._prepare(index, first, lines)
        self.opened[index] = output
        self._ahead.extend(samples)
        return True

    def __iter__(self):
        return self

    def __next__(self):
        while not self._ahead:
            if not self._read_chunk():
                raise StopIteration
        sample = self._ahead.popleft()
        self._note_yielded(self, sample)
        return sample

    def take_ahead(self, n: int):
        while len(self._ahead) < n and self._read_chunk():
            pass
        return list(self._ahead)[:n]


class Translator:
    """The models, generator and text processing of a fairseq-interactive run."""

    def __init__(self, cfg):
        from fairseq import checkpoint_utils, tasks, utils

        self.cfg = cfg
        if cfg.common.seed is not None and not cfg.generation.no_seed_provided:
            utils.set_torch_seed(cfg.common.seed)
        self.use_cuda = torch.cuda.is_available() and not cfg.common.cpu
        self.task = task = tasks.setup_task(cfg.task)
        overrides = ast.literal_eval(cfg.common_eval.model_overrides)
        self.models, _ = checkpoint_utils.load_model_ensemble(
            utils.split_paths(cfg.common_eval.path), arg_overrides=overrides, task=task,
            suffix=cfg.checkpoint.checkpoint_suffix, strict=(cfg.checkpoint.checkpoint_shard_count == 1),
            num_shards=cfg.checkpoint.checkpoint_shard_count)
        for model in self.models:
            if cfg.common.fp16:
                model.half()
            if self.use_cuda:
                model.cuda()
            model.prepare_for_inference_(cfg)
        self.generator = task.build_generator(self.models, cfg.generation)
        self.tokenizer, self.bpe = task.build_tokenizer(cfg.tokenizer), task.build_bpe(cfg.bpe)
        self.align_dict = utils.load_align_dict(cfg.generation.replace_unk)
        self.max_positions = utils.resolve_max_positions(task.max_positions(),
                                                         *[m.max_positions() for m in self.models])
        from fairseq_cli.generate import get_symbols_to_strip_from_output

        self.strip = get_symbols_to_strip_from_output(self.generator)
        # read once: an option read through OmegaConf costs microseconds a line
        self.post_process = cfg.common_eval.post_process
        self.check_case = True  # (the first lines read, once)

    def encode(self, line: str) -> str:
        if self.tokenizer is not None:
            line = self.tokenizer.encode(line)
        return self.bpe.encode(line) if self.bpe is not None else line

    def decode(self, text: str) -> str:
        if self.bpe is not None:
            text = self.bpe.decode(text)
        return self.tokenizer.decode(text) if self.tokenizer is not None else text

    def source_limit(self) -> int:
        limit = self.max_positions[0] if isinstance(self.max_positions, (tuple, list)) else self.max_positions
        limit = limit if limit is not None else sys.maxsize
        max_tokens = self.cfg.dataset.max_tokens
        return min(limit, max_tokens) if max_tokens else limit

    def prepare(self, index: int, first: int, lines: List[str], path: str):
        """A chunk: its output (empty for empty lines and lines too long) and
        the batches of its other lines."""
        from fairseq.tasks import FairseqTask

        output = ChunkOutput(index, first, len(lines))
        kept = [i for i, line in enumerate(lines) if line]
        texts = [lines[i] for i in kept]
        if self.check_case and kept:
            self.check_case = False
            warning = cased_input_warning(self.task.source_dictionary, texts, first, path)
            if warning:
                print(f"fairseq-hardattn: warning: {warning}", file=sys.stderr, flush=True)
        tokens, lengths = self.task.get_interactive_tokens_and_lengths(texts, self.encode)
        limit, fitting = self.source_limit(), []
        for i, n in zip(kept, lengths):
            if n > limit:
                print(f"fairseq-hardattn: warning: {path} line {first + i + 1} has {n} tokens, more than "
                      f"the model takes ({limit}): its output line is empty", file=sys.stderr, flush=True)
            else:
                fitting.append(i)
        for i in set(range(len(lines))) - set(fitting):
            output.fill(first + i, "")
        if not fitting:
            return output, []
        position = {i: p for p, i in enumerate(kept)}
        dataset = self.task.build_dataset_for_inference([tokens[position[i]] for i in fitting],
                                                        [lengths[position[i]] for i in fitting])
        # the class's method: the engine reads ahead from CorpusBatches, across chunks
        batches = FairseqTask.get_batch_iterator(
            self.task, dataset=dataset, max_tokens=self.cfg.dataset.max_tokens,
            max_sentences=self.cfg.dataset.batch_size, max_positions=self.max_positions,
            disable_iterator_cache=True).next_epoch_itr(shuffle=False)
        line_of = torch.tensor([first + i for i in fitting])
        samples = []
        for sample in batches:
            sample["id"] = line_of[sample["id"]]
            samples.append(sample)
        return output, samples

    def texts(self, sample, translations) -> List[str]:
        from fairseq import utils

        found = []
        for row, hypotheses in enumerate(translations):
            source = ""
            if self.align_dict is not None:
                tokens = utils.strip_pad(sample["net_input"]["src_tokens"][row], self.task.target_dictionary.pad())
                source = self.task.source_dictionary.string(tokens, self.post_process)
            best = hypotheses[0]
            _, text, _ = utils.post_process_prediction(
                hypo_tokens=best["tokens"], src_str=source, alignment=best["alignment"],
                align_dict=self.align_dict, tgt_dict=self.task.target_dictionary,
                remove_bpe=self.post_process, extra_symbols_to_ignore=self.strip)
            found.append(self.decode(text).replace("\n", " "))
        return found

    def translate(self, sample):
        from fairseq import utils

        if self.use_cuda:
            sample = utils.move_to_cuda(sample)
        return self.task.inference_step(self.generator, self.models, sample)


def run(args, cfg):
    rank, world, label = rank_and_world(args)
    parts = Parts(Path(args.output))
    identity = command_identity(args, cfg)
    total = input_lines.count_lines(args.input)
    if not args.overwrite and parts.made_by(identity):
        print(f"fairseq-hardattn: {args.output} is complete (this command made it): nothing to do",
              file=sys.stderr, flush=True)
        return
    parts.check(identity, args.overwrite)
    chunk_lines = args.buffer_size
    chunks = -(-total // chunk_lines)
    mine = [index for index in range(chunks) if index % world == rank]
    # the models and the generator first: a command refused by their checks writes nothing
    translator = None
    if not args.merge and (args.overwrite or any(not parts.done(index) for index in mine)):
        translator = Translator(cfg)
    parts.start(identity, rank, args.overwrite)
    if args.merge:
        missing = parts.missing(chunks)
        if missing:
            raise ConfigError(f"--merge: {len(missing)} of {chunks} chunks are not done yet (the first: "
                              f"lines {missing[0] * chunk_lines + 1}-{min(total, (missing[0] + 1) * chunk_lines)}); "
                              f"run the command (or its ranks) again to finish them")
        parts.merge(chunks, force=True)
        print(f"fairseq-hardattn: wrote {args.output} ({total:,} lines)", file=sys.stderr, flush=True)
        return
    lines_of = [min(chunk_lines, total - index * chunk_lines) for index in mine]
    todo = {index for index in mine if not parts.done(index)}
    progress = Progress(sum(lines_of), sum(n for index, n in zip(mine, lines_of) if index not in todo),
                        math.inf if args.quiet else args.progress_seconds,
                        not (args.no_progress_bar or args.quiet), label)
    if todo:
        translator = translator or Translator(cfg)
        batches = CorpusBatches(input_lines.chunks(args.input, chunk_lines, todo.__contains__),
                                lambda index, first, lines: translator.prepare(index, first, lines, args.input))
        with progress.logging():
            for sample in itertools.chain(batches, [None]):  # (None: chunks with nothing to decode, read last)
                if sample is not None:
                    texts = translator.texts(sample, translator.translate(sample))
                    for line, text in zip(sample["id"].tolist(), texts):
                        batches.opened[line // chunk_lines].fill(line, text)
                for done in [chunk for chunk in batches.opened.values() if chunk.remaining == 0]:
                    parts.commit(done.index, done.texts)
                    del batches.opened[done.index]
                    progress.update(len(done.texts))
    progress.close()
    if parts.missing(chunks):
        print(f"fairseq-hardattn: {label}: done; {args.output} is assembled when the others are done "
              f"(by the last to finish, or by --merge)", file=sys.stderr, flush=True)
    elif parts.merge(chunks):
        print(f"fairseq-hardattn: wrote {args.output} ({total:,} lines)", file=sys.stderr, flush=True)


def main(argv=None):
    from .. import compat

    compat.install_for_command_line()  # one-line errors, signals, fairseq's fixes
    level = os.environ.get("LOGLEVEL", "INFO").upper()
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=level,
                        stream=sys.stderr)
    if level != "DEBUG":  # fairseq's lines about each buffer's batch iterator
        logging.getLogger("fairseq.tasks.fairseq_task").setLevel(logging.WARNING)
    args, cfg = parse(sys.argv[1:] if argv is None else argv)
    run(args, cfg)
