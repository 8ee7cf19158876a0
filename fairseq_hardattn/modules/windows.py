"""Bands and windows of source positions: the machinery that flexible and
local attention share to attend only near a position.

A *band* is the range [low, high] of source positions a query row attends to
(``band_limits``: for flexible attention, exactly the positions whose penalty
is below τ, plus the one nearest the centre). In decoding, the keys of a band
are gathered as a *window* (``gather_ranges``): one window per sentence and
head, shared by the sentence's hypotheses, as wide as the step needs, with
rows of much wider bands given windows of their own (``WindowPlan``); the
values are summed where they lie in the cache (``weighted_window_values``),
never copied.
"""

import math
from typing import NamedTuple, Optional, Tuple

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


def window_starts(low: Tensor, high: Tensor, src_len: int) -> Tuple[Tensor, int]:
    """Start (long) of each row's window and the common width W: the widest
    [low, high] (inclusive, within [0, src_len)) of all rows; a window is
    moved left where needed to stay inside the source."""
    width = int((high - low).max()) + 1  # one sync per step, to size the window
    return low.clamp(max=src_len - width).long(), width


def covering_windows(low: Tensor, high: Tensor, src_len: int) -> Tensor:
    """Positions (N, W) of the windows of ``window_starts``."""
    start, width = window_starts(low, high, src_len)
    return start.unsqueeze(1) + torch.arange(width, device=low.device)


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


class Windows(NamedTuple):
    """K/V windows for some query rows: ``positions`` (rows, W) the key position
    of each row's window slots, ``padded`` (rows, W) or None; ``keys``
    (window_bsz*heads, W, head_dim) the gathered keys, one window per sentence
    and head (window_bsz = kv_bsz, shared by its hypotheses) or one per row
    (window_bsz = rows // heads), as ``attention_scores`` takes them;
    ``value_rows`` (rows, W) the row of each slot's value in the flattened
    value cache (values are not gathered: ``weighted_window_values``)."""

    positions: Tensor
    padded: Optional[Tensor]
    keys: Tensor
    value_rows: Tensor
    window_bsz: int


def weighted_window_values(probs: Tensor, windows: Windows, v: Tensor) -> Tensor:
    """sum_w probs[r, w]·V[slot w of row r's window] as (rows, 1, head_dim).

    One ``F.embedding_bag`` (weighted sum of table rows) reads each row's
    window where it lies in the cache: no copy of the windows, and no matrix
    product of tiny per-head matrices (both cost more than this on CPU)."""
    rows, width = windows.value_rows.shape
    weights = probs.reshape(rows, width).to(v.dtype).contiguous()
    out = F.embedding_bag(windows.value_rows, v.reshape(-1, v.size(-1)),
                          per_sample_weights=weights, mode="sum")
    return out.unsqueeze(1)


class WindowPlan(NamedTuple):
    """``main``: windows for every query row; ``wide_rows`` (long) the rows whose
    range ``main`` does not cover, with their own windows ``wide`` (or None)."""

    main: Windows
    wide_rows: Optional[Tensor]
    wide: Optional[Windows]

    def apply(self, attend, *per_row: Tensor) -> Tuple[Tensor, ...]:
        """``attend(windows, *per_row)`` returns a tuple of per-row results; run
        it on the main windows for every row, then on the wide rows' own
        windows, whose results replace theirs."""
        results = attend(self.main, *per_row)
        if self.wide is None:
            return results
        rows = self.wide_rows
        wide = attend(self.wide, *(tensor[rows] for tensor in per_row))
        return tuple(result.index_copy(0, rows, row_result)
                     for result, row_result in zip(results, wide))


# a window per row costs about this many times a shared window of the same
# width (a key copy and a score product per hypothesis instead of per sentence)
PER_ROW_COST = 2


def gather_ranges(attn, k: Tensor, key_padding_mask: Optional[Tensor],
                  low: Tensor, high: Tensor, kv_bsz: int, bsz: int) -> WindowPlan:
    """Windows of ``attn``'s cache holding positions [low, high] (inclusive,
    within the source; one range per query row, rows ordered sentence,
    hypothesis, head): keys gathered, values located (``Windows``).

    A beam's hypotheses share their sentence's K/V rows (fairseq's beamable
    encoder-decoder attention), so they share one window too, covering all
    their ranges: each window is copied once per sentence instead of once per
    hypothesis, and the scores are one small matrix product per sentence and
    head, as in global attention. Windows are as wide as the step's widest,
    except that a few much wider ones (a weak gate, hypotheses far apart) do
    not widen all: the width minimising the work is chosen, and the rows of
    wider windows get windows of their own (``WindowPlan.wide``)."""
    heads, src_len = attn.num_heads, k.size(1)
    value_rows = attn.value_rows(bsz, kv_bsz, k.device)
    group_low = low.view(kv_bsz, -1, heads).amin(dim=1).reshape(-1)
    group_high = high.view(kv_bsz, -1, heads).amax(dim=1).reshape(-1)
    group_width = group_high - group_low + 1
    widths = group_width.sort().values
    groups = widths.numel()
    # work of width w for all groups, plus the wider groups' rows on their own
    wider = groups - 1 - torch.arange(groups, device=k.device)
    work = groups * widths + PER_ROW_COST * wider * widths[-1]
    width = int(widths[int(work.argmin())])  # one sync per step, to size the windows
    start = group_low.clamp(max=src_len - width).long()
    main = _windows(k, key_padding_mask, heads, torch.arange(groups, device=k.device), start,
                    width, value_rows, kv_bsz)
    wide_rows = (group_width > width).index_select(0, value_rows).nonzero().squeeze(1)
    if wide_rows.numel() == 0:
        return WindowPlan(main, None, None)
    row_start, row_width = window_starts(low[wide_rows], high[wide_rows], src_len)
    wide = _windows(k, key_padding_mask, heads, value_rows[wide_rows], row_start, row_width,
                    None, wide_rows.numel() // heads)
    return WindowPlan(main, wide_rows, wide)


def _windows(k, key_padding_mask, heads, kv_rows, start, width, query_kv_rows, window_bsz):
    """Windows of ``width`` from ``start`` in K/V rows ``kv_rows`` (keys
    gathered, values located); query row r reads window ``query_kv_rows[r]``
    (None: window r)."""
    positions = start.unsqueeze(1) + torch.arange(width, device=k.device)
    padded = None
    if key_padding_mask is not None:
        padded = key_padding_mask.index_select(0, kv_rows // heads).gather(1, positions)
    keys = gather_windows(k, kv_rows, start, width)
    value_rows = positions + (kv_rows * k.size(1)).unsqueeze(1)
    if query_kv_rows is not None:
        positions = positions.index_select(0, query_kv_rows)
        value_rows = value_rows.index_select(0, query_kv_rows)
        padded = None if padded is None else padded.index_select(0, query_kv_rows)
    return Windows(positions, padded, keys, value_rows, window_bsz)


def band_windows(centre: Tensor, half_width: Tensor, src_len: int) -> Tuple[Tensor, Tensor]:
    """One window per row holding its band: positions (N, W) and whether each
    lies in the row's band."""
    low, high = band_limits(centre, half_width, src_len)
    positions = covering_windows(low, high, src_len)
    return positions, in_band(positions, low, high)
