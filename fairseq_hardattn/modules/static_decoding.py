"""Static-shape decoding state: what the decoding engine (``--decoding-engine
static`` or ``graph``) asks of the attention modules.

In dynamic decoding (fairseq's way, the default on a CPU), each step
concatenates the new keys and values to the self-attention caches,
reordering the beam builds new tensors, and finished sentences leave the
batch: every step has other shapes and other tensors, which no CUDA graph
can replay. The engine keeps instead, for one decoding call:

- a fixed number of rows (the batch of the first step): when the generator
  drops finished sentences, the remaining ones move to the first rows and the
  others are computed but ignored;
- self-attention caches preallocated to a capacity (doubled when full) and
  written in place at ``position``, a device tensor (no host value enters a
  step); positions not written yet are masked;
- every other state (encoder K/V, running sums, tracked centres) updated and
  reordered in place, so that its tensors stay the same across steps.

This module holds that per-call state in the incremental state and the
in-place helpers the modules share. The decoder (``models.decoding_engine``)
sets the position and grows the capacity between steps, from host-side
counts it knows without asking the device.
"""

from typing import Dict, Optional

import torch
from torch import Tensor

_STATE = "fairseq_hardattn.static_decoding"


class StaticState:
    """View of the engine's entry in an incremental state."""

    def __init__(self, entry: Dict[str, Optional[Tensor]]):
        self.entry = entry

    @property
    def position(self) -> Tensor:
        """(1,) long: where this step writes (the number of earlier steps)."""
        return self.entry["position"]

    @property
    def capacity(self) -> int:
        return self.entry["capacity"].size(1)

    @property
    def rows(self) -> int:
        """Rows every step computes: the batch of the first step."""
        return self.entry["capacity"].size(0)

    @property
    def active(self) -> int:
        """Rows in use: the generator's batch (hypotheses) of the last step."""
        return self.entry["active"].size(1)

    @property
    def filled(self) -> int:
        """Positions written before this step (host-side, never read from the
        device); this step writes position ``filled``."""
        return self.entry["filled"].size(1)


def start(incremental_state, rows: int, capacity: int, device) -> StaticState:
    incremental_state[_STATE] = {
        "position": torch.zeros(1, dtype=torch.long, device=device),
        # host-side counts as shapes of empty tensors (tensors, and free to read)
        "capacity": torch.empty(rows, capacity),
        "filled": torch.empty(0, 0),
        "active": torch.empty(0, rows),
    }
    return StaticState(incremental_state[_STATE])


def state(incremental_state) -> Optional[StaticState]:
    """The engine's state of this decoding call, or None (dynamic decoding)."""
    if incremental_state is None:
        return None
    entry = incremental_state.get(_STATE)
    return StaticState(entry) if entry else None


def set_step(static: StaticState, filled: int):
    """Before a step: ``filled`` positions were written by earlier steps."""
    static.entry["filled"] = torch.empty(0, filled)
    static.position.fill_(filled)


def set_active(static: StaticState, rows: int):
    """After a reorder: the generator's batch now has ``rows`` hypotheses."""
    static.entry["active"] = torch.empty(0, rows)


def set_capacity(static: StaticState, capacity: int):
    static.entry["capacity"] = torch.empty(static.rows, capacity)


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
