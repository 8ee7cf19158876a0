"""fairseq's batches, in a fairseq command run with the plugin.

- The last batch of a data set: this fairseq build (ve-fairseq 0.12.3,
  upstream main of 2024-10) ends ``data_utils.batch_by_size`` with
  ``if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0: b = b[:-1]``, so with the
  default ``--required-batch-size-multiple 8`` the last batch is dropped
  whenever its size is not a multiple of 8: ``fairseq-generate`` translated and
  scored 96 of 100 test sentences, with no warning. fairseq 0.12.2 kept that
  batch; so does ``batch_by_size`` (the same batching minus the drop; call
  sites look the function up on the module at call time).
- fairseq-interactive's lines: a line longer than the model's source
  positions ended the whole run ("Size of sample #0 is invalid"), and an
  empty line was translated as a sentence; ``lines_kept_aligned`` names the
  long one and gives each an empty hypothesis, so that every input line has
  its output. Cased lines for a
  model that learned from lowercased text are named in one warning
  (``cased_input_named``). Its batches can
  be read ahead (a class the engine registers, ``register_read_ahead``), so that the plugin's search
  decodes the next ones in worker processes meanwhile.
- fairseq-generate's shards: it reads ``--num-shards`` / ``--shard-id`` and
  ignores them (every shard decoded the whole set), sharding by
  ``--distributed-world-size`` / ``--distributed-rank`` instead, which no
  launcher sets for it. ``shards_honoured`` decodes shard ``--shard-id`` of
  ``--num-shards``: every ``--num-shards``-th batch (fairseq's
  ``ShardedIterator``), ids kept, so that the shards' outputs together are
  the whole set's.
"""

import functools
import sys

import numpy
import torch
from fairseq.data import data_utils

from ..errors import cased_input_warning

_fairseq_batch_by_size = data_utils.batch_by_size


def batch_by_size(
    indices,
    num_tokens_fn,
    num_tokens_vec=None,
    max_tokens=None,
    max_sentences=None,
    required_batch_size_multiple=1,
    fixed_shapes=None,
):
    if fixed_shapes is not None or required_batch_size_multiple <= 1:
        return _fairseq_batch_by_size(
            indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
            required_batch_size_multiple, fixed_shapes,
        )
    from fairseq.data.data_utils_fast import batch_by_size_fn, batch_by_size_vec

    max_tokens = int(max_tokens) if max_tokens is not None else -1
    max_sentences = max_sentences if max_sentences is not None else -1
    if not isinstance(indices, numpy.ndarray):
        indices = numpy.fromiter(indices, dtype=numpy.int64, count=-1)
    if num_tokens_vec is None:
        return batch_by_size_fn(
            indices, num_tokens_fn, max_tokens, max_sentences,
            required_batch_size_multiple,
        )
    if not isinstance(num_tokens_vec, numpy.ndarray):
        num_tokens_vec = numpy.fromiter(num_tokens_vec, dtype=numpy.int64, count=-1)
    return batch_by_size_vec(
        indices, num_tokens_vec, max_tokens, max_sentences,
        required_batch_size_multiple,
    )


def _source_positions(max_positions):
    if isinstance(max_positions, (tuple, list)):
        return max_positions[0]
    return max_positions


def lines_kept_aligned(make_batches):
    """Wrap fairseq-interactive's ``make_batches``: one output per input line.
    A line longer than the model's source positions ended the whole run
    ("Size of sample #0 is invalid") and the lines after it were never
    translated; an empty line was translated as a sentence. Such a line is
    now named in one warning (a long one) and given an empty hypothesis, as
    the corpus command and the hub give it: its lines come last, in a batch
    of end-of-sentence sources that ``empty_hypotheses`` answers without a
    search; every other line is batched as fairseq batches it, its id kept."""
    lines_read = [0]  # across the calls of this run, for the line numbers

    @functools.wraps(make_batches)
    def batches(lines, cfg, task, max_positions, encode_fn):
        first_line, lines_read[0] = lines_read[0], lines_read[0] + len(lines)
        limit = _source_positions(max_positions)
        # (a line's length matters only against a limit: fairseq's make_batches encodes the lines again)
        lengths = ([0] * len(lines) if limit is None
                   else task.get_interactive_tokens_and_lengths(lines, encode_fn)[1])
        for i, n in enumerate(lengths):
            if lines[i] and limit is not None and n > limit:
                print(f"fairseq-hardattn: warning: input line {first_line + i + 1} has {n} tokens, more "
                      f"than the model's {limit} source positions: its hypothesis is empty",
                      file=sys.stderr, flush=True)
        kept = [i for i, n in enumerate(lengths) if lines[i] and (limit is None or n <= limit)]
        if len(kept) == len(lines):
            yield from make_batches(lines, cfg, task, max_positions, encode_fn)
            return
        ids = torch.tensor(kept, dtype=torch.long)
        if kept:
            for batch in make_batches([lines[i] for i in kept], cfg, task, max_positions, encode_fn):
                yield batch._replace(ids=ids[batch.ids])
        left_out = torch.tensor(sorted(set(range(len(lines))) - set(kept)), dtype=torch.long)
        eos = task.source_dictionary.eos()
        yield _batch_class()(
            ids=left_out, src_tokens=torch.full((len(left_out), 1), eos, dtype=torch.long),
            src_lengths=torch.ones(len(left_out), dtype=torch.long), constraints=None)

    return batches


def _batch_class():
    from fairseq_cli.interactive import Batch

    return Batch


def _only_end_of_sentence(sample, eos) -> bool:
    tokens = sample["net_input"]["src_tokens"]
    return tokens.size(1) == 1 and bool((tokens == eos).all())


def empty_hypotheses(inference_step):
    """Wrap ``FairseqTask.inference_step`` while fairseq-interactive runs: a
    batch whose every source is only the end of sentence (the lines
    ``lines_kept_aligned`` leaves out) gets one empty hypothesis a line."""

    @functools.wraps(inference_step)
    def step(self, generator, models, sample, *args, **kwargs):
        if not _only_end_of_sentence(sample, self.source_dictionary.eos()):
            return inference_step(self, generator, models, sample, *args, **kwargs)
        empty = torch.empty(0, dtype=torch.long)
        return [[{"tokens": empty, "score": 0.0, "attention": None, "alignment": [],
                  "positional_scores": torch.empty(0)}]
                for _ in range(sample["net_input"]["src_tokens"].size(0))]

    return step


def cased_input_named(make_batches):
    """Wrap fairseq-interactive's ``make_batches``: where the model learned
    from lowercased text and the first lines read are mostly cased, one
    warning says so (``errors.cased_input_warning``); they are translated
    as given."""
    checked, lines_read = [False], [0]  # across the calls of this run

    @functools.wraps(make_batches)
    def batches(lines, cfg, task, max_positions, encode_fn):
        first_line, lines_read[0] = lines_read[0], lines_read[0] + len(lines)
        if not checked[0] and any(line.strip() for line in lines):
            checked[0] = True
            source = cfg.interactive.input
            warning = cased_input_warning(task.source_dictionary, lines, first_line,
                                          "the standard input" if source == "-" else source)
            if warning:
                print(f"fairseq-hardattn: warning: {warning}", file=sys.stderr, flush=True)
        yield from make_batches(lines, cfg, task, max_positions, encode_fn)

    return batches


# fairseq-interactive's batches as the plugin's engine reads them ahead: a
# class the engine registers when it is imported (``register_read_ahead``);
# until then the batches are fairseq's
_read_ahead_batches = None


def register_read_ahead(batches_class):
    """``batches_class(batches, first_line)`` wraps fairseq-interactive's
    batches of the lines from ``first_line`` on, so that they can be read ahead."""
    global _read_ahead_batches
    _read_ahead_batches = batches_class


def read_ahead(make_batches):
    """fairseq-interactive's batches, able to read ahead (``workers``)."""

    lines_read = [0]  # across the calls of this run: the batches' line numbers

    @functools.wraps(make_batches)
    def batches(lines, *args, **kwargs):
        first_line, lines_read[0] = lines_read[0], lines_read[0] + len(lines)
        made = make_batches(lines, *args, **kwargs)
        return made if _read_ahead_batches is None else _read_ahead_batches(made, first_line)

    return batches


def check_shard(shards: int, shard: int):
    """A one-line error unless ``--shard-id`` ``shard`` is one of ``--num-shards`` ``shards``."""
    from ..errors import ConfigError

    if shards < 1 or not 0 <= shard < shards:
        raise ConfigError(f"--shard-id must be at least 0 and below --num-shards ({shards}), got {shard}")


def shards_honoured(generate_main):
    """Wrap fairseq-generate's ``_main(cfg, output_file)``: its batches are
    shard ``--shard-id`` of ``--num-shards``."""

    @functools.wraps(generate_main)
    def main(cfg, output_file):
        from omegaconf import open_dict

        from ..errors import ConfigError

        shards, shard = cfg.dataset.num_shards, cfg.dataset.shard_id
        check_shard(shards, shard)
        if shards > 1:
            if cfg.distributed_training.distributed_rank != 0:
                raise ConfigError("fairseq-generate shards with --num-shards and --shard-id; "
                                  "--distributed-rank does not apply")
            with open_dict(cfg):
                cfg.distributed_training.distributed_world_size = shards
                cfg.distributed_training.distributed_rank = shard
            print(f"fairseq-hardattn: decoding shard {shard} of {shards} (--shard-id, --num-shards): "
                  f"every {shards}th batch", file=sys.stderr, flush=True)
        return generate_main(cfg, output_file)

    return main


def interactive_checked(interactive_main):
    """Wrap fairseq-interactive's ``main(cfg)``: it translates its whole
    input, so ``--num-shards`` and ``--shard-id`` (which fairseq's own reads
    and ignores) stop in one line naming the commands that shard; the lines
    it leaves out get empty hypotheses (``empty_hypotheses``) while it runs."""

    @functools.wraps(interactive_main)
    def main(cfg):
        from fairseq.tasks import fairseq_task

        from ..errors import ConfigError

        if cfg.dataset.num_shards != 1 or cfg.dataset.shard_id != 0:
            raise ConfigError("fairseq-interactive translates its whole input: --num-shards and --shard-id "
                              "shard fairseq-generate and python -m fairseq_hardattn translate")
        task_class = fairseq_task.FairseqTask
        original = task_class.inference_step
        task_class.inference_step = empty_hypotheses(original)
        try:
            return interactive_main(cfg)
        finally:
            task_class.inference_step = original

    return main
