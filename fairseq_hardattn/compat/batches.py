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
  positions ended the whole run ("Size of sample #0 is invalid");
  ``long_lines_skipped`` names it and the run goes on. Cased lines for a
  model that learned from lowercased text are named in one warning
  (``cased_input_named``). Its batches can
  be read ahead (``decoding.read_ahead``), so that the plugin's search
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


def long_lines_skipped(make_batches):
    """Wrap fairseq-interactive's ``make_batches``: a line longer than the
    model's source positions ended the whole run ("Size of sample #0 is
    invalid") and the lines after it were never translated. Such a line is
    now named in one line on stderr and skipped; the run goes on."""
    lines_read = [0]  # across the calls of this run, for the line numbers

    @functools.wraps(make_batches)
    def batches(lines, cfg, task, max_positions, encode_fn):
        first_line, lines_read[0] = lines_read[0], lines_read[0] + len(lines)
        limit = _source_positions(max_positions)
        if limit is not None:
            _, lengths = task.get_interactive_tokens_and_lengths(lines, encode_fn)
            too_long = [(i, n) for i, n in enumerate(lengths) if n > limit]
            for i, n in too_long:
                print(f"fairseq-hardattn: error: input line {first_line + i + 1} has {n} tokens, more "
                      f"than the model's {limit} source positions: not translated", file=sys.stderr,
                      flush=True)
            if too_long and not cfg.dataset.skip_invalid_size_inputs_valid_test:
                # fairseq's own filter drops them, keeping every other line's id
                from omegaconf import open_dict

                with open_dict(cfg):
                    cfg.dataset.skip_invalid_size_inputs_valid_test = True
                try:
                    yield from make_batches(lines, cfg, task, max_positions, encode_fn)
                finally:
                    with open_dict(cfg):
                        cfg.dataset.skip_invalid_size_inputs_valid_test = False
                return
        yield from make_batches(lines, cfg, task, max_positions, encode_fn)

    return batches


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


def read_ahead(make_batches):
    """fairseq-interactive's batches, able to read ahead (``workers``)."""

    from ..decoding.read_ahead import InteractiveBatches

    lines_read = [0]  # across the calls of this run: the batches' line numbers

    @functools.wraps(make_batches)
    def batches(lines, *args, **kwargs):
        first_line, lines_read[0] = lines_read[0], lines_read[0] + len(lines)
        return InteractiveBatches(make_batches(lines, *args, **kwargs), first_line)

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


def shards_refused(interactive_main):
    """Wrap fairseq-interactive's ``main(cfg)``: it translates its whole
    input, so ``--num-shards`` and ``--shard-id`` (which fairseq's own reads
    and ignores) stop in one line naming the commands that shard."""

    @functools.wraps(interactive_main)
    def main(cfg):
        from ..errors import ConfigError

        if cfg.dataset.num_shards != 1 or cfg.dataset.shard_id != 0:
            raise ConfigError("fairseq-interactive translates its whole input: --num-shards and --shard-id "
                              "shard fairseq-generate and python -m fairseq_hardattn translate")
        return interactive_main(cfg)

    return main
