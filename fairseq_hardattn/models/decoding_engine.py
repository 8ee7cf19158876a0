"""The decoding engine: which search decodes, and how a decoder step runs.

``--decoding-engine`` (a model option; at decoding time
``--model-overrides "{'decoding_engine': 'fairseq'}"`` or the hub's
``decoding_engine='fairseq'``):

- ``auto`` (the default), ``search``: the plugin's beam search
  (``generation/beam_search.py``: fairseq's hypotheses and scores, its own
  passes over the vocabulary), whose step is ``graph`` on CUDA and, on a
  CPU, fairseq's step with self-attention caches that are never reordered
  (``modules/lineage_decoding.py``).
- ``fairseq`` (formerly ``dynamic``, the name checkpoints may carry):
  fairseq's generator and fairseq's step. Self-attention caches grow by one
  concatenation per step, the beam is reordered into new tensors, finished
  sentences leave the batch.
- ``static``: fairseq's generator over the static step of
  ``modules.static_decoding`` — a fixed number of rows, preallocated caches
  written in place at a position held on the device, every state reordered
  in place — so that every step after the first runs the same operations on
  the same tensors. The step here is ours (embedding, layers, output
  projection): fairseq's decoder asks the device whether a token is padding
  on every step, which would stall a captured step.
- ``graph``: ``static``, with the layers of the step captured once as a CUDA
  graph and replayed on later steps (re-captured when the cache grows): the
  kernel launches and the Python of a step cost one replay. CUDA only (on
  other devices it runs as ``static``).

All of them run through fairseq-generate, fairseq-interactive and the hub
(``generation.generator_class`` picks the search; ``resolved`` the step).
"""

import math
from typing import Dict, List, Optional

import torch
from torch import Tensor

from ..modules import sentence_groups, static_decoding

ENGINES = ("auto", "search", "fairseq", "dynamic", "static", "graph")
# the step of the plugin's search on a CPU (measured: scripts/benchmark_decoding.py)
CPU_STEP = "dynamic"
_GRAPH = "fairseq_hardattn.decoding_graph"
INITIAL_CAPACITY = 16


# The commit at which scripts/gpu_check.sh last passed on a GPU (its record:
# results/gpu_check/verdict.json); None: it has not. Until it has, ``auto`` on
# CUDA is fairseq's generator and step, which fairseq runs on GPUs; ``search``
# chooses the plugin's search there.
CUDA_SEARCH_PASSED_AT = None


def cuda_auto_is_fairseqs(engine: str) -> bool:
    """Whether ``engine`` on CUDA decodes with fairseq's generator and step."""
    return engine == "auto" and CUDA_SEARCH_PASSED_AT is None


def resolved(engine: str, tokens: Tensor) -> str:
    """How a step runs: ``dynamic``, ``static`` or ``graph``. The plugin's
    search (``search``; ``auto`` unless on an unchecked GPU) steps as
    ``graph`` on CUDA and as ``CPU_STEP`` elsewhere; ``fairseq``
    (``dynamic``, its former name) as fairseq does."""
    if engine == "auto" and tokens.is_cuda and cuda_auto_is_fairseqs(engine):
        return "dynamic"
    if engine in ("auto", "search"):
        return "graph" if tokens.is_cuda else CPU_STEP
    return "dynamic" if engine == "fairseq" else engine


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
    """One decoding step of ``decoder`` (``static`` or ``graph``); returns what
    fairseq's decoder does: (logits (bsz, 1, vocab), extra), or the features
    before the output projection (``features_only``: never captured)."""
    active, filled = tokens.size(0), tokens.size(1) - 1
    static = static_decoding.state(incremental_state)
    if static is None:
        capacity = max(INITIAL_CAPACITY, 2 ** math.ceil(math.log2(filled + 1)))
        static = static_decoding.start(incremental_state, active, capacity, tokens.device)
    elif filled >= static.capacity:  # full: twice the room (and a new graph)
        for module in attention_modules(decoder):
            module.grow_static_cache(incremental_state, 2 * static.capacity)
        static_decoding.set_capacity(static, 2 * static.capacity)
        incremental_state.pop(_GRAPH, None)
    static_decoding.set_step(static, filled)
    sentence_groups.start_step(incremental_state, encoder_out)

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
    if engine == "graph" and x.is_cuda and filled > 0 and not counting and not features_only:
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
    static = static_decoding.state(incremental_state)
    if static is not None:
        static_decoding.set_active(static, new_order.numel())
