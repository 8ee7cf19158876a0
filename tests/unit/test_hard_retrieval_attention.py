"""The hard retrieval attention module on its own."""

import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_hardattn.modules import (
    HardRetrievalAttention,
    StraightThroughRetrieval,
    sample_key_indices,
    decoding_step,
)

EMBED, HEADS = 16, 2
HEAD_DIM = EMBED // HEADS


def position_revealing_attention(**kwargs):
    """Cross-attention whose per-head output is the position of the retrieved key.

    v_proj and out_proj are the identity, and the key/value input carries its
    position in the first dimension of every head's slice.
    """
    attn = HardRetrievalAttention(EMBED, HEADS, encoder_decoder_attention=True, **kwargs)
    with torch.no_grad():
        for proj in (attn.v_proj, attn.out_proj):
            proj.weight.copy_(torch.eye(EMBED))
            proj.bias.zero_()
    return attn.double()


def keys_with_positions(src_len, bsz, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(src_len, bsz, EMBED, generator=g, dtype=torch.float64)
    for h in range(HEADS):
        x[:, :, h * HEAD_DIM] = torch.arange(src_len, dtype=torch.float64)[:, None]
    return x


def retrieved_positions(out):
    """(tgt, bsz, EMBED) -> (tgt, bsz, HEADS) integer positions."""
    return out[..., ::HEAD_DIM].round().long()


@pytest.mark.parametrize("layout", ["batch_major", "time_major"])
def test_straight_through_gradients_equal_dense_attention_gradients(layout):
    """Both memory layouts: the decoding cache (batch-major) and fresh
    projections, a transposed view of time-major memory."""
    torch.manual_seed(0)
    n, t, s, d = 3, 4, 5, 6
    probs = torch.softmax(torch.randn(n, t, s, dtype=torch.float64), -1).requires_grad_()
    if layout == "batch_major":
        values = torch.randn(n, s, d, dtype=torch.float64, requires_grad=True)
    else:
        values = torch.randn(s, n, d, dtype=torch.float64).transpose(0, 1).requires_grad_()
    indices = torch.randint(0, s, (n, t))
    upstream = torch.randn(n, t, d, dtype=torch.float64)

    out = StraightThroughRetrieval.apply(probs, values, indices)
    one_hot = F.one_hot(indices, s).to(torch.float64)
    assert torch.equal(out, torch.bmm(one_hot, values))
    grad_probs, grad_values = torch.autograd.grad((out * upstream).sum(), (probs, values))

    # grad_P is the gradient of P·V ...
    dense_probs = probs.detach().clone().requires_grad_()
    dense_out = torch.bmm(dense_probs, values.detach())
    (expected_grad_probs,) = torch.autograd.grad((dense_out * upstream).sum(), dense_probs)
    torch.testing.assert_close(grad_probs, expected_grad_probs)
    # ... and grad_V is the gradient of one_hot·V
    one_hot_values = values.detach().clone().requires_grad_()
    (expected_grad_values,) = torch.autograd.grad(
        (torch.bmm(one_hot, one_hot_values) * upstream).sum(), one_hot_values
    )
    torch.testing.assert_close(grad_values, expected_grad_values)


def test_straight_through_gradients_pass_gradcheck():
    torch.manual_seed(1)
    n, t, s, d = 2, 3, 4, 5
    indices = torch.randint(0, s, (n, t))
    values = torch.randn(n, s, d, dtype=torch.float64, requires_grad=True)
    # with respect to V the function is exactly linear: numerical == analytical
    assert torch.autograd.gradcheck(
        lambda v: StraightThroughRetrieval.apply(torch.zeros(n, t, s, dtype=torch.float64), v, indices),
        (values,),
    )


def test_sampling_never_picks_masked_keys_left_and_right_padded():
    torch.manual_seed(0)
    src_len, bsz, tgt_len = 7, 4, 5
    attn = position_revealing_attention().train()
    key = keys_with_positions(src_len, bsz)
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    pad[0, :3] = True  # left padded (fairseq's source default)
    pad[1, 5:] = True  # right padded
    pad[2, :6] = True  # only the last key is visible
    query = torch.randn(tgt_len, bsz, EMBED, dtype=torch.float64)
    for _ in range(200):
        out, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True)
        positions = retrieved_positions(out)  # (tgt, bsz, heads)
        for b in range(bsz):
            chosen = positions[:, b].unique()
            assert not pad[b, chosen].any(), f"sentence {b} retrieved padding {chosen}"
    assert (positions[:, 2] == 6).all()


def test_sampling_never_picks_future_positions_in_self_attention():
    torch.manual_seed(0)
    tgt_len, bsz = 6, 3
    attn = HardRetrievalAttention(EMBED, HEADS, self_attention=True).double().train()
    with torch.no_grad():
        for proj in (attn.v_proj, attn.out_proj):
            proj.weight.copy_(torch.eye(EMBED))
            proj.bias.zero_()
    x = keys_with_positions(tgt_len, bsz)
    causal = torch.triu(torch.full((tgt_len, tgt_len), float("-inf")), 1).double()
    for _ in range(200):
        out, _ = attn(x, x, x, attn_mask=causal)
        positions = retrieved_positions(out)
        assert (positions <= torch.arange(tgt_len)[:, None, None]).all()
        assert (positions >= 0).all()


def test_sampling_frequencies_match_attention_probabilities():
    torch.manual_seed(0)
    src_len, copies = 5, 20000
    attn = position_revealing_attention().train()
    key = keys_with_positions(src_len, 1).expand(-1, copies, -1)
    pad = torch.zeros(copies, src_len, dtype=torch.bool)
    pad[:, 0] = True
    query = torch.randn(1, 1, EMBED, dtype=torch.float64).expand(-1, copies, -1)
    scores, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True,
                     before_softmax=True)
    probs = torch.softmax(scores.view(copies, HEADS, src_len)[0], -1)  # (heads, src)
    out, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True)
    positions = retrieved_positions(out)[0]  # (copies, heads)
    for h in range(HEADS):
        freq = torch.bincount(positions[:, h], minlength=src_len).double() / copies
        # 4.5 standard errors of a binomial proportion
        tolerance = 4.5 * torch.sqrt(probs[h] * (1 - probs[h]) / copies) + 1e-9
        assert (freq - probs[h]).abs().le(tolerance).all(), (freq, probs[h])
        assert freq[0] == 0


def test_sample_key_indices_distribution_and_zero_weights():
    torch.manual_seed(0)
    weights = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0]]).expand(40000, -1)
    idx = sample_key_indices(weights)
    freq = torch.bincount(idx, minlength=5).double() / len(idx)
    assert freq[[0, 2, 4]].sum() == 0
    assert abs(freq[3] - 0.75) < 0.01


def test_eval_output_is_argmax_gather_of_raw_scores():
    torch.manual_seed(0)
    src_len, bsz, tgt_len = 6, 3, 4
    attn = HardRetrievalAttention(EMBED, HEADS, encoder_decoder_attention=True).double().eval()
    key = torch.randn(src_len, bsz, EMBED, dtype=torch.float64)
    query = torch.randn(tgt_len, bsz, EMBED, dtype=torch.float64)
    pad = torch.zeros(bsz, src_len, dtype=torch.bool)
    pad[1, :2] = True
    out, weights = attn(query, key, key, key_padding_mask=pad, static_kv=True,
                        need_weights=False)
    assert weights is None  # no dense one-hot unless weights are asked for

    q = attn.q_proj(query).view(tgt_len, bsz * HEADS, HEAD_DIM).transpose(0, 1)
    k = attn.k_proj(key).view(src_len, bsz * HEADS, HEAD_DIM).transpose(0, 1)
    v = attn.v_proj(key).view(src_len, bsz * HEADS, HEAD_DIM).transpose(0, 1)
    raw = torch.bmm(q, k.transpose(1, 2)).view(bsz, HEADS, tgt_len, src_len)
    raw = raw.masked_fill(pad[:, None, None, :], float("-inf")).view(-1, tgt_len, src_len)
    idx = raw.argmax(-1)
    gathered = torch.stack([v[n, idx[n]] for n in range(bsz * HEADS)])
    expected = attn.out_proj(gathered.transpose(0, 1).reshape(tgt_len, bsz, EMBED))
    torch.testing.assert_close(out, expected)


def test_alignment_weights_are_one_hot_in_whole_sequence_passes_only():
    torch.manual_seed(0)
    attn = HardRetrievalAttention(EMBED, HEADS, encoder_decoder_attention=True).double().eval()
    key = torch.randn(5, 2, EMBED, dtype=torch.float64)
    query = torch.randn(3, 2, EMBED, dtype=torch.float64)
    _, per_step = attn(query[:1], key, key, static_kv=True, need_weights=True,
                       incremental_state={})
    assert per_step is None  # decoding steps build no dense one-hot
    _, per_head = attn(query, key, key, static_kv=True, need_head_weights=True)
    assert per_head.shape == (HEADS, 2, 3, 5)
    assert set(per_head.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(per_head.sum(-1), torch.ones(HEADS, 2, 3, dtype=per_head.dtype))
    _, mean = attn(query, key, key, static_kv=True, need_weights=True)
    torch.testing.assert_close(mean, per_head.mean(0))


@pytest.mark.parametrize("training", [True, False])
def test_left_padded_queries_with_only_padded_past_give_zeros_not_nan(training):
    """Causal mask + key padding: the first queries of a left-padded sequence
    see only padding (the masks combine to an all-masked row)."""
    torch.manual_seed(0)
    attn = HardRetrievalAttention(EMBED, HEADS, self_attention=True, dropout=0.2)
    attn.train(training)
    x = torch.randn(5, 2, EMBED, requires_grad=True)
    causal = torch.triu(torch.full((5, 5), float("-inf")), 1)
    pad = torch.tensor([[True, True, False, False, False], [False] * 5])
    out, _ = attn(x, x, x, key_padding_mask=pad, attn_mask=causal)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:2, 0], attn.out_proj.bias.expand(2, -1))
    assert not torch.allclose(out[2:, 0], attn.out_proj.bias.expand(3, -1))
    if training:
        out.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("training", [True, False])
def test_all_masked_rows_give_zeros_not_nan(training):
    torch.manual_seed(0)
    attn = HardRetrievalAttention(EMBED, HEADS, encoder_decoder_attention=True, dropout=0.3)
    attn.train(training)
    key = torch.randn(4, 2, EMBED, requires_grad=True)
    query = torch.randn(3, 2, EMBED, requires_grad=True)
    pad = torch.tensor([[True] * 4, [False, False, True, True]])
    out, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True)
    assert torch.isfinite(out).all()
    # the all-padding sentence attends to nothing: its output is out_proj's bias
    torch.testing.assert_close(out[:, 0], attn.out_proj.bias.expand(3, -1))
    if training:
        out.sum().backward()
        for tensor in [query, key] + list(attn.parameters()):
            assert torch.isfinite(tensor.grad).all()


def test_dropout_of_every_probability_still_samples_an_unmasked_key(monkeypatch):
    torch.manual_seed(0)
    attn = position_revealing_attention(dropout=0.5).train()
    # a dropout that drops everything: sampling falls back to the undropped P
    monkeypatch.setattr(attn.dropout_module, "forward", lambda x, inplace=False: x * 0)
    key = keys_with_positions(5, 3)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[:, :2] = True
    out, _ = attn(torch.randn(2, 3, EMBED, dtype=torch.float64), key, key,
                  key_padding_mask=pad, static_kv=True)
    assert (retrieved_positions(out) >= 2).all()


def test_sentence_grouped_keys_match_per_hypothesis_keys():
    """fairseq's beamable cross-attention (one K/V per sentence) gives the same output."""
    torch.manual_seed(0)
    beam, sentences, src_len = 3, 2, 5
    attn = HardRetrievalAttention(EMBED, HEADS, encoder_decoder_attention=True).double().eval()
    key = torch.randn(src_len, sentences, EMBED, dtype=torch.float64)
    key = key.repeat_interleave(beam, dim=1)  # (src, sentences*beam, C) as the generator makes it
    pad = torch.zeros(sentences * beam, src_len, dtype=torch.bool)
    pad[:beam, :2] = True
    query = torch.randn(1, sentences * beam, EMBED, dtype=torch.float64)
    expected, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True)
    state = {}
    decoding_step.set_hypotheses_per_sentence(state, beam)
    grouped, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True,
                      incremental_state=state)
    assert attn._get_input_buffer(state)["prev_key"].size(0) == sentences
    torch.testing.assert_close(grouped, expected)
    # second step reads the cache
    again, _ = attn(query, None, None, key_padding_mask=pad, static_kv=True,
                    incremental_state=state)
    torch.testing.assert_close(again, expected)


def test_training_runs_hard_attention_not_fairseqs_soft_fast_path():
    torch.manual_seed(0)
    attn = HardRetrievalAttention(EMBED, HEADS, self_attention=True).double().train()
    with torch.no_grad():
        for proj in (attn.v_proj, attn.out_proj):
            proj.weight.copy_(torch.eye(EMBED))
            proj.bias.zero_()
    x = torch.randn(5, 2, EMBED, dtype=torch.float64)
    out, _ = attn(x, x, x)
    # every head's output is exactly one of the input rows' slices
    for h in range(HEADS):
        cols = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
        for b in range(2):
            for t in range(5):
                assert (out[t, b, cols] - x[:, b, cols]).abs().sum(-1).min() < 1e-12


def test_unsupported_options_are_refused_clearly():
    with pytest.raises(ValueError, match="add_bias_kv"):
        HardRetrievalAttention(EMBED, HEADS, self_attention=True, add_bias_kv=True)


def test_module_exposes_no_dense_tensor_in_autograd_graph():
    """Nothing of size (N, T, S) beyond P is kept for the retrieval's backward."""
    n, t, s, d = 2, 3, 7, 4
    probs = torch.rand(n, t, s, requires_grad=True)
    values = torch.randn(n, s, d, requires_grad=True)
    out = StraightThroughRetrieval.apply(probs, values, torch.zeros(n, t, dtype=torch.long))
    saved = out.grad_fn.saved_tensors
    assert all(x.numel() < n * t * s for x in saved if x.dim() == 2)
    assert not any(x.shape == (n, t, s) for x in saved)
    assert math.prod(saved[0].shape) == n * s * d


def test_straight_through_argmax_training_retrieves_what_inference_retrieves():
    torch.manual_seed(0)
    attn = position_revealing_attention(train_retrieval="argmax")
    key = keys_with_positions(7, 3)
    query = torch.randn(4, 3, EMBED, dtype=torch.float64, requires_grad=True)
    trained, _ = attn.train()(query, key, key, static_kv=True)
    inferred, _ = attn.eval()(query, key, key, static_kv=True)
    assert torch.equal(retrieved_positions(trained), retrieved_positions(inferred))
    trained.sum().backward()  # the straight-through gradient reaches the queries
    assert query.grad.abs().sum() > 0


def test_annealing_starts_soft_and_ends_hard():
    torch.manual_seed(0)
    attn = position_revealing_attention(anneal_updates=100).train()
    key = keys_with_positions(6, 2)
    query = torch.randn(3, 2, EMBED, dtype=torch.float64)
    # the soft reference, P·V per head (v_proj and out_proj are the identity)
    q = attn.q_proj(query).view(3, 2 * HEADS, HEAD_DIM).transpose(0, 1) * attn.scaling
    k = attn.k_proj(key).view(6, 2 * HEADS, HEAD_DIM).transpose(0, 1)
    v = key.view(6, 2 * HEADS, HEAD_DIM).transpose(0, 1)
    expected = torch.bmm(torch.softmax(q @ k.transpose(1, 2), -1), v)
    expected = expected.transpose(0, 1).reshape(3, 2, EMBED)
    attn.set_num_updates(0)
    assert attn.hard_share() == 0.0
    out, _ = attn(query, key, key, static_kv=True)
    torch.testing.assert_close(out, expected)
    attn.set_num_updates(50)
    assert attn.hard_share() == 0.5
    attn.set_num_updates(100)
    out, _ = attn(query, key, key, static_kv=True)
    positions = out[..., ::HEAD_DIM]
    assert torch.equal(positions, positions.round())  # every row retrieved one key


@pytest.mark.parametrize("options, message", [
    (dict(train_retrieval="gumbel"), "train_retrieval must be one of"),
    (dict(anneal_updates=-1), "anneal_updates must be >= 0"),
])
def test_training_options_are_validated(options, message):
    with pytest.raises(ValueError, match=message):
        HardRetrievalAttention(EMBED, HEADS, self_attention=True, **options)
