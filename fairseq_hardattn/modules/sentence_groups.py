"""Which hypotheses of a decoding batch share a source sentence, derived from
the call itself.

Beam search decodes k hypotheses per sentence, and encoder-decoder attention
needs the encoder's keys and values once per sentence, not k times. fairseq
learns k from ``model.set_beam_size``, which its generator calls only for
k > 1 and nobody resets: a later beam-1 call, a teacher-forced forward or a
validation batch then reads other sentences' encoder states. Here k comes
from what the generator does to the encoder output of *this* call: it
expands it once, with ``new_order = [0]*k + [1]*k + ...`` (asserted on the
device, without a host sync), and later reorders keep each sentence's k
hypotheses together (as fairseq's beamable attention assumes too). The encoder records k in its
output, the decoder copies it into the incremental state of the call, and
attention modules read it there, when they cache encoder K/V and when they
reorder that cache. Without an incremental state (training, validation,
teacher forcing) every row is its own sentence.
"""

from typing import Dict, List, Optional

import torch
from torch import Tensor

# key of the count in the encoder output and in the incremental state
_KEY = "hypotheses_per_sentence"
_STATE = "fairseq_hardattn.sentence_groups"


def count_tensor(count: int) -> Tensor:
    """The count as the shape of an empty tensor: both dicts hold tensors,
    and reading a shape, unlike a value, never waits for a device."""
    return torch.empty(0, count)


def _count(value: Optional[List[Tensor]]) -> int:
    return value[0].size(1) if value else 1


def reordered_count(encoder_out: Dict[str, List[Tensor]], new_order: Tensor) -> List[Tensor]:
    """The hypotheses per sentence after ``reorder_encoder_out(encoder_out,
    new_order)``, as the value to store under ``_KEY`` in its result."""
    count = _count(encoder_out.get(_KEY))
    states = encoder_out["encoder_out"]
    rows = states[0].size(1) if states else new_order.numel()
    new_rows = new_order.numel()
    if new_rows > rows and new_rows % rows == 0:
        factor = new_rows // rows
        expected = torch.arange(rows, device=new_order.device).repeat_interleave(factor)
        # checked without waiting for the device: another expansion fails loudly
        torch._assert_async((new_order == expected).all(),
                            "fairseq-hardattn: an encoder output expanded other than sentence "
                            "by sentence (new_order = [0]*k + [1]*k + ...)")
        count *= factor
    return [count_tensor(count)]


def record_count(encoder_out: Dict[str, List[Tensor]], reordered: Dict[str, List[Tensor]],
                 new_order: Tensor) -> Dict[str, List[Tensor]]:
    """``reordered`` (an encoder's reordered output) with its hypotheses per sentence."""
    reordered[_KEY] = reordered_count(encoder_out, new_order)
    return reordered


def start_step(incremental_state, encoder_out: Optional[Dict[str, List[Tensor]]],
               grouped: bool = True):
    """Decoder: make this call's count visible to its attention modules
    (``grouped=False``: one row per sentence, e.g. decoding in training mode)."""
    count = _count(encoder_out.get(_KEY)) if (encoder_out is not None and grouped) else 1
    set_hypotheses_per_sentence(incremental_state, count)


def set_hypotheses_per_sentence(incremental_state, count: int):
    incremental_state[_STATE] = {_KEY: count_tensor(count)}


def hypotheses_per_sentence(incremental_state) -> int:
    """Attention modules: hypotheses per sentence in this decoding call (1
    without an incremental state or when the decoder recorded none)."""
    if incremental_state is None:
        return 1
    entry = incremental_state.get(_STATE)
    return entry[_KEY].size(1) if entry else 1


def sentence_order(new_order: Tensor, count: int) -> Tensor:
    """The sentence-level order of a hypothesis-level reorder."""
    if count == 1:
        return new_order
    return new_order.view(-1, count)[:, 0] // count
