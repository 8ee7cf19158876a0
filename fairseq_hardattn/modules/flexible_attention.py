"""Flexible attention (Shu & Nakayama 2017, "Reducing Redundant Computations
with Flexible Attention"), as decoder cross-attention.

The attention centre p_t = sum_s a_t(s)·s is tracked per hypothesis and head;
scores are penalised by g_t (s - p_{t-1})² / (2σ²), with the strength
g_t = sigmoid(v_gᵀ tanh(W_g h_t + b_g)) computed, per head, from the decoder
state that queries the attention. The penalty is computed in float32.

Test time, threshold τ: scores are computed only for the band of positions
whose penalty is below τ, |s - p_{t-1}| < σ·sqrt(2τ/g_t) (plus the position
nearest p_{t-1}, so that no query is left without keys). Only the bands
are scored, never a mask over the full score matrix: on CPU in float32 by a
C kernel that reads each band where it lies in the K/V cache
(``kernels/flexible_band.c``, one call per step); elsewhere with PyTorch
ops, gathering windows of keys as wide as the step's bands need
(``gather_ranges``: one window per sentence and head, shared by its
hypotheses) and summing the bands' values where they lie in the cache
(``weighted_window_values``). The band positions are counted (CPS, score
computations per decoding step).

Training is parallel over target positions, so p_{t-1} cannot come from the
previous step's penalised attention. We use a fixed-point refinement: centres
of an unpenalised pass, shifted by one step, penalise the next pass, whose
centres, shifted again, penalise the next (``train_passes`` penalised passes,
default 2). Every pass reuses the same scores (only the penalty and a softmax
are recomputed), so refinement is cheap, and each pass's centres come closer
to those decoding uses, the real previous step's. Centres are constants to the
gradient. ``train_passes=0`` runs the exact recurrence in training as well (a
loop over target positions). Evaluation (validation included) always runs the
exact recurrence, so it scores the model that decoding runs. Decoding keeps
the real previous centre in incremental state under its own key, reordered
for beam search (fairseq's encoder-decoder attention skips reordering its own
buffer).

``train_threshold``: apply τ's band in training too (each pass attends only
within the band around its estimate of p_{t-1}). The paper trains and
fine-tunes without it; with it, fine-tuning adapts the model to the
positions decoding will skip.
"""

import math
from functools import partial
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import kernels
from ..errors import ConfigError
from .cached_projection import CachedProjectionAttention
from .hard_retrieval_attention import retrieve

_CENTRE_STATE = "flexible_centre"


def gate_size(gate_dim: Optional[int], input_dim: int) -> int:
    """Hidden size of the gate network W_g: ``gate_dim``, or the input size
    when None (0 is an error, not the default)."""
    if gate_dim is None:
        return input_dim
    if gate_dim < 1:
        raise ValueError(f"flexible attention: gate_dim must be >= 1, got {gate_dim}")
    return gate_dim


def fast_tanh(x: Tensor) -> Tensor:
    """tanh(x), as 2·sigmoid(2x) - 1 where no gradient is needed: the same
    values (to float rounding) and on CPU about 3x faster than torch.tanh,
    which decoding calls every step on (hypotheses, embed_dim) hidden states."""
    if torch.is_grad_enabled() and x.requires_grad:
        return torch.tanh(x)
    return torch.sigmoid(2 * x).mul_(2).sub_(1)


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


def masked_mean_gate(gates, target_mask: Tensor) -> Tensor:
    """Mean of g over layers, heads and real target positions: gates is a list
    of (tgt_len, bsz, heads) tensors, target_mask (bsz, tgt_len), True = real."""
    per_position = torch.stack(list(gates)).float().mean(dim=(0, 3))  # (tgt_len, bsz)
    mask = target_mask.t().to(per_position.dtype)
    return (per_position * mask).sum() / mask.sum().clamp(min=1)


class CpsCounter:
    """Counts score computations per decoding step (CPS) while ``enabled``.

    ``scored`` sums the positions scored, ``queries`` counts (hypothesis, head,
    step) triples, ``available`` sums the positions global attention would
    score. Kept as tensors: counting adds no synchronisation to decoding.
    """

    def __init__(self):
        self.enabled = False
        self.reset()

    def reset(self):
        self.scored, self.queries, self.available = 0, 0, 0

    def add(self, scored: Tensor, available: Tensor):
        if self.enabled:
            self.scored = self.scored + scored.sum()
            self.available = self.available + available.sum()
            self.queries += scored.numel()

    def summary(self):
        if not self.queries:
            return None
        return {"cps": float(self.scored) / self.queries,
                "global_cps": float(self.available) / self.queries,
                "queries": self.queries}


class FlexibleAttention(CachedProjectionAttention):
    """Drop-in for fairseq's encoder-decoder ``MultiheadAttention``.

    Extra args: ``sigma`` (σ of the penalty); ``threshold`` (τ; None or inf:
    no band); ``train_passes`` and ``train_threshold`` (see module doc);
    ``gate_dim`` (hidden size of the gate network, default embed_dim).
    """

    new_parameter_prefixes = ("gate_",)
    batch_major_static_cache = True  # windows are contiguous blocks
    use_kernel = True  # False: PyTorch ops only (benchmarks and tests compare both)

    def __init__(self, embed_dim, num_heads, *args, sigma: float = 3.0,
                 threshold: Optional[float] = None, train_passes: int = 2,
                 train_threshold: bool = False, gate_dim: Optional[int] = None, **kwargs):
        super().__init__(embed_dim, num_heads, *args, **kwargs)
        if not self.encoder_decoder_attention:
            raise ValueError("flexible attention replaces decoder cross-attention only")
        if not sigma > 0:
            raise ValueError(f"flexible attention: sigma must be > 0, got {sigma}")
        if threshold is not None and not threshold > 0:
            raise ValueError(f"flexible attention: threshold must be > 0, got {threshold}")
        if train_passes < 0:
            raise ValueError(f"flexible attention: train_passes must be >= 0, got {train_passes}")
        self.sigma = sigma
        self.threshold = None if threshold is None or math.isinf(threshold) else threshold
        self.train_passes = train_passes
        self.train_threshold = train_threshold
        gate_dim = gate_size(gate_dim, embed_dim)
        self.gate_hidden = nn.Linear(embed_dim, gate_dim)  # W_g, b_g
        self.gate_out = nn.Linear(gate_dim, num_heads, bias=False)  # v_g, one per head
        nn.init.xavier_uniform_(self.gate_hidden.weight)
        nn.init.zeros_(self.gate_hidden.bias)
        nn.init.xavier_uniform_(self.gate_out.weight)
        self.cps = CpsCounter()
        self.last_gates: Optional[Tensor] = None  # (tgt_len, bsz, heads), for the criterion

    def gates(self, query: Tensor) -> Tensor:
        """g_t per query position and head: (tgt_len, bsz, heads)."""
        return torch.sigmoid(self.gate_out(fast_tanh(self.gate_hidden(query))))

    def penalty(self, positions: Tensor, centres: Tensor, gates: Tensor) -> Tensor:
        """g (s - p)² / (2σ²) in float32; centres and gates (N, T); positions
        broadcast against (N, T, S)."""
        distance = positions.float() - centres.float().unsqueeze(-1)
        return gates.float().unsqueeze(-1) * distance.pow(2) / (2 * self.sigma ** 2)

    def attend(self, query, p, incremental_state, attn_mask, before_softmax, need_weights,
               need_head_weights):
        q, k, v, key_padding_mask, kv_bsz, tgt_len, bsz = p
        gates = self.gates(query)
        self.last_gates = gates  # read by the fine-tuning criterion after forward
        gates = gates.permute(1, 2, 0).reshape(bsz * self.num_heads, tgt_len)
        threshold = self.threshold if self.train_threshold or not self.training else None
        if self.training and self.train_threshold and threshold is None:
            # checked here, not when building: decoding such a model with τ = ∞ is fine
            raise ConfigError("--flexible-train-threshold needs a finite --flexible-threshold "
                              "(a number or 'auto'): with 'inf' there is no band to train in")

        def starts():  # each row's first unpadded key position: the first centre
            first = first_key_positions(key_padding_mask, kv_bsz, q.device)
            return first.repeat_interleave(bsz // kv_bsz * self.num_heads)

        if incremental_state is not None:
            if tgt_len != 1:
                raise ValueError("flexible attention decodes one target position per step")
            state = self.get_incremental_state(incremental_state, _CENTRE_STATE) or {}
            previous = state["centre"].view(-1, 1) if "centre" in state else starts().unsqueeze(1)
            if threshold is not None:
                out, centres = self._banded_step(q, k, v, key_padding_mask, kv_bsz, bsz,
                                                 previous, gates, threshold)
                result = (self.merge_heads(out, tgt_len, bsz), None)
            else:
                q = q * self.scaling
                scores = self.mask_scores(self.attention_scores(q, k, kv_bsz), attn_mask,
                                          key_padding_mask, kv_bsz)
                probs = self._penalised_softmax(scores, previous, gates)
                centres = self._centres(probs)
                visible = (~scores.isneginf()).sum(-1)
                self.cps.add(visible, visible)
                result = self._attend(probs, v, kv_bsz, bsz, need_weights, need_head_weights)
            self.set_incremental_state(incremental_state, _CENTRE_STATE, {
                "centre": centres[:, -1].detach().view(bsz, self.num_heads)
            })
            return result

        q = q * self.scaling
        scores = self.mask_scores(self.attention_scores(q, k, kv_bsz), attn_mask,
                                  key_padding_mask, kv_bsz)
        if before_softmax:
            return scores, v
        if self.training and self.train_passes > 0:
            probs = self._refined_probs(scores, gates, starts(), threshold)
        else:
            probs = self._recurrent_probs(scores, gates, starts(), threshold)
        return self._attend(probs, v, kv_bsz, bsz, need_weights, need_head_weights)

    def _refined_probs(self, scores, gates, starts, threshold):
        """Training, in parallel: p_{t-1} from the previous pass's centres
        (with a threshold: attending within each estimate's band)."""
        src_len = scores.size(-1)
        positions = torch.arange(src_len, device=scores.device)
        half = None if threshold is None else band_half_width(gates, self.sigma, threshold)
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)  # unpenalised pass
        for _ in range(self.train_passes):
            shifted = torch.cat([starts.unsqueeze(1), self._centres(probs)[:, :-1]], dim=1)
            band = None if half is None else in_band(positions, *band_limits(shifted, half, src_len))
            probs = self._penalised_softmax(scores, shifted, gates, band, positions)
        return probs

    def _recurrent_probs(self, scores, gates, starts, threshold):
        """The exact recurrence decoding runs, one target position after the
        other, on precomputed scores (evaluation, or ``train_passes=0``)."""
        src_len = scores.size(-1)
        positions = torch.arange(src_len, device=scores.device)
        previous = starts.unsqueeze(1)
        steps = []
        for t in range(scores.size(1)):
            band = None
            if threshold is not None:
                half = band_half_width(gates[:, t:t + 1], self.sigma, threshold)
                band = in_band(positions, *band_limits(previous.float(), half, src_len))
            probs = self._penalised_softmax(scores[:, t:t + 1], previous, gates[:, t:t + 1], band)
            previous = self._centres(probs)
            steps.append(probs)
        return torch.cat(steps, dim=1)

    def _penalised_softmax(self, scores, centres, gates, band=None, positions=None):
        if positions is None:
            positions = torch.arange(scores.size(-1), device=scores.device)
        logits = scores.float() - self.penalty(positions, centres, gates)
        if band is not None:
            logits = logits.masked_fill(~band, float("-inf"))
        return F.softmax(logits, dim=-1).type_as(scores)

    @staticmethod
    def _centres(probs, positions=None):
        """p = sum_s a(s)·s, (N, T), as constants to the gradient."""
        if positions is None:
            positions = torch.arange(probs.size(-1), device=probs.device)
        return (probs.detach().float() * positions).sum(-1)

    def _attend(self, probs, v, kv_bsz, bsz, need_weights, need_head_weights):
        out = self.weighted_values(self.dropout_module(probs), v, kv_bsz)
        weights = self.format_weights(probs, bsz, need_head_weights) if need_weights else None
        return self.merge_heads(out, probs.size(1), bsz), weights

    def _banded_step(self, q, k, v, key_padding_mask, kv_bsz, bsz, previous, gates, threshold):
        """Score only the bands (q unscaled, one target position). On CPU in
        float32: the C kernel, scoring each band in place in the cache
        (``kernels.flexible_band_step``). Elsewhere: gathered windows of keys
        (``gather_ranges``), values summed where they lie
        (``weighted_window_values``)."""
        src_len = k.size(1)
        centre = previous[:, 0].float()
        gate = gates[:, 0].float()
        if self.use_kernel and kernels.can_run_flexible_band(q, k, v):
            out, centres, scored = kernels.flexible_band_step(
                q[:, 0], k, v, key_padding_mask, centre, gate, bsz // kv_bsz, self.num_heads,
                self.scaling, self.sigma, threshold)
            out = out.unsqueeze(1)
        else:
            low, high = band_limits(centre, band_half_width(gate, self.sigma, threshold), src_len)
            plan = gather_ranges(self, k, key_padding_mask, low, high, kv_bsz, bsz)
            out, centres, scored = plan.apply(partial(self._band_attention, v=v),
                                              q * self.scaling, centre, gate, low, high)
        if self.cps.enabled:
            available = unpadded_lengths(key_padding_mask, kv_bsz, src_len, q.device)
            self.cps.add(scored, available.repeat_interleave(bsz // kv_bsz * self.num_heads))
        return out, centres.unsqueeze(1)

    def _band_attention(self, windows, q, centre, gate, low, high, v):
        """Penalised attention of query rows q over their windows, masked to
        their bands [low, high] (``band_limits``: exactly the positions whose
        penalty is below τ): output, new centres and the band sizes (CPS)."""
        positions = windows.positions
        band = in_band(positions, low, high)
        if windows.padded is not None:
            band &= ~windows.padded
        scores = self.attention_scores(q, windows.keys, windows.window_bsz)[:, 0].float()
        distance = positions - centre.unsqueeze(1)
        # scores - g (s - p)² / (2σ²), in float32
        logits = torch.addcmul(scores, distance.square(), gate.unsqueeze(1),
                               value=-0.5 / self.sigma ** 2)
        probs = F.softmax(logits.masked_fill_(~band, float("-inf")), dim=-1)
        out = weighted_window_values(probs, windows, v)  # decoding: no dropout
        return out, (probs * positions).sum(-1), band.sum(-1)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        super().reorder_incremental_state(incremental_state, new_order)
        state = self.get_incremental_state(incremental_state, _CENTRE_STATE)
        if state:
            self.set_incremental_state(incremental_state, _CENTRE_STATE, {
                "centre": state["centre"].index_select(0, new_order)
            })
        return incremental_state


class FlexibleLSTMAttention(nn.Module):
    """Flexible attention for fairseq's LSTM decoder (the paper's own setting):
    a replacement for ``fairseq.models.lstm.AttentionLayer`` with its
    parameters (so LSTM checkpoints load) plus the gate.

    fairseq's LSTM decoder calls its attention once per target step, in
    training too, so p_{t-1} is always the real previous step's centre. The
    decoder brackets each forward call with ``start(centre)`` and reads
    ``centre`` back to keep it in its incremental state.
    """

    def __init__(self, input_embed_dim, source_embed_dim, output_embed_dim, bias=False,
                 sigma: float = 3.0, threshold: Optional[float] = None,
                 gate_dim: Optional[int] = None):
        super().__init__()
        if not sigma > 0:
            raise ValueError(f"flexible attention: sigma must be > 0, got {sigma}")
        self.input_proj = nn.Linear(input_embed_dim, source_embed_dim, bias=bias)
        self.output_proj = nn.Linear(input_embed_dim + source_embed_dim, output_embed_dim,
                                     bias=bias)
        gate_dim = gate_size(gate_dim, input_embed_dim)
        self.gate_hidden = nn.Linear(input_embed_dim, gate_dim)
        self.gate_out = nn.Linear(gate_dim, 1, bias=False)
        for linear in (self.input_proj, self.output_proj, self.gate_hidden, self.gate_out):
            nn.init.uniform_(linear.weight, -0.1, 0.1)  # as fairseq's LSTM Linear
        nn.init.zeros_(self.gate_hidden.bias)
        self.sigma = sigma
        self.threshold = None if threshold is None or math.isinf(threshold) else threshold
        self.cps = CpsCounter()
        self.centre: Optional[Tensor] = None
        self.step_gates = []
        self.last_gates: Optional[Tensor] = None

    def start(self, centre: Optional[Tensor] = None):
        """Begin a forward call: the previous centre, or None at a sentence's start."""
        self.centre = centre
        self.step_gates = []

    def finish(self):
        """End a forward call: the step gates as (tgt_len, bsz, 1) for the criterion."""
        if self.step_gates:
            self.last_gates = torch.stack(self.step_gates).unsqueeze(-1)

    def forward(self, input: Tensor, source_hids: Tensor, encoder_padding_mask: Optional[Tensor]):
        # input: bsz x hidden; source_hids: srclen x bsz x source dim; mask: srclen x bsz
        src_len, bsz, _ = source_hids.shape
        query = self.input_proj(input)
        gate = torch.sigmoid(self.gate_out(fast_tanh(self.gate_hidden(input)))).squeeze(-1)
        self.step_gates.append(gate)
        padding = None if encoder_padding_mask is None else encoder_padding_mask.t()
        if self.centre is None:
            self.centre = first_key_positions(padding, bsz, input.device)
        available = unpadded_lengths(padding, bsz, src_len, input.device)
        threshold = None if self.training else self.threshold
        if threshold is None:
            positions = torch.arange(src_len, device=input.device).expand(bsz, -1)
            keys = source_hids.transpose(0, 1)  # (bsz, srclen, dim)
            band = None if padding is None else ~padding
            self.cps.add(available, available)
        else:
            half = band_half_width(gate, self.sigma, threshold)
            positions, band = band_windows(self.centre.float(), half, src_len)
            if padding is not None:
                band &= ~padding.gather(1, positions)
            table = source_hids.reshape(-1, source_hids.size(-1))  # time-major rows
            keys = F.embedding(positions * bsz + torch.arange(bsz, device=input.device)[:, None], table)
            self.cps.add(band.sum(-1), available)
        scores = (keys * query.unsqueeze(1)).sum(-1).float()
        penalty = gate.float().unsqueeze(1) * (positions - self.centre.float().unsqueeze(1)).pow(2)
        logits = scores - penalty / (2 * self.sigma ** 2)
        if band is not None:
            logits = logits.masked_fill(~band, float("-inf"))
        probs = F.softmax(logits, dim=-1)
        self.centre = (probs.detach() * positions).sum(-1)
        context = (probs.type_as(keys).unsqueeze(-1) * keys).sum(1)
        out = torch.tanh(self.output_proj(torch.cat((context, input), dim=1)))
        dense = probs if threshold is None else probs.new_zeros(bsz, src_len).scatter_add_(
            1, positions, probs)
        return out, dense.t().type_as(out)
