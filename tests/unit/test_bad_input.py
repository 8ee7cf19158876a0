"""Bad input in memory: degenerate batches, half precision, ties."""

import pytest
import torch

import fairseq_hardattn
from fairseq_hardattn.modules import (
    FlexibleAttention,
    HardRetrievalAttention,
    LocalAttention,
)

from conftest import build_model, make_dictionary

ARCHS = fairseq_hardattn.registered_architectures()


@pytest.mark.parametrize("arch", ARCHS)
def test_eos_only_source_and_length_one_target(arch):
    """A batch whose shortest source is only EOS (the rest padding), with
    targets of length 1: finite loss and gradients, and decoding works."""
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model(arch, d, dropout=0.1, attention_dropout=0.1)
    src = torch.tensor([[4, 5, 6, d.eos()], [d.pad(), d.pad(), d.pad(), d.eos()]])
    lengths = torch.tensor([4, 1])
    prev = torch.full((2, 1), d.eos())
    logits, _ = model.train()(src, lengths, prev)
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([model.eval()], d, beam_size=4, max_len_b=5)
    with torch.no_grad():
        hyps = generator.generate(None, {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hyps) == 2 and all(len(h) == 4 for h in hyps)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("module_class, kwargs", [
    (HardRetrievalAttention, dict(self_attention=True, dropout=0.1)),
    (HardRetrievalAttention, dict(encoder_decoder_attention=True)),
    (FlexibleAttention, dict(encoder_decoder_attention=True, threshold=1.0)),
    (LocalAttention, dict(encoder_decoder_attention=True, window=3)),
])
def test_half_precision_sampling_and_penalties_stay_finite(dtype, module_class, kwargs):
    """Sampling probabilities and penalties are computed in float32, so half
    precision neither overflows (large scores) nor samples a masked key."""
    torch.manual_seed(0)
    attn = module_class(32, 4, **kwargs).to(dtype)
    x = (torch.randn(12, 3, 32) * 30).to(dtype).requires_grad_()  # large scores
    key = x if kwargs.get("self_attention") else (torch.randn(20, 3, 32) * 30).to(dtype)
    pad = None
    if not kwargs.get("self_attention"):
        pad = torch.zeros(3, 20, dtype=torch.bool)
        pad[1, :15] = True
    causal = torch.triu(torch.full((12, 12), float("-inf")), 1) if kwargs.get("self_attention") else None
    for training in (True, False):
        attn.train(training)
        out, _ = attn(x, key, key, key_padding_mask=pad, attn_mask=causal,
                      static_kv=pad is not None)
        assert out.dtype == dtype and torch.isfinite(out).all()
        if training:
            out.float().sum().backward()
            assert torch.isfinite(x.grad).all()
            assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


def test_hard_argmax_ties_pick_the_first_key():
    torch.manual_seed(0)
    attn = HardRetrievalAttention(16, 2, encoder_decoder_attention=True).eval()
    key = torch.randn(6, 1, 16)
    key[4] = key[1]  # identical keys and values at positions 1 and 4
    query = torch.randn(3, 1, 16)
    _, weights = attn(query, key, key, static_kv=True, need_head_weights=True)
    chosen = weights.argmax(-1)
    assert not (chosen == 4).any()  # on a tie, the first of equal maxima


