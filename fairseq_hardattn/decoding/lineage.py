"""Attention steps of the plugin's search on a CPU (``beam_search``), over
keys and values read where they were written: one C kernel call per
sublayer and step (``kernels/step_attention.c``).

Self-attention: fairseq reorders every self-attention cache on every step
(an ``index_select`` of each layer's keys and values) and grows it by a
concatenation: two copies of every cache per step. Here each step's keys and values are written once, in
place, into time-major buffers (position, row, head, dim) sized for the
longest output, and a table of ancestors (hypothesis, position) -> the row
its prefix had at that position is what the search reorders: integers, one
table for all layers.

Cross-attention reads the encoder's keys and values cached once per
sentence, in place (``source_attention``): fairseq's path, scores,
softmax and weighted values as separate operators over beam-grouped
tensors, cost a soft model's step more than the kernel's single pass.
Cross+self attention is both at once: one softmax (or argmax) over the
sentence's encoder part and the hypothesis's lineage.

Local attention's step is the same kernel over a window around each
head's centre (``window_attention``).

The search owns the state (``Lineage``: ``start``, ``set_step``,
``reorder``), which it puts in the call's ``DecodingCall``; an attention
class opts in with its ``kernel_mode`` (``soft``, ``hard``, ``topk``,
``local``) and hands its step to it (``modules/decoding_step.py``). Modules
without one keep their own caches, reordered as fairseq does.
"""

from typing import Dict, Optional

import torch
from torch import Tensor

from .. import kernels
from ..modules import decoding_step

# modes that attend every position (self-, cross- and cross+self attention);
# "local" reads a window, and its module asks for ``window_attention`` itself
EVERY_POSITION = ("soft", "hard", "topk")


class Lineage:
    """One decoding call's lineage: ``rows`` hypotheses, at most ``capacity``
    steps; ``ancestors[i, t]``: the row whose buffers hold hypothesis i's
    position t. Implements ``decoding_step.LineageSteps``."""

    def __init__(self, rows: int, capacity: int):
        self.ancestors = torch.empty(rows, capacity, dtype=torch.int64)
        self.rows = rows  # rows of the buffers
        self.length = 0  # positions written

    @classmethod
    def start(cls, incremental_state, rows: int, capacity: int) -> "Lineage":
        """For one decoding call, in its ``DecodingCall``."""
        lineage = decoding_step.start_call(incremental_state).lineage = cls(rows, capacity)
        return lineage

    def set_step(self, step: int, rows: int):
        """Before step ``step``: every hypothesis writes this position in its own row."""
        self.ancestors[:rows, step] = torch.arange(rows)
        self.length = step + 1

    def reorder(self, order: Tensor):
        """After a step: hypothesis i continues ``order[i]`` (fewer rows where
        finished sentences left): its ancestors are that one's."""
        moved = self.ancestors.new_empty((order.numel(), self.ancestors.size(1)))
        moved[:, :self.length] = self.ancestors[:, :self.length].index_select(0, order)
        self.ancestors = moved

    def usable(self, module, q: Tensor, modes=EVERY_POSITION) -> bool:
        """Whether ``module`` attends through the step kernel here."""
        return (module.kernel_mode in modes and q.device.type == "cpu" and q.dtype == torch.float32
                and kernels.available() and module.kernel_keys <= kernels.step_max_k())

    def self_attention(self, module, saved_state, q: Tensor, k: Tensor, v: Tensor, bsz: int,
                       source: Optional[Dict[str, Tensor]] = None, group: int = 1) -> Tensor:
        """One step of ``module``'s self-attention: q, k, v (bsz*heads, 1,
        head_dim) unscaled; this step's k and v are written into the module's
        buffers. ``source``: cross+self attention's encoder part ("key",
        "value" (sentences, heads, src_len, head_dim), "padding_mask"),
        ``group`` hypotheses per sentence, attended with the lineage as one
        attention. Returns (bsz*heads, 1, head_dim)."""
        heads, head_dim = module.num_heads, module.head_dim
        keys = saved_state.get("lineage_keys")
        if keys is None:
            keys = k.new_empty(self.ancestors.size(1), self.rows, heads, head_dim)
            saved_state["lineage_keys"], saved_state["lineage_values"] = keys, torch.empty_like(keys)
        values = saved_state["lineage_values"]
        keys[self.length - 1, :bsz] = k.view(bsz, heads, head_dim)
        values[self.length - 1, :bsz] = v.view(bsz, heads, head_dim)
        if source is not None:
            source = _source_part(source, "key", "value", source.get("padding_mask"), group)
        return _kernel_step(module, q, module.kernel_mode, source=source,
                            lineage=(keys, values, self.ancestors, self.length))

    def self_attention_sublayer(self, saved_state, x: Tensor, residual: Tensor, attention) -> Optional[Tensor]:
        """``residual`` + a module's self-attention of ``x`` (rows,
        embed_dim) with its projections (``attention``:
        ``kernels.attention_sublayer``) as one kernel call: what
        ``self_attention`` and the projections around it compute; None before
        its buffers exist."""
        keys = saved_state.get("lineage_keys")
        if keys is None:
            return None
        return kernels.self_attention_sublayer(attention, x, residual, keys, saved_state["lineage_values"],
                                               self.ancestors, self.length)

    def source_attention_sublayer(self, saved_state, x: Tensor, residual: Tensor, padding: Optional[Tensor],
                                  attention) -> Tensor:
        """``residual`` + a module's cross-attention of ``x`` with its
        projections (``attention``) as one kernel call: what
        ``source_attention`` and the projections around it compute."""
        return kernels.cross_attention_sublayer(attention, x, residual,
                                                self.cached_source(saved_state, padding, x.size(0)))

    def cached_source(self, saved_state: Dict[str, Tensor], padding: Optional[Tensor], rows: int):
        """The kernel's source part of cross-attention's cached encoder K/V for ``rows`` hypotheses."""
        sentences = saved_state.get(decoding_step.SOURCE_SENTENCES)
        if sentences is None:  # (from now on finished sentences leave this table, not the caches)
            sentences = saved_state[decoding_step.SOURCE_SENTENCES] = torch.arange(saved_state["prev_key"].size(0))
        group = rows // sentences.numel()  # per sentence
        return _source_part(saved_state, "prev_key", "prev_value", padding, group, sentences)

    def source_attention(self, module, saved_state: Dict[str, Tensor], q: Tensor,
                         padding: Optional[Tensor]) -> Tensor:
        """One step of ``module``'s cross-attention over the encoder K/V it
        cached ("prev_key", "prev_value": (sentences, heads, src_len,
        head_dim)), the hypotheses grouped by sentence, each sentence's caches
        found through the table ``decoding_step.SOURCE_SENTENCES`` kept beside
        them: q (bsz*heads, 1, head_dim) unscaled; padding (cached sentences,
        src_len) or None. Returns (bsz*heads, 1, head_dim)."""
        return _kernel_step(module, q, module.kernel_mode,
                            source=self.cached_source(saved_state, padding, q.size(0) // module.num_heads))

    def window_attention(self, module, q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor],
                         centres: Tensor, kv_bsz: int) -> Tensor:
        """One step of local attention (``module.window``, ``module.sigma``):
        q (bsz*heads, 1, head_dim) unscaled; k, v (kv_bsz*heads, src_len,
        head_dim) contiguous, hypotheses grouped by sentence; padding (kv_bsz,
        src_len) or None; centres (bsz*heads,). Returns (bsz*heads, 1, head_dim)."""
        return attend_window(module, q, k, v, padding, centres, kv_bsz)


def attend_window(module, q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor],
                  centres: Tensor, kv_bsz: int) -> Tensor:
    """``Lineage.window_attention``, which reads no lineage."""
    shape = (kv_bsz, module.num_heads, k.size(1), module.head_dim)
    group = q.size(0) // module.num_heads // kv_bsz
    return _kernel_step(module, q, "local",
                        source=kernels.source_part(k.view(shape), None, v.view(shape), padding, group),
                        local=(centres.float().contiguous(), float(module.window),
                               2 * module.sigma ** 2))


def _source_part(state: Dict[str, Tensor], key: str, value: str, padding: Optional[Tensor],
                 group: int, sentences: Optional[Tensor] = None):
    """The kernel's source part of the encoder K/V cached in ``state``. On
    the first step the keys and values are made contiguous in ``state`` (as
    projected they are time-major: a hypothesis's source positions lie a
    batch apart, a cache miss each) and the keys' transposed copy is kept
    beside them (reordered with them, if they are)."""
    transposed = key + "_transposed"
    if transposed not in state:
        state[key], state[value] = state[key].contiguous(), state[value].contiguous()
        state[transposed] = kernels.transposed_keys(state[key])
    return kernels.source_part(state[key], state[transposed], state[value], padding, group, sentences)


def _kernel_step(module, q: Tensor, mode: str, **parts) -> Tensor:
    """``kernels.step_attention`` for ``module``'s heads: q (bsz*heads, 1,
    head_dim) unscaled; returns the output in the same shape."""
    heads, head_dim = module.num_heads, module.head_dim
    bsz = q.size(0) // heads
    out = q.new_empty(bsz, heads, head_dim)
    kernels.step_attention(q.reshape(bsz, heads, head_dim).contiguous(), module.scaling, mode,
                           module.kernel_keys, out, **parts)
    return out.view(bsz * heads, 1, head_dim)
