"""Wall-clock time spent in each attention sublayer while a model runs.

``SublayerTimer`` adds forward pre/post hooks to the decoder's attention
modules (``self_attn``, ``encoder_attn``; the encoder's ``self_attn`` too) and
sums the time between them per sublayer kind. The hooks cost two
``perf_counter`` calls per module call, small next to an attention call
(tens of microseconds or more), and the same for every model compared.

From the share of decoding time spent in attention follows the speed a
decoder with free attention would reach (the attention-free limit,
``free_limit``): the ceiling any faster attention can approach. The Q/K/V
and output projections of decoder attention are timed too
(``PROJECTIONS``): a mechanism that keeps them (hard retrieval, top-k) can at
most remove the rest of the sublayer, its core (scores, normalisation, the
weighted sum, the caches).
"""

import time
from collections import defaultdict
from contextlib import contextmanager

SUBLAYERS = ("encoder self-attention", "decoder self-attention", "decoder cross-attention")
# the Linear layers inside every decoder attention sublayer, timed as one kind
PROJECTIONS = "projections in decoder attention"
_PROJECTION_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")


def attention_sublayers(model):
    """(kind, module) for every attention sublayer of an encoder-decoder model."""
    found = []
    for side, layers in (("encoder", getattr(model.encoder, "layers", [])),
                         ("decoder", getattr(model.decoder, "layers", []))):
        for layer in layers:
            if getattr(layer, "self_attn", None) is not None:
                found.append((f"{side} self-attention", layer.self_attn))
            if side == "decoder" and getattr(layer, "encoder_attn", None) is not None:
                found.append(("decoder cross-attention", layer.encoder_attn))
    decoder_attention = getattr(model.decoder, "attention", None)  # fairseq's LSTM
    if decoder_attention is not None:
        found.append(("decoder cross-attention", decoder_attention))
    return found


def decoder_projections(model):
    """(PROJECTIONS, module) for every projection of a decoder attention sublayer."""
    return [(PROJECTIONS, projection)
            for kind, module in attention_sublayers(model) if kind.startswith("decoder")
            for projection in (getattr(module, name, None) for name in _PROJECTION_NAMES)
            if projection is not None]


class SublayerTimer:
    """Seconds spent per attention sublayer kind while enabled."""

    def __init__(self, model):
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)
        self._handles = []
        self._started = {}
        for kind, module in attention_sublayers(model) + decoder_projections(model):
            self._handles.append(module.register_forward_pre_hook(self._pre(kind, module)))
            self._handles.append(module.register_forward_hook(self._post(kind, module)))

    def _pre(self, kind, module):
        def hook(*_):
            self._started[id(module)] = time.perf_counter()
        return hook

    def _post(self, kind, module):
        def hook(*_):
            self.seconds[kind] += time.perf_counter() - self._started.pop(id(module))
            self.calls[kind] += 1
        return hook

    def reset(self):
        self.seconds.clear()
        self.calls.clear()

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []


@contextmanager
def timed_sublayers(model):
    timer = SublayerTimer(model)
    try:
        yield timer
    finally:
        timer.remove()


def decoder_attention_shares(shares):
    """(decoder attention, its core) as shares of decoding time, from a
    {kind: share} of ``SublayerTimer``'s kinds: the core is the sublayers less
    their projections."""
    attention = sum(v for k, v in shares.items() if k.startswith("decoder"))
    return attention, attention - shares.get(PROJECTIONS, 0.0)


def free_limit(rate, share):
    """``rate`` if a part taking ``share`` of the time cost nothing."""
    return rate / max(1e-9, 1 - share)
