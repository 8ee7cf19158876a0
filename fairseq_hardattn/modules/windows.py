"""Bands and windows of source positions: the machinery that flexible and
local attention share to attend only near a position.

A *band* is the range [low, high] of source positions a query row attends to
(``band_limits``: for flexible attention, exactly the positions whose penalty
is below τ, plus the one nearest the centre; ``in_band`` tests positions
against it). A *window* is a static number of consecutive positions whose
keys are gathered as one block of the cache (``gather_windows``) and whose
values are summed where they lie (``weighted_window_values``), never copied.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .gather import retrieve


def first_key_positions(key_padding_mask: Optional[Tensor], bsz: int, device) -> Tensor:
    """Index of each sentence's first unpadded key (left padding shifts it)."""
    if key_padding_mask is None:
        return torch.zeros(bsz, device=device)
    return (~key_padding_mask).to(torch.int8).argmax(dim=-1).float()


def unpadded_lengths(key_padding_mask: Optional[Tensor], bsz: int, src_len: int, device) -> Tensor:
    """Number of real (unpadded) keys of each sentence, as float."""
    if key_padding_mask is None:
        return torch.full((bsz,), float(src_len), device=device)
    return (~key_padding_mask).sum(-1).float()


def band_threshold(threshold: Optional[float]) -> Optional[float]:
    """τ as the windowed modules keep it: a positive number, or None for no
    band (τ = ∞ or None: every position is scored)."""
    if threshold is None or math.isinf(threshold):
        return None
    if not threshold > 0:
        raise ValueError(f"flexible attention: threshold must be > 0, got {threshold}")
    return float(threshold)


def band_half_width(gates: Tensor, sigma: float, threshold: float) -> Tensor:
    """Half-width of the band |s - p| < σ·sqrt(2τ/g) where the penalty is below τ."""
    return sigma * torch.sqrt(2.0 * threshold / gates.float().clamp(min=1e-6))


def band_limits(centre: Tensor, half_width: Tensor, src_len: int) -> Tuple[Tensor, Tensor]:
    """First and last position (inclusive) of each row's band: the integer
    positions s with |s - centre| < half_width (penalty below τ), plus the one
    nearest the centre, clipped to the source."""
    nearest = torch.round(centre)
    low = torch.minimum(torch.floor(centre - half_width) + 1, nearest).clamp(min=0)
    high = torch.maximum(torch.ceil(centre + half_width) - 1, nearest).clamp(max=src_len - 1)
    return low, high


def in_band(positions: Tensor, low: Tensor, high: Tensor) -> Tensor:
    """Positions (..., W) within their row's band [low, high] (``band_limits``,
    shaped (...)): the one definition of the band that training's exact
    recurrence, decoding and the LSTM path share."""
    return (positions >= low.unsqueeze(-1)) & (positions <= high.unsqueeze(-1))


def gather_windows(values: Tensor, value_rows: Tensor, start: Tensor, width: int) -> Tensor:
    """out[r, w] = values[value_rows[r], start[r] + w] as (R, W, D).

    A window of a batch-major (N, S, D) cache is one contiguous block of W·D
    numbers, so the gather copies R blocks (``F.embedding`` over an
    overlapping view of the buffer whose rows are all such blocks): about
    twice as fast on CPU as gathering R·W rows of D. Time-major caches fall
    back to the row gather."""
    rows, src_len, dim = values.shape
    if not values.is_contiguous():
        return retrieve(values, value_rows, start.unsqueeze(1) + torch.arange(width, device=start.device))
    blocks = values.reshape(-1).as_strided((rows * src_len - width + 1, width * dim), (dim, 1))
    return F.embedding(value_rows * src_len + start, blocks).view(-1, width, dim)


def weighted_window_values(probs: Tensor, value_rows: Tensor, v: Tensor) -> Tensor:
    """sum_w probs[r, w]·V[value_rows[r, w]] as (rows, 1, head_dim), where
    value_rows are rows of the flattened (N·S, head_dim) value cache.

    One ``F.embedding_bag`` (weighted sum of table rows) reads each row's
    window where it lies in the cache: no copy of the windows, and no matrix
    product of tiny per-head matrices (both cost more than this on CPU)."""
    rows, width = value_rows.shape
    weights = probs.reshape(rows, width).to(v.dtype).contiguous()
    out = F.embedding_bag(value_rows, v.reshape(-1, v.size(-1)),
                          per_sample_weights=weights, mode="sum")
    return out.unsqueeze(1)


