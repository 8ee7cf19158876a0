"""Top-k retrieval attention: the module against a dense reference, its two
limits (k = 1 is hard retrieval, k = every key is soft attention), masks,
and the --retrieval-k option through the models, fairseq-generate and the hub."""

import argparse

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn import ConfigError
from fairseq_hardattn.modules import HardRetrievalAttention, SoftAttention, TopKAttention

from conftest import build_model, decisive_model, make_dictionary, random_batch

EMBED, HEADS = 16, 2
FLOAT32_SOFTMAX = dict(rtol=1e-5, atol=1e-6)


def twin(cls, reference, **kwargs):
    """A ``cls`` attention with ``reference``'s parameters."""
    module = cls(EMBED, HEADS, self_attention=reference.self_attention,
                 encoder_decoder_attention=reference.encoder_decoder_attention, **kwargs).double()
    module.load_state_dict(reference.state_dict())
    return module


def dense_topk_reference(attn, query, key, key_padding_mask=None, attn_mask=None):
    """Top-k attention spelled out densely: every score but each row's k best
    set to -inf, then softmax(scaled) · V (rows without keys: zero)."""
    q = attn.q_proj(query) * attn.scaling
    k, v = attn.k_proj(key), attn.v_proj(key)
    tgt, bsz, _ = query.shape
    split = lambda x: x.view(x.size(0), bsz * HEADS, -1).transpose(0, 1)
    scores = torch.bmm(split(q), split(k).transpose(1, 2))
    if attn_mask is not None:
        scores = scores + attn_mask
    if key_padding_mask is not None:
        scores = scores.view(bsz, HEADS, tgt, -1).masked_fill(
            key_padding_mask[:, None, None], float("-inf")).view(bsz * HEADS, tgt, -1)
    kept = scores.topk(min(attn.k, scores.size(-1)), dim=-1).indices
    sparse = torch.full_like(scores, float("-inf")).scatter(-1, kept, scores.gather(-1, kept))
    empty = sparse.isneginf().all(-1, keepdim=True)
    probs = torch.softmax(sparse.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    out = torch.bmm(probs, split(v)).transpose(0, 1).reshape(tgt, bsz, EMBED)
    return attn.out_proj(out)


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_outputs_and_gradients_equal_the_dense_reference(k):
    torch.manual_seed(0)
    attn = TopKAttention(EMBED, HEADS, encoder_decoder_attention=True, k=k).double().train()
    query = torch.randn(4, 3, EMBED, dtype=torch.float64, requires_grad=True)
    key = torch.randn(6, 3, EMBED, dtype=torch.float64, requires_grad=True)
    padding = torch.tensor([[True, True, False, False, False, False],  # left-padded
                            [False] * 6,
                            [True] * 5 + [False]])  # one visible key, fewer than k
    out, weights = attn(query, key, key, key_padding_mask=padding, need_head_weights=True)
    expected = dense_topk_reference(attn, query, key, padding)
    # the module's softmax runs in float32, as soft attention's does
    torch.testing.assert_close(out, expected, **FLOAT32_SOFTMAX)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad((out * upstream).sum(), (query, key) + tuple(attn.parameters()))
    expected_grads = torch.autograd.grad((expected * upstream).sum(),
                                         (query, key) + tuple(attn.parameters()))
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, **FLOAT32_SOFTMAX)
    # each head's weights: the softmax over its kept keys, never on a padded one
    assert torch.all(weights[padding[None, :, None].expand_as(weights)] == 0)
    assert torch.all((weights > 0).sum(-1) <= k)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))


def test_future_positions_are_never_kept_in_self_attention():
    torch.manual_seed(1)
    attn = TopKAttention(EMBED, HEADS, self_attention=True, k=3).double().train()
    x = torch.randn(5, 2, EMBED, dtype=torch.float64)
    causal = torch.triu(torch.full((5, 5), float("-inf"), dtype=torch.float64), 1)
    out, weights = attn(x, x, x, attn_mask=causal, need_head_weights=True)
    assert torch.all(weights.triu(1) == 0)
    # the first position has one key, the second two: fewer than k, all kept
    assert torch.all(weights[..., 0, 0] == 1)
    assert torch.all((weights[..., 1, :2] > 0).sum(-1) == 2)
    torch.testing.assert_close(out, dense_topk_reference(attn, x, x, attn_mask=causal), **FLOAT32_SOFTMAX)


@pytest.mark.parametrize("training", [True, False])
def test_queries_without_keys_give_zeros_and_finite_gradients(training):
    torch.manual_seed(2)
    attn = TopKAttention(EMBED, HEADS, encoder_decoder_attention=True, k=2).double().train(training)
    query = torch.randn(3, 2, EMBED, dtype=torch.float64, requires_grad=True)
    key = torch.randn(4, 2, EMBED, dtype=torch.float64)
    padding = torch.tensor([[True] * 4, [False, False, True, True]])
    out, _ = attn(query, key, key, key_padding_mask=padding)
    torch.testing.assert_close(out[:, 0], attn.out_proj.bias.expand(3, -1))
    out.sum().backward()
    assert torch.isfinite(query.grad).all()


def test_k_of_one_is_hard_retrieval_and_k_of_every_key_is_soft_attention():
    torch.manual_seed(3)
    topk = TopKAttention(EMBED, HEADS, encoder_decoder_attention=True, k=1).double().eval()
    query = torch.randn(3, 4, EMBED, dtype=torch.float64)
    key = torch.randn(7, 4, EMBED, dtype=torch.float64)
    padding = torch.zeros(4, 7, dtype=torch.bool)
    padding[1, :3] = True
    hard = twin(HardRetrievalAttention, topk).eval()
    assert torch.equal(topk(query, key, key, key_padding_mask=padding)[0],
                       hard(query, key, key, key_padding_mask=padding)[0])
    topk.k = 7
    soft = twin(SoftAttention, topk).eval()
    torch.testing.assert_close(topk(query, key, key, key_padding_mask=padding)[0],
                               soft(query, key, key, key_padding_mask=padding)[0])


def test_k_is_validated():
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        TopKAttention(EMBED, HEADS, self_attention=True, k=0)


def test_k_of_one_decodes_the_hard_retrieval_hypotheses():
    """The same weights decoded as transformer_hard_dec_prenorm and as top-1
    retrieval: identical hypotheses and scores (beam search, incremental)."""
    dictionary = make_dictionary(30)
    hard = decisive_model("transformer_hard_dec_prenorm_small", dictionary)
    topk = build_model("transformer_topk_dec_small", dictionary, retrieval_k=1).eval()
    topk.load_state_dict(hard.state_dict())
    src, lengths, _ = random_batch(dictionary, [7, 4, 9, 5])
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    found = [SequenceGenerator([model], dictionary, beam_size=4, max_len_b=10).generate([model], sample)
             for model in (hard, topk)]
    for hard_hyps, topk_hyps in zip(*found):
        assert [h["tokens"].tolist() for h in hard_hyps] == [h["tokens"].tolist() for h in topk_hyps]
        assert [float(h["score"]) for h in hard_hyps] == [float(h["score"]) for h in topk_hyps]


def test_the_preset_puts_topk_in_decoder_attention_with_its_k():
    model = build_model("transformer_topk_dec_small", retrieval_k=3)
    layer = model.decoder.layers[0]
    assert isinstance(layer.self_attn, TopKAttention) and isinstance(layer.encoder_attn, TopKAttention)
    assert layer.self_attn.k == layer.encoder_attn.k == 3
    assert not isinstance(model.encoder.layers[0].self_attn, TopKAttention)
    assert layer.normalize_before
    preset = argparse.Namespace()
    ARCH_CONFIG_REGISTRY["transformer_topk_dec_small"](preset)
    assert preset.retrieval_k >= 1
    # switched away from topk, the preset leaves k unset (nothing would read it)
    soft = argparse.Namespace(dec_self_attn_kind="soft", dec_cross_attn_kind="soft")
    ARCH_CONFIG_REGISTRY["transformer_topk_dec_small"](soft)
    assert soft.retrieval_k is None


@pytest.mark.parametrize("arch, options, message", [
    ("transformer_soft_small", dict(retrieval_k=2), "--retrieval-k 2 has no topk sublayer"),
    ("transformer_soft_small", dict(dec_cross_attn_kind="topk"), "topk needs --retrieval-k"),
    ("transformer_topk_dec_small", dict(retrieval_k=0), "topk needs --retrieval-k K >= 1"),
])
def test_retrieval_k_options_are_config_errors(arch, options, message):
    with pytest.raises(ConfigError, match=message):
        build_model(arch, **options)


def test_topk_in_encoder_self_attention_for_the_ablation():
    model = build_model("transformer_soft_small", enc_self_attn_kind="topk", retrieval_k=2)
    assert isinstance(model.encoder.layers[0].self_attn, TopKAttention)
