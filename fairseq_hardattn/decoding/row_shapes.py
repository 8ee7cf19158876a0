"""oneDNN's products in few shapes.

oneDNN compiles a kernel for every shape it multiplies and keeps it in a
cache (about half a MB each, up to 1,024 of them). The rows of a search's
products change with every step and batch (the hypotheses left, the
sentences and source lengths of a chunk), so a long run's process grew by
hundreds of MB of kernels, and paid a compilation for each new row count.
The float32 packed (``packed_linear``), bfloat16 (``bf16``) and oneDNN int8
(``int8``) products therefore run on rows padded with zeros to a few sizes
(``padded_rows``): a process's kernels stop growing after its first batches.
"""

import torch


def padded_rows(rows: int) -> int:
    """The rows a oneDNN product of ``rows`` rows runs on: 1, 2 or 4 below
    5 rows (a product of one row costs half one of 8: one sentence's
    greedy or sampled steps, a batch's last ones); else a multiple of 8,
    and from 256 rows of a sixteenth of the power of two below (at most
    1/16 more): 16 sizes to each doubling."""
    if rows <= 4:
        return 1 << (rows - 1).bit_length() if rows > 0 else rows
    step = max(8, 1 << max(rows.bit_length() - 5, 0))
    return -(-rows // step) * step


def in_few_shapes(product):
    """``product`` (features (..., in), then any other arguments -> (..., out),
    row by row) on its features' rows padded with zeros to ``padded_rows``."""

    def padded(x: torch.Tensor, *rest) -> torch.Tensor:
        width = x.size(-1)
        rows = x.numel() // width
        target = padded_rows(rows)
        if target == rows:
            return product(x, *rest)
        flat = x.reshape(rows, width)
        out = product(torch.cat([flat, flat.new_zeros(target - rows, width)]), *rest)
        return out[:rows].view(*x.shape[:-1], out.size(-1))

    return padded
