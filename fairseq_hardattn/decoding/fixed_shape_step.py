"""The fixed-shape step (``--decoding-engine static`` or ``graph``): every
step after the first runs the same operations on the same tensors, so that
a CUDA graph can replay it.

In fairseq's step each step concatenates the new keys and values to the
self-attention caches, reordering the beam builds new tensors, and finished
sentences leave the batch: every step has other shapes and other tensors,
which no CUDA graph can replay. This step keeps instead, for one decoding
call (``decoding_step.FixedShape``):

- a fixed number of rows (the batch of the first step): when the generator
  drops finished sentences, the remaining ones move to the first rows and the
  others are computed but ignored;
- self-attention caches preallocated to a capacity (doubled when full) and
  written in place at ``position``, a device tensor (no host value enters a
  step); positions not written yet are masked;
- every other state (encoder K/V, running sums, tracked centres) updated and
  reordered in place, so that its tensors stay the same across steps.

The step is ours (embedding, layers, output projection): fairseq's decoder
asks the device whether a token is padding on every step, which would stall a
captured step. ``graph`` captures the layers once as a CUDA graph and replays
them on later steps (re-captured when the caches grow): the kernel launches
and the Python of a step cost one replay.
"""

import math
from typing import Dict, List, Optional

import torch
from torch import Tensor

from ..modules import decoding_step
from ..modules.decoding_step import FixedShape
from .engines import GRAPH_STEP

_GRAPH = "fairseq_hardattn.decoding_graph"
INITIAL_CAPACITY = 16


def attention_modules(decoder):
    return [m for m in decoder.modules() if hasattr(m, "grow_static_cache")]


def embed_last_token(decoder, tokens: Tensor, incremental_state) -> Tensor:
    """The decoder's input for the last token, (1, bsz, embed_dim), as
    fairseq's decoder computes it in incremental decoding."""
    positions = None
    if decoder.embed_positions is not None:
        positions = decoder.embed_positions(tokens, incremental_state=incremental_state)[:, -1:]
    x = decoder.embed_scale * decoder.embed_tokens(tokens[:, -1:])
    if decoder.quant_noise is not None:
        x = decoder.quant_noise(x)
    if decoder.project_in_dim is not None:
        x = decoder.project_in_dim(x)
    if positions is not None:
        x = x + positions
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    return decoder.dropout_module(x).transpose(0, 1)


def layers_step(decoder, x: Tensor, states: List[Tensor], padding: Optional[Tensor],
                incremental_state, step_padding: Tensor, features_only: bool = False) -> Tensor:
    """The layers, the final norm and the output projection of one step:
    (1, rows, embed_dim) -> (rows, 1, vocab) (``features_only``: (rows, 1,
    embed_dim), before the projection). ``states``: the encoder states each
    layer reads (on the first step; cached afterwards)."""
    for layer, encoder_states in zip(decoder.layers, states):
        x, _, _ = layer(x, encoder_states, padding, incremental_state,
                        self_attn_padding_mask=step_padding)
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    x = x.transpose(0, 1)
    if decoder.project_out_dim is not None:
        x = decoder.project_out_dim(x)
    return x if features_only else decoder.output_layer(x)


class CapturedStep:
    """The layers of a step as a CUDA graph over fixed input tensors."""

    def __init__(self, decoder, x, states, padding, incremental_state, step_padding):
        self.x, self.step_padding = x.clone(), step_padding.clone()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = layers_step(decoder, self.x, states, padding, incremental_state,
                                   self.step_padding)

    def __call__(self, x, step_padding):
        self.x.copy_(x)
        self.step_padding.copy_(step_padding)
        self.graph.replay()
        return self.out


def step(decoder, tokens: Tensor, encoder_out: Optional[Dict[str, List[Tensor]]],
         incremental_state, engine: str, features_only: bool = False):
    """One fixed-shape step of ``decoder`` (``static`` or ``graph``); returns
    what fairseq's decoder does: (logits (bsz, 1, vocab), extra), or the
    features before the output projection (``features_only``: never captured)."""
    active, filled = tokens.size(0), tokens.size(1) - 1
    call = decoding_step.start_call(incremental_state)
    static = call.fixed_shape
    if static is None:
        capacity = max(INITIAL_CAPACITY, 2 ** math.ceil(math.log2(filled + 1)))
        static = call.fixed_shape = FixedShape(
            position=torch.zeros(1, dtype=torch.long, device=tokens.device), rows=active,
            capacity=capacity, active=active)
    elif filled >= static.capacity:  # full: twice the room (and a new graph)
        for module in attention_modules(decoder):
            module.grow_static_cache(incremental_state, 2 * static.capacity)
        static.capacity *= 2
        incremental_state.pop(_GRAPH, None)
    static.filled = filled
    static.position.fill_(filled)
    decoding_step.start_step(incremental_state, encoder_out)

    x = embed_last_token(decoder, tokens, incremental_state)
    step_padding = tokens[:, -1:].eq(decoder.padding_idx)
    if active < static.rows:  # finished sentences left: their rows are computed, not read
        x = torch.cat([x, x.new_zeros(1, static.rows - active, x.size(2))], dim=1)
        step_padding = torch.cat([step_padding, step_padding.new_zeros(static.rows - active, 1)])
    states = decoder.encoder_states_per_layer(encoder_out)
    padding = None
    if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
        padding = encoder_out["encoder_padding_mask"][0]

    # a replayed graph runs no Python: CPS counts (--print-cps) need the eager step
    counting = any(getattr(getattr(m, "cps", None), "enabled", False)
                   for m in attention_modules(decoder))
    if engine == GRAPH_STEP and x.is_cuda and filled > 0 and not counting and not features_only:
        captured = incremental_state.get(_GRAPH)
        if captured is None:
            # this step runs eagerly (it also initialises the libraries the
            # graph calls), then the graph is recorded for the next steps
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits = layers_step(decoder, x, states, padding, incremental_state, step_padding)
            torch.cuda.current_stream().wait_stream(side)
            incremental_state[_GRAPH] = {"step": CapturedStep(
                decoder, x, states, padding, incremental_state, step_padding)}
        else:
            logits = captured["step"](x, step_padding)
    else:
        logits = layers_step(decoder, x, states, padding, incremental_state, step_padding,
                             features_only)
    return logits[:active], {"attn": [None], "inner_states": None}


def reordered(incremental_state, new_order: Tensor):
    """After the generator's reorder: the rows now in use."""
    static = decoding_step.fixed_shape(incremental_state)
    if static is not None:
        static.active = new_order.numel()
