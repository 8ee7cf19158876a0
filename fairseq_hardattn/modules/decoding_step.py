"""How an attention module meets the decoding engine, which it never imports.

A decoding call (one ``generate`` of fairseq's generator or of the plugin's
search) keeps one ``DecodingCall`` under ``CALL_KEY`` in fairseq's
incremental state. A module reads it there; the engine
(``fairseq_hardattn.decoding``) fills it:

- ``hypotheses_per_sentence``: how many rows of the call share a source
  sentence (beam search decodes k per sentence), so that encoder-decoder
  attention keeps the encoder's keys and values once per sentence. fairseq
  learns k from ``model.set_beam_size``, which its generator calls only for
  k > 1 and nobody resets: a later beam-1 call, a teacher-forced forward or a
  validation batch then read other sentences' encoder states. Here k comes
  from the call itself: the generator expands the encoder output once, with
  ``new_order = [0]*k + [1]*k + ...`` (asserted on the device, without a host
  sync), and the encoder records k in its output (``record_count``); the
  plugin's search sets it directly.
- ``fixed_shape`` (``--decoding-engine static`` or ``graph``): every step runs
  on the same tensors, so that a CUDA graph can replay it. A module then
  writes this step's keys and values at ``position`` of caches preallocated
  to ``capacity``, and reorders every state in place (``reorder_in_place``):
  rows of finished sentences stay, computed but ignored.
- ``lineage`` (the plugin's search on a CPU): one kernel call attends a step
  over keys and values read where they were written, self-attention caches
  never reordered (their ancestors are). A module that declares a
  ``kernel_mode`` (``soft``, ``hard``, ``topk``, ``local``) hands it its
  step: its query, this step's keys and values, its caches.

Models meet the engine through ``step_engine()``: the object the decoding
package registers (``set_step_engine``) runs a decoder's fixed-shape step and
prepares a model for decoding. Without one, decoding is fairseq's.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Tuple

import torch
from torch import Tensor

CALL_KEY = "fairseq_hardattn.decoding_call"
# key of the count in an encoder's output
COUNT_KEY = "hypotheses_per_sentence"


@dataclass
class FixedShape:
    """The static step's sizes (``--decoding-engine static``/``graph``)."""

    position: Tensor  # (1,) long, on the device: where this step writes
    rows: int  # rows every step computes: the batch of the first step
    capacity: int  # positions the self-attention caches hold
    filled: int = 0  # positions written before this step (never read from the device)
    active: int = 0  # rows in use: the generator's batch of the last step


class LineageSteps(Protocol):
    """The engine's attention steps of the plugin's search on a CPU."""

    def usable(self, module, q: Tensor, modes: Tuple[str, ...] = ...) -> bool:
        """Whether ``module`` steps through the kernel here."""

    def self_attention(self, module, saved_state, q: Tensor, k: Tensor, v: Tensor, bsz: int,
                       source: Optional[Dict[str, Tensor]] = None, group: int = 1) -> Tensor:
        """A self-attention step (cross+self attention: with the encoder part
        ``source`` of ``group`` hypotheses per sentence); (bsz*heads, 1, head_dim)."""

    def source_attention(self, module, saved_state, q: Tensor, padding: Optional[Tensor]) -> Tensor:
        """A cross-attention step over the encoder K/V ``module`` cached."""

    def window_attention(self, module, q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor],
                         centres: Tensor, kv_bsz: int) -> Tensor:
        """A local-attention step over the window around each head's centre."""


@dataclass
class DecodingCall:
    """One decoding call's state, under ``CALL_KEY`` in its incremental state."""

    hypotheses_per_sentence: int = 1
    fixed_shape: Optional[FixedShape] = None
    lineage: Optional[LineageSteps] = None


def call_of(incremental_state) -> Optional[DecodingCall]:
    return None if incremental_state is None else incremental_state.get(CALL_KEY)


def start_call(incremental_state) -> DecodingCall:
    """This call's state, made on its first step."""
    call = incremental_state.get(CALL_KEY)
    if call is None:
        call = incremental_state[CALL_KEY] = DecodingCall()
    return call


def fixed_shape(incremental_state) -> Optional[FixedShape]:
    call = call_of(incremental_state)
    return None if call is None else call.fixed_shape


def lineage(incremental_state) -> Optional[LineageSteps]:
    call = call_of(incremental_state)
    return None if call is None else call.lineage


# --- the hypotheses of a sentence ---------------------------------------------------


def hypotheses_per_sentence(incremental_state) -> int:
    """1 without an incremental state or where no count was recorded."""
    call = call_of(incremental_state)
    return 1 if call is None else call.hypotheses_per_sentence


def set_hypotheses_per_sentence(incremental_state, count: int):
    """The plugin's search (and a test) say the count themselves."""
    start_call(incremental_state).hypotheses_per_sentence = count


def count_in(encoder_out: Optional[Dict[str, List[Tensor]]]) -> int:
    return (encoder_out or {}).get(COUNT_KEY, 1)


def reordered_count(encoder_out: Dict[str, List[Tensor]], new_order: Tensor) -> int:
    """The hypotheses per sentence after ``reorder_encoder_out(encoder_out, new_order)``."""
    count = count_in(encoder_out)
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
    return count


def record_count(encoder_out, reordered, new_order: Tensor):
    """``reordered`` (an encoder's reordered output) with its hypotheses per sentence."""
    reordered[COUNT_KEY] = reordered_count(encoder_out, new_order)
    return reordered


def start_step(incremental_state, encoder_out, grouped: bool = True):
    """A decoder's step: this call's count from the encoder output
    (``grouped=False``: one row per sentence, e.g. decoding in training mode)."""
    start_call(incremental_state).hypotheses_per_sentence = (
        count_in(encoder_out) if encoder_out is not None and grouped else 1)


def sentence_order(new_order: Tensor, count: int) -> Tensor:
    """The sentence-level order of a hypothesis-level reorder."""
    if count == 1:
        return new_order
    return new_order.view(-1, count)[:, 0] // count


# in an encoder-decoder attention's cache, beside its keys and values: the
# cached sentence that each sentence still searched reads (put there by the
# reader, the lineage's kernel). Where it is, finished sentences leave this
# table, not the caches: reordering it moves a few integers, not the keys
# and values of every layer.
SOURCE_SENTENCES = "source_sentences"


# --- fixed-shape caches --------------------------------------------------------------


def grown(buffer: Tensor, dim: int, capacity: int, fill) -> Tensor:
    """``buffer`` with ``dim`` extended to ``capacity`` (new positions ``fill``)."""
    shape = list(buffer.shape)
    shape[dim] = capacity - buffer.size(dim)
    return torch.cat([buffer, buffer.new_full(shape, fill)], dim=dim)


def reorder_in_place(buffer: Tensor, order: Tensor, filled: Optional[int] = None) -> Tensor:
    """Rows ``order`` of ``buffer`` into its first rows, in place (the rest
    are left as they are: rows of finished sentences, computed but ignored);
    along dim 2 only the first ``filled`` positions, which hold data."""
    rows = order.numel()
    if filled is None:
        buffer[:rows] = buffer.index_select(0, order)
    else:
        buffer[:rows, :, :filled] = buffer[:, :, :filled].index_select(0, order)
    return buffer


def reorder(buffer: Tensor, order: Tensor, shape: Optional[FixedShape],
            filled: Optional[int] = None) -> Tensor:
    """A cache in the order of the next step: in place for the fixed-shape
    step, else a new tensor."""
    if shape is not None:
        return reorder_in_place(buffer, order, filled)
    return buffer.index_select(0, order)


# --- the engine's part in a model ---------------------------------------------------


class StepEngine(Protocol):
    """What the decoding package does for a model (``set_step_engine``)."""

    def decoder_step(self, decoder, tokens: Tensor, encoder_out, incremental_state,
                     features_only: bool):
        """The decoder's step where the engine runs it (fixed-shape), else None."""

    def reordered(self, incremental_state, new_order: Tensor):
        """After the generator reordered the incremental state."""

    def model_built(self, model, task):
        """A task (fairseq's) built ``model``: the engine decodes with it."""

    def prepare_for_inference(self, model, cfg):
        """When fairseq's tools prepare ``model`` for decoding."""


_step_engine: Optional[StepEngine] = None


def set_step_engine(engine: Optional[StepEngine]):
    global _step_engine
    _step_engine = engine


def step_engine() -> Optional[StepEngine]:
    return _step_engine
