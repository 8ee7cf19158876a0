"""Average attention network (Zhang, Xiong & Su 2018), a replacement for
decoder self-attention.

y_t = FFN(mean_{k<=t} x_k) (the FFN is optional), then a gate
i_t, f_t = sigmoid(W [x_t; y_t]) and the output i_t * x_t + f_t * y_t; the
decoder layer adds the residual and layer norm as for self-attention.

Training is O(T): a cumulative sum (in float32, also under fp16/bf16).
Decoding keeps a running sum and a step count per hypothesis (batch on dim 0,
reordered for beam search), so each step is O(1) in the target length.
Padded target positions (if any) are left out of the averages.
"""

from typing import Dict, Optional, Tuple

import torch
from fairseq import utils
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import FairseqDropout
from torch import Tensor, nn

from . import decoding_step


@with_incremental_state
class AverageAttention(nn.Module):
    """Drop-in for a decoder layer's ``self_attn`` (same call signature)."""

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int = 0,
                 dropout: float = 0.0, activation_fn: str = "relu"):
        super().__init__()
        self.embed_dim = embed_dim
        # fairseq's decoder layer reads these from its self_attn
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.ffn = None
        if ffn_dim:
            self.ffn = nn.Sequential(
                nn.Linear(embed_dim, ffn_dim),
                _Activation(activation_fn),
                FairseqDropout(dropout, module_name=type(self).__name__),
                nn.Linear(ffn_dim, embed_dim),
            )
        self.gate = nn.Linear(2 * embed_dim, 2 * embed_dim)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = False,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, None]:
        x = query  # (tgt_len, bsz, embed_dim)
        x32 = x.float()
        keep = None
        if key_padding_mask is not None and key_padding_mask.dim() > 0:
            keep = (~key_padding_mask.to(torch.bool)).t().unsqueeze(-1).to(x32.dtype)
            x32 = x32 * keep
        sums = x32.cumsum(dim=0)
        if keep is not None:
            counts = keep.cumsum(dim=0)
        else:
            counts = torch.arange(1, x.size(0) + 1, device=x.device, dtype=x32.dtype).view(-1, 1, 1)
        if incremental_state is not None:
            state = self._get_input_buffer(incremental_state)
            step_counts = counts[-1].expand(x.size(1), 1)
            if decoding_step.fixed_shape(incremental_state) is not None:
                # the fixed-shape step: one running sum, updated in place
                if "sum" in state:
                    state["sum"].add_(sums[-1])
                    state["steps"].add_(step_counts)
                else:
                    state = {"sum": sums[-1].clone(), "steps": step_counts.clone()}
                sums, counts = state["sum"].unsqueeze(0), state["steps"].unsqueeze(0)
            else:
                if "sum" in state:
                    sums = sums + state["sum"].unsqueeze(0)
                    counts = counts + state["steps"].unsqueeze(0)
                state = {"sum": sums[-1], "steps": counts[-1].expand(x.size(1), 1).contiguous()}
            self._set_input_buffer(incremental_state, state)
        average = (sums / counts.clamp(min=1)).type_as(x)
        if self.ffn is not None:
            average = self.ffn(average)
        input_gate, forget_gate = torch.sigmoid(self.gate(torch.cat([x, average], dim=-1))).chunk(2, dim=-1)
        return input_gate * x + forget_gate * average, None

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        state = self._get_input_buffer(incremental_state)
        if state:
            static = decoding_step.fixed_shape(incremental_state)
            state = {name: decoding_step.reorder(tensor, new_order, static)
                     for name, tensor in state.items()}
            self._set_input_buffer(incremental_state, state)
        return incremental_state

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        return self.get_incremental_state(incremental_state, "average_state") or {}

    def _set_input_buffer(self, incremental_state, buffer):
        return self.set_incremental_state(incremental_state, "average_state", buffer)


class _Activation(nn.Module):
    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.fn = utils.get_activation_fn(name)

    def forward(self, x):
        return self.fn(x)
