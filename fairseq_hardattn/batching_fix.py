"""Keep every sentence when fairseq batches a dataset.

The fairseq build we depend on (ve-fairseq 0.12.3, upstream main of 2024-10)
ends ``fairseq.data.data_utils.batch_by_size`` with::

    if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0:
        b = b[:-1]

so with the default ``--required-batch-size-multiple 8`` the last batch is
dropped whenever its size is not a multiple of 8: ``fairseq-generate`` then
translates and scores only part of the test set (96 of 100 sentences), with no
warning. fairseq 0.12.2 kept that batch; so do we, by replacing the function
with the same batching minus the drop. Call sites look the function up on the
module at call time, so importing the plugin is enough.
"""

import numpy as np
from fairseq.data import data_utils

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
    if not isinstance(indices, np.ndarray):
        indices = np.fromiter(indices, dtype=np.int64, count=-1)
    if num_tokens_vec is None:
        return batch_by_size_fn(
            indices, num_tokens_fn, max_tokens, max_sentences,
            required_batch_size_multiple,
        )
    if not isinstance(num_tokens_vec, np.ndarray):
        num_tokens_vec = np.fromiter(num_tokens_vec, dtype=np.int64, count=-1)
    return batch_by_size_vec(
        indices, num_tokens_vec, max_tokens, max_sentences,
        required_batch_size_multiple,
    )


data_utils.batch_by_size = batch_by_size
