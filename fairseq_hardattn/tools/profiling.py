"""Wall-clock time spent in each attention sublayer while a model runs.

``SublayerTimer`` adds forward pre/post hooks to the decoder's attention
modules (``self_attn``, ``encoder_attn``; the encoder's ``self_attn`` too) and
sums the time between them per sublayer kind. The hooks cost two
``perf_counter`` calls per module call, small next to an attention call
(tens of microseconds or more), and the same for every model compared.

From the share of decoding time spent in attention follows the speed a
decoder with free attention would reach (``attention_free_limit``): the
ceiling any faster attention can approach.
"""

import time
from collections import defaultdict
from contextlib import contextmanager

SUBLAYERS = ("encoder self-attention", "decoder self-attention", "decoder cross-attention")


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


class SublayerTimer:
    """Seconds spent per attention sublayer kind while enabled."""

    def __init__(self, model):
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)
        self._handles = []
        self._started = {}
        for kind, module in attention_sublayers(model):
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


def attention_free_limit(total_seconds, attention_seconds, amount):
    """Rate (``amount`` per second) if attention cost nothing."""
    remaining = total_seconds - attention_seconds
    return amount / remaining if remaining > 0 else float("inf")
