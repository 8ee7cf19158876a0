"""GPU kernels of the decoding steps that need one, in Triton, registered as
torch custom ops (``torch.ops.fairseq_hardattn.*``) so that graph capture and
``torch.compile`` see them as single operations.

- ``hard_retrieval_step``: hard retrieval attention for one query per row,
  fused: each row's scores q·k over its keys, their argmax (the first of
  equal maxima, as ``torch.argmax``) and the retrieved value row. K is read
  once and only one V row per head; no score matrix is written.
- ``flexible_band_step``: flexible attention for one query per row, scoring
  only the band around each row's centre (the bounds computed in the kernel
  from the centre and gate: no host planning) with an online softmax; the
  output, the new centres and the band sizes (CPS).

Each op has a PyTorch implementation (the reference the kernels are tested
against, and what runs on the CPU or without Triton). Rows are query rows
(sentence, hypothesis, head); ``kv_rows`` maps each to its row of K/V (the
hypotheses of a beam share their sentence's); K and V may be batch-major
(decoding caches) or time-major views (fresh projections): any strides.
"""

import os
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # ships with CUDA builds of torch; absent from the CPU wheel
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None


def available(tensor: Tensor) -> bool:
    """Whether the Triton kernels run for ``tensor``: on a GPU, with Triton
    (``TRITON_INTERPRET=1`` runs them on the CPU, for testing)."""
    if triton is None:
        return False
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


# --- references (PyTorch) ------------------------------------------------------


def hard_retrieval_reference(q: Tensor, k: Tensor, v: Tensor, kv_rows: Tensor,
                             padding: Optional[Tensor], heads: int) -> Tensor:
    """q (rows, d), unscaled; k, v (kv_rows_total, S, d); padding (kv_rows_total
    // heads, S) bool or None. Returns V[kv_rows[r], argmax_s q·k] (zeros
    where every key is padded), in float32 arithmetic."""
    keys = k.index_select(0, kv_rows).float()
    scores = torch.einsum("rd,rsd->rs", q.float(), keys)
    if padding is not None:
        scores = scores.masked_fill(padding.index_select(0, kv_rows // heads), float("-inf"))
    best = scores.argmax(-1)
    out = v.index_select(0, kv_rows)[torch.arange(q.size(0), device=q.device), best]
    if padding is not None:
        out = out.masked_fill(scores.isneginf().all(-1, keepdim=True), 0)
    return out.to(q.dtype)


def band_limits_reference(centre: Tensor, gate: Tensor, sigma: float, threshold: float,
                          src_len: int) -> Tuple[Tensor, Tensor]:
    half = sigma * torch.sqrt(2.0 * threshold / gate.float().clamp(min=1e-6))
    nearest = torch.round(centre)
    low = torch.minimum(torch.floor(centre - half) + 1, nearest).clamp(min=0)
    high = torch.maximum(torch.ceil(centre + half) - 1, nearest).clamp(max=src_len - 1)
    return low, high


def flexible_band_reference(q: Tensor, k: Tensor, v: Tensor, kv_rows: Tensor,
                            padding: Optional[Tensor], heads: int, centre: Tensor, gate: Tensor,
                            scaling: float, sigma: float, threshold: float):
    """The band step with every position scored and the rest masked:
    (out (rows, d), new centres (rows,), band sizes (rows,))."""
    src_len = k.size(1)
    low, high = band_limits_reference(centre.float(), gate, sigma, threshold, src_len)
    positions = torch.arange(src_len, device=q.device)
    band = (positions >= low.unsqueeze(1)) & (positions <= high.unsqueeze(1))
    if padding is not None:
        band &= ~padding.index_select(0, kv_rows // heads)
    keys = k.index_select(0, kv_rows).float()
    scores = torch.einsum("rd,rsd->rs", q.float() * scaling, keys)
    distance = positions - centre.float().unsqueeze(1)
    logits = torch.addcmul(scores, distance.square(), gate.float().unsqueeze(1),
                           value=-0.5 / sigma ** 2)
    probs = F.softmax(logits.masked_fill(~band, float("-inf")), dim=-1)
    out = torch.einsum("rs,rsd->rd", probs, v.index_select(0, kv_rows).float())
    return out.to(q.dtype), (probs * positions).sum(-1), band.sum(-1)


# --- Triton kernels -------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _hard_retrieval_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, pad_ptr, out_ptr, src_len, heads,
                               stride_q, stride_kr, stride_ks, stride_vr, stride_vs, stride_pad,
                               stride_out, head_dim, HAS_PAD: tl.constexpr, D: tl.constexpr,
                               BLOCK_S: tl.constexpr):
        r = tl.program_id(0)
        kv = tl.load(rows_ptr + r)
        dims = tl.arange(0, D)
        in_dim = dims < head_dim
        q = tl.load(q_ptr + r * stride_q + dims, mask=in_dim, other=0.0).to(tl.float32)
        best = tl.full((), float("-inf"), tl.float32)
        best_pos = tl.full((), 0, tl.int64)
        for start in range(0, src_len, BLOCK_S):
            pos = start + tl.arange(0, BLOCK_S)
            inside = pos < src_len
            keys = tl.load(k_ptr + kv * stride_kr + pos[:, None] * stride_ks + dims[None, :],
                           mask=inside[:, None] & in_dim[None, :], other=0.0).to(tl.float32)
            scores = tl.sum(keys * q[None, :], axis=1)
            valid = inside
            if HAS_PAD:
                padded = tl.load(pad_ptr + (kv // heads) * stride_pad + pos, mask=inside, other=1)
                valid = valid & (padded == 0)
            scores = tl.where(valid, scores, float("-inf"))
            block_best = tl.max(scores, axis=0)
            block_pos = tl.argmax(scores, axis=0)  # ties: the first
            better = block_best > best  # ties: the earlier block
            best_pos = tl.where(better, start + block_pos, best_pos)
            best = tl.maximum(best, block_best)
        values = tl.load(v_ptr + kv * stride_vr + best_pos * stride_vs + dims, mask=in_dim,
                         other=0.0)
        values = tl.where(best > float("-inf"), values, 0.0)
        tl.store(out_ptr + r * stride_out + dims, values, mask=in_dim)

    @triton.jit
    def _flexible_band_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, pad_ptr, centre_ptr, gate_ptr,
                              out_ptr, new_centre_ptr, scored_ptr, src_len, heads, scaling, sigma,
                              two_tau, penalty_coef, stride_q, stride_kr, stride_ks, stride_vr,
                              stride_vs, stride_pad, stride_out, head_dim, HAS_PAD: tl.constexpr,
                              D: tl.constexpr, BLOCK_S: tl.constexpr):
        r = tl.program_id(0)
        kv = tl.load(rows_ptr + r)
        dims = tl.arange(0, D)
        in_dim = dims < head_dim
        q = tl.load(q_ptr + r * stride_q + dims, mask=in_dim, other=0.0).to(tl.float32) * scaling
        c = tl.load(centre_ptr + r).to(tl.float32)
        g = tl.load(gate_ptr + r).to(tl.float32)
        # band_limits, in the kernel: the same float32 arithmetic
        half = sigma * tl.sqrt(two_tau / tl.maximum(g, 1e-6))
        nearest = tl.floor(c + 0.5)
        nearest = tl.where((nearest - c == 0.5) & (nearest % 2 != 0), nearest - 1, nearest)  # half to even
        low = tl.maximum(tl.minimum(tl.floor(c - half) + 1, nearest), 0.0)
        high = tl.minimum(tl.maximum(tl.ceil(c + half) - 1, nearest), (src_len - 1) * 1.0)
        first = low.to(tl.int32)
        stop = high.to(tl.int32) + 1
        running_max = tl.full((), float("-inf"), tl.float32)
        total = tl.full((), 0.0, tl.float32)
        centre_sum = tl.full((), 0.0, tl.float32)
        count = tl.full((), 0, tl.int64)
        acc = tl.zeros((D,), tl.float32)
        for start in range(first, stop, BLOCK_S):
            pos = start + tl.arange(0, BLOCK_S)
            valid = pos < stop
            if HAS_PAD:
                padded = tl.load(pad_ptr + (kv // heads) * stride_pad + pos, mask=valid, other=1)
                valid = valid & (padded == 0)
            keys = tl.load(k_ptr + kv * stride_kr + pos[:, None] * stride_ks + dims[None, :],
                           mask=valid[:, None] & in_dim[None, :], other=0.0).to(tl.float32)
            distance = pos.to(tl.float32) - c
            logits = tl.sum(keys * q[None, :], axis=1) + penalty_coef * g * distance * distance
            logits = tl.where(valid, logits, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(logits, axis=0))
            rescale = tl.where(new_max > float("-inf"), tl.exp(running_max - new_max), 0.0)
            weights = tl.where(valid, tl.exp(logits - new_max), 0.0)
            values = tl.load(v_ptr + kv * stride_vr + pos[:, None] * stride_vs + dims[None, :],
                             mask=valid[:, None] & in_dim[None, :], other=0.0).to(tl.float32)
            acc = acc * rescale + tl.sum(weights[:, None] * values, axis=0)
            total = total * rescale + tl.sum(weights, axis=0)
            centre_sum = centre_sum * rescale + tl.sum(weights * pos.to(tl.float32), axis=0)
            count += tl.sum(valid.to(tl.int64), axis=0)
            running_max = new_max
        tl.store(out_ptr + r * stride_out + dims, acc / total, mask=in_dim)
        tl.store(new_centre_ptr + r, centre_sum / total)
        tl.store(scored_ptr + r, count)


def _launch_layout(q, k, v, padding):
    head_dim = q.size(-1)
    return dict(stride_q=q.stride(0), stride_kr=k.stride(0), stride_ks=k.stride(1),
                stride_vr=v.stride(0), stride_vs=v.stride(1),
                stride_pad=padding.stride(0) if padding is not None else 0,
                head_dim=head_dim, HAS_PAD=padding is not None,
                D=triton.next_power_of_2(head_dim), BLOCK_S=32)


def _ready(*tensors):
    """K/V rows of unit stride along the head dimension, as the kernels read them."""
    return [t if t is None or t.stride(-1) == 1 else t.contiguous() for t in tensors]


# --- custom ops -------------------------------------------------------------------


@torch.library.custom_op("fairseq_hardattn::hard_retrieval_step", mutates_args=())
def hard_retrieval_step(q: Tensor, k: Tensor, v: Tensor, kv_rows: Tensor,
                        padding: Optional[Tensor], heads: int) -> Tensor:
    """See ``hard_retrieval_reference``; the fused kernel where it runs."""
    if not available(q):
        return hard_retrieval_reference(q, k, v, kv_rows, padding, heads)
    q, k, v = _ready(q, k, v)
    out = torch.empty_like(q)
    pad = None if padding is None else padding.to(torch.uint8).contiguous()
    _hard_retrieval_kernel[(q.size(0),)](
        q, k, v, kv_rows.contiguous(), pad if pad is not None else q, out, k.size(1), heads,
        stride_out=out.stride(0), **_launch_layout(q, k, v, pad))
    return out


@hard_retrieval_step.register_fake
def _(q, k, v, kv_rows, padding, heads):
    return torch.empty_like(q)


@torch.library.custom_op("fairseq_hardattn::flexible_band_step", mutates_args=())
def flexible_band_step(q: Tensor, k: Tensor, v: Tensor, kv_rows: Tensor, padding: Optional[Tensor],
                       heads: int, centre: Tensor, gate: Tensor, scaling: float, sigma: float,
                       threshold: float) -> Tuple[Tensor, Tensor, Tensor]:
    """See ``flexible_band_reference``; the band kernel where it runs."""
    if not available(q):
        return flexible_band_reference(q, k, v, kv_rows, padding, heads, centre, gate, scaling,
                                       sigma, threshold)
    q, k, v = _ready(q, k, v)
    rows = q.size(0)
    out = torch.empty_like(q)
    new_centre = torch.empty(rows, dtype=torch.float32, device=q.device)
    scored = torch.empty(rows, dtype=torch.int64, device=q.device)
    pad = None if padding is None else padding.to(torch.uint8).contiguous()
    _flexible_band_kernel[(rows,)](
        q, k, v, kv_rows.contiguous(), pad if pad is not None else q,
        centre.float().contiguous(), gate.float().contiguous(), out, new_centre, scored,
        k.size(1), heads, scaling, sigma, 2.0 * threshold, -0.5 / sigma ** 2,
        stride_out=out.stride(0), **_launch_layout(q, k, v, pad))
    return out, new_centre, scored


@flexible_band_step.register_fake
def _(q, k, v, kv_rows, padding, heads, centre, gate, scaling, sigma, threshold):
    rows = q.size(0)
    return (torch.empty_like(q), q.new_empty(rows, dtype=torch.float32),
            q.new_empty(rows, dtype=torch.int64))


__all__ = ["available", "flexible_band_step", "hard_retrieval_step"]
