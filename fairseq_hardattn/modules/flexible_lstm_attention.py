"""Flexible attention (Shu & Nakayama 2017) for fairseq's LSTM decoder, the
paper's own setting: see ``flexible_attention`` for the mechanism."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cps import CpsCounter
from .gate_networks import fast_tanh, gate_size
from .windows import (band_half_width, band_limits, band_threshold, first_key_positions, in_band,
                      unpadded_lengths)


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
        self.set_threshold(threshold)
        self.cps = CpsCounter()
        self.centre: Optional[Tensor] = None
        self.step_gates = []
        self.last_gates: Optional[Tensor] = None

    def set_threshold(self, threshold: Optional[float]):
        """τ for decoding; None or inf: no band."""
        self.threshold = band_threshold(threshold)

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
        positions = torch.arange(src_len, device=input.device)
        band = None if padding is None else ~padding
        if threshold is None:
            self.cps.add(available, available)
        else:  # every position scored, those outside the band masked: static shapes
            half = band_half_width(gate, self.sigma, threshold)
            in_bands = in_band(positions, *band_limits(self.centre.float(), half, src_len))
            band = in_bands if band is None else band & in_bands
            self.cps.add(band.sum(-1), available)
        keys = source_hids.transpose(0, 1)  # (bsz, srclen, dim)
        scores = (keys * query.unsqueeze(1)).sum(-1).float()
        penalty = gate.float().unsqueeze(1) * (positions - self.centre.float().unsqueeze(1)).pow(2)
        logits = scores - penalty / (2 * self.sigma ** 2)
        if band is not None:
            logits = logits.masked_fill(~band, float("-inf"))
        probs = F.softmax(logits, dim=-1)
        self.centre = (probs.detach() * positions).sum(-1)
        context = (probs.type_as(keys).unsqueeze(-1) * keys).sum(1)
        out = torch.tanh(self.output_proj(torch.cat((context, input), dim=1)))
        return out, probs.t().type_as(out)
