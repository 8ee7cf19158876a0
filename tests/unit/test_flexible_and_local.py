"""Flexible attention, local attention and the gate fine-tuning criterion."""

import math

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from fairseq_hardattn import ConfigError, kernels
from fairseq_hardattn.criterions.label_smoothed_cross_entropy_with_gate import (
    LabelSmoothedCrossEntropyWithGateCriterion,
)
from fairseq_hardattn.modules import (FlexibleAttention, FlexibleLSTMAttention, LocalAttention,
                                       gate_networks,
                                       decoding_step)

from conftest import TinyTask, build_model, make_dictionary, random_batch

EMBED, HEADS = 16, 2


def one_step(attn, query, key, pad=None, state=None, beam=1):
    """One decoding step; a new state holds ``beam`` hypotheses per sentence."""
    if state is None:
        state = {}
        decoding_step.set_hypotheses_per_sentence(state, beam)
    out, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True, incremental_state=state)
    return out, state


def beam_copies(tensor, beam, dim):
    """Each sentence repeated for its hypotheses, as fairseq's generator does."""
    return tensor.repeat_interleave(beam, dim=dim)


@pytest.mark.parametrize("beam, far_apart", [(1, False), (2, False), (2, True)])
def test_band_is_exactly_the_positions_whose_penalty_is_below_tau(beam, far_apart):
    """beam 2: K/V kept once per sentence, read by its hypotheses, whose
    centres differ; each must still attend to exactly its own band. Far
    apart: one sentence's hypotheses lie at both ends of the source."""
    torch.manual_seed(0)
    tau, sigma, src_len, sentences = 0.8, 1.5, 30, 3
    bsz = sentences * beam
    attn = FlexibleAttention(EMBED, HEADS, encoder_decoder_attention=True, sigma=sigma,
                             threshold=tau).double().eval()
    attn.cps.enabled = True
    key = beam_copies(torch.randn(src_len, sentences, EMBED, dtype=torch.float64), beam, 1)
    pad = torch.zeros(sentences, src_len, dtype=torch.bool)
    pad[1, :4] = True
    pad = beam_copies(pad, beam, 0)
    query = torch.randn(1, bsz, EMBED, dtype=torch.float64)
    _, state = one_step(attn, query, key, pad, beam=beam)
    # previous centres anywhere in the (unpadded) sentences, so that the
    # hypotheses of a sentence lie far apart
    centres = (4 + torch.rand(bsz, HEADS) * (src_len - 5)).double()  # the penalty is float32
    if far_apart:
        centres = (12 + torch.rand(bsz, HEADS)).double()
        centres[1] = 28.0  # sentence 0, hypothesis 1
        centres[0] = 4.0
    attn.set_incremental_state(state, "flexible_centre", {"centre": centres})
    centres = centres.reshape(-1)
    attn.cps.reset()
    query2 = torch.randn(1, bsz, EMBED, dtype=torch.float64)
    out, _ = one_step(attn, query2, key, pad, state)

    gates = attn.gates(query2).permute(1, 2, 0).reshape(-1)  # per (sentence, head)
    positions = torch.arange(src_len, dtype=torch.float64)
    penalty = gates[:, None] * (positions - centres[:, None]) ** 2 / (2 * sigma ** 2)
    expected = (penalty < tau) | (positions == torch.round(centres)[:, None])
    expected &= ~pad.repeat_interleave(HEADS, dim=0)
    assert float(attn.cps.scored) == expected.sum().item()
    assert float(attn.cps.scored) < src_len * bsz * HEADS / 2  # really skipped

    # the output is attention over exactly those positions
    q = attn.q_proj(query2).view(1, bsz * HEADS, -1).transpose(0, 1) * attn.scaling
    k = attn.k_proj(key).view(src_len, bsz * HEADS, -1).transpose(0, 1)
    v = attn.v_proj(key).view(src_len, bsz * HEADS, -1).transpose(0, 1)
    logits = torch.bmm(q, k.transpose(1, 2)).squeeze(1) - penalty
    probs = torch.softmax(logits.masked_fill(~expected, float("-inf")), -1)
    manual = torch.bmm(probs.unsqueeze(1), v).transpose(0, 1).reshape(1, bsz, EMBED)
    torch.testing.assert_close(out, attn.out_proj(manual))


def test_fast_tanh_is_tanh_and_keeps_its_gradient():
    x = torch.linspace(-30, 30, 1001)
    with torch.no_grad():
        assert torch.allclose(gate_networks.fast_tanh(x), torch.tanh(x), atol=1e-6)
    x.requires_grad_(True)
    gate_networks.fast_tanh(x).sum().backward()
    assert torch.allclose(x.grad, 1 - torch.tanh(x.detach()) ** 2, atol=1e-6)


def test_infinite_threshold_scores_everything_and_matches_full_forward():
    torch.manual_seed(0)
    attn = FlexibleAttention(EMBED, HEADS, encoder_decoder_attention=True,
                             threshold=math.inf).double().eval()
    attn.cps.enabled = True
    key = torch.randn(9, 2, EMBED, dtype=torch.float64)
    queries = torch.randn(4, 2, EMBED, dtype=torch.float64)
    full, _ = attn(queries, key, key, static_kv=True)
    state = {}
    steps = [one_step(attn, queries[t:t + 1], key, state=state)[0] for t in range(4)]
    torch.testing.assert_close(torch.cat(steps), full)
    summary = attn.cps.summary()
    assert summary["cps"] == summary["global_cps"] == 9


def test_centre_state_is_reordered_for_beam_search():
    torch.manual_seed(0)
    attn = FlexibleAttention(EMBED, HEADS, encoder_decoder_attention=True, threshold=1.0).eval()
    key = torch.randn(12, 3, EMBED)
    _, state = one_step(attn, torch.randn(1, 3, EMBED), key)
    before = attn.get_incremental_state(state, "flexible_centre")["centre"].clone()
    assert before.shape == (3, HEADS)
    attn.reorder_incremental_state(state, torch.tensor([2, 2, 0]))
    after = attn.get_incremental_state(state, "flexible_centre")["centre"]
    assert torch.equal(after, before[[2, 2, 0]])


def decode_float32(attn, use_kernel, sentences, beam, src_len, steps=10):
    """A float32 beam decoding pass (left-padded sources, hypotheses reordered
    within their sentences midway): outputs, final centres, CPS summary."""
    attn.use_kernel = use_kernel
    attn.cps.enabled = True
    attn.cps.reset()
    torch.manual_seed(1)
    bsz = sentences * beam
    embed = attn.embed_dim
    key = beam_copies(torch.randn(src_len, sentences, embed), beam, 1)
    pad = torch.zeros(sentences, src_len, dtype=torch.bool)
    pad[1, :6] = True
    pad = beam_copies(pad, beam, 0)
    state, outs = {}, []
    decoding_step.set_hypotheses_per_sentence(state, beam)
    with torch.no_grad():
        for t in range(steps):
            outs.append(one_step(attn, torch.randn(1, bsz, embed), key, pad, state)[0])
            if t == steps // 2:  # the last hypothesis of each sentence replaces the others
                order = torch.arange(bsz).view(sentences, beam)[:, -1:].expand(-1, beam)
                attn.reorder_incremental_state(state, order.reshape(-1))
    centre = attn.get_incremental_state(state, "flexible_centre")["centre"]
    return torch.cat(outs), centre, attn.cps.summary()


@pytest.mark.parametrize("beam, head_dim", [(1, 8), (3, 8), (3, 32), (2, 64)])
def test_c_kernel_decodes_as_the_pytorch_ops(beam, head_dim):
    """On CPU in float32 decoding runs the C kernel; the same steps with
    PyTorch ops only (as on GPU) give the same outputs, centres and CPS.
    Head sizes 32 and 64 run the kernel's specialised copies."""
    assert kernels.available(), "the native kernels did not build"
    torch.manual_seed(0)
    attn = FlexibleAttention(HEADS * head_dim, HEADS, encoder_decoder_attention=True, sigma=2.0,
                             threshold=0.9).eval()
    calls = []
    original = kernels.flexible_band_step
    try:
        kernels.flexible_band_step = lambda *args: calls.append(1) or original(*args)
        fused = decode_float32(attn, True, sentences=4, beam=beam, src_len=30)
    finally:
        kernels.flexible_band_step = original
    reference = decode_float32(attn, False, sentences=4, beam=beam, src_len=30)
    assert len(calls) == 10  # every step
    torch.testing.assert_close(fused[0], reference[0])
    torch.testing.assert_close(fused[1], reference[1])
    assert fused[2] == reference[2]
    assert fused[2]["cps"] < fused[2]["global_cps"] / 2  # really banded


@pytest.mark.parametrize("cc, reason", [("/nonexistent/cc", "no C compiler found"),
                                        ("false", "false failed on beam_candidates.c")])
def test_without_a_c_kernel_decoding_falls_back_to_pytorch_ops(cc, reason, tmp_path,
                                                               monkeypatch, caplog):
    monkeypatch.setenv("CC", cc)
    monkeypatch.setenv("FAIRSEQ_HARDATTN_KERNEL_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_state", {})
    with pytest.raises(RuntimeError, match=reason):
        kernels.build.build()
    attn = FlexibleAttention(EMBED, HEADS, encoder_decoder_attention=True, threshold=0.9).eval()
    with caplog.at_level("WARNING"):
        out, _, summary = decode_float32(attn, True, sentences=2, beam=2, src_len=20)
    warnings = [r.getMessage() for r in caplog.records if "native kernels" in r.getMessage()]
    assert len(warnings) == 1  # once per process, not once per step
    assert f"the native kernels are unavailable ({reason}" in warnings[0]
    assert "using PyTorch ops instead" in warnings[0]
    assert torch.isfinite(out).all() and summary["cps"] < summary["global_cps"]
    assert not list(tmp_path.iterdir())  # nothing half-built left behind


def test_kernels_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FAIRSEQ_HARDATTN_KERNELS", "0")
    assert not kernels.available()


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_exact_recurrence_in_training_matches_decoding(threshold):
    # train_passes=0: training runs decoding's recurrence; with a threshold
    # and train_threshold it also attends within the same bands as decoding
    torch.manual_seed(0)
    attn = FlexibleAttention(EMBED, HEADS, encoder_decoder_attention=True, threshold=threshold,
                             train_passes=0, train_threshold=threshold is not None).double()
    key = torch.randn(11, 2, EMBED, dtype=torch.float64)
    queries = torch.randn(5, 2, EMBED, dtype=torch.float64)
    trained, _ = attn.train()(queries, key, key, static_kv=True)
    attn.eval()
    state = {}
    steps = [one_step(attn, queries[t:t + 1], key, state=state)[0] for t in range(5)]
    torch.testing.assert_close(torch.cat(steps), trained)
    if threshold is not None:  # without train_threshold, training attends everywhere
        attn.train_threshold = False
        unbanded, _ = attn.train()(queries, key, key, static_kv=True)
        assert not torch.allclose(unbanded, trained)


def test_parallel_training_under_a_tiny_threshold_attends_to_one_position():
    # the refinement passes too: a band of only the position nearest each
    # estimated centre leaves one-hot attention, with gradients still flowing
    torch.manual_seed(0)
    attn = FlexibleAttention(EMBED, HEADS, encoder_decoder_attention=True, threshold=1e-6,
                             train_threshold=True).train()
    key = torch.randn(9, 3, EMBED)
    queries = torch.randn(4, 3, EMBED, requires_grad=True)
    out, weights = attn(queries, key, key, static_kv=True, need_weights=True,
                        need_head_weights=True)
    assert torch.equal(weights.amax(-1), torch.ones_like(weights.amax(-1)))
    out.sum().backward()
    assert queries.grad is not None and attn.v_proj.weight.grad.abs().sum() > 0
    attn.train_threshold = False
    _, spread = attn(queries, key, key, static_kv=True, need_weights=True, need_head_weights=True)
    assert spread.amax(-1).min() < 1


def test_training_threshold_needs_a_finite_threshold_to_train_not_to_decode():
    model = build_model("transformer_flexible", flexible_threshold="inf",
                        flexible_train_threshold=True)
    src, lengths, prev = random_batch(model.encoder.dictionary, [5, 3])
    model.eval()(src, lengths, prev)  # decoding a band-trained model with tau = inf
    with pytest.raises(ConfigError, match="--flexible-train-threshold needs a finite"):
        model.train()(src, lengths, prev)


@pytest.mark.parametrize("beam, far_apart", [(1, False), (2, False), (2, True)])
def test_local_window_is_2d_plus_1_around_the_predicted_centre(beam, far_apart):
    torch.manual_seed(0)
    attn = LocalAttention(EMBED, HEADS, encoder_decoder_attention=True, window=2).double().eval()
    if far_apart:  # sentence 0's hypotheses at both ends: windows of their own
        fixed = torch.full((3 * beam * HEADS, 1), 8.0, dtype=torch.float64)
        fixed[:HEADS], fixed[HEADS:2 * HEADS], fixed[4 * HEADS:] = 1.0, 18.0, 17.0
        attn.centres = lambda query, starts, lengths, bsz: fixed.expand(-1, query.size(0))
    attn.cps.enabled = True
    key = beam_copies(torch.randn(20, 3, EMBED, dtype=torch.float64), beam, 1)
    pad = torch.zeros(3, 20, dtype=torch.bool)
    pad[2, :15] = True  # a 5-token sentence
    pad = beam_copies(pad, beam, 0)
    query = torch.randn(1, 3 * beam, EMBED, dtype=torch.float64)
    full, _ = attn(query, key, key, key_padding_mask=pad, static_kv=True)
    out, _ = one_step(attn, query, key, pad, beam=beam)
    torch.testing.assert_close(out, full)
    assert float(attn.cps.scored) <= 3 * beam * HEADS * 5  # 2D+1 = 5 positions at most
    summary = attn.cps.summary()
    assert summary["global_cps"] == pytest.approx((20 + 20 + 5) / 3)


@pytest.mark.parametrize("threshold, message", [
    ("0", "--flexible-threshold must be > 0"),
    ("-1.5", "--flexible-threshold must be > 0"),
    ("often", "must be a number, 'auto' or 'inf'"),
])
def test_invalid_thresholds_are_config_errors(threshold, message):
    with pytest.raises(ConfigError, match=message):
        build_model("transformer_flexible", flexible_threshold=threshold)


@pytest.mark.parametrize("arch", ["transformer_flexible", "lstm_flexible"])
def test_gate_dim_sizes_the_gate_network(arch):
    model = build_model(arch, flexible_gate_dim=3)
    attention = next(m for m in model.decoder.modules() if hasattr(m, "gate_hidden"))
    assert attention.gate_hidden.out_features == 3 and attention.gate_out.in_features == 3
    src, lengths, prev = random_batch(make_dictionary(), [5, 3])
    logits, _ = model(src, lengths, prev)
    logits.sum().backward()
    assert attention.gate_hidden.weight.grad.abs().sum() > 0
    default = build_model(arch)
    attention = next(m for m in default.decoder.modules() if hasattr(m, "gate_hidden"))
    assert attention.gate_hidden.out_features == attention.gate_hidden.in_features


@pytest.mark.parametrize("arch", ["transformer_flexible", "lstm_flexible"])
def test_gate_dim_must_be_positive(arch):
    with pytest.raises(ConfigError, match="--flexible-gate-dim must be >= 1, got 0"):
        build_model(arch, flexible_gate_dim=0)


def test_gate_dim_zero_is_an_error_in_the_modules_too():
    with pytest.raises(ValueError, match="gate_dim must be >= 1, got 0"):
        FlexibleAttention(EMBED, HEADS, encoder_decoder_attention=True, gate_dim=0)
    with pytest.raises(ValueError, match="gate_dim must be >= 1, got 0"):
        FlexibleLSTMAttention(EMBED, EMBED, EMBED, gate_dim=0)


def test_auto_threshold_needs_a_mean_source_length():
    with pytest.raises(ConfigError, match="--flexible-threshold auto needs the mean source length"):
        build_model("transformer_flexible", flexible_mean_source_length=None)


def test_auto_threshold_is_the_papers_rule():
    model = build_model("transformer_flexible", flexible_mean_source_length=24.4)
    # the paper's Table 1: tau = -log(1/24.4) = 1.38, a base-10 logarithm
    assert model.decoder.layers[0].encoder_attn.threshold == pytest.approx(1.387, abs=1e-3)


def test_soft_checkpoint_loads_into_flexible_with_fresh_gates():
    torch.manual_seed(0)
    d = make_dictionary()
    soft = build_model("hard_retrieval_transformer", d)
    flexible = build_model("transformer_flexible", d)
    fresh = {k: v.clone() for k, v in flexible.state_dict().items() if "gate_" in k}
    state = soft.state_dict()
    flexible.upgrade_state_dict(state)
    flexible.load_state_dict(state, strict=True)
    for name, value in flexible.state_dict().items():
        if "gate_" in name:
            assert torch.equal(value, fresh[name])
        else:
            assert torch.equal(value, soft.state_dict()[name])


def test_mean_gate_by_hand():
    model = build_model("transformer_flexible")
    layers = [layer.encoder_attn for layer in model.decoder.layers]
    # (tgt_len=2, bsz=2, heads=4): layer 0 all 0.2, layer 1 all 0.6 except one position
    layers[0].last_gates = torch.full((2, 2, 4), 0.2)
    layers[1].last_gates = torch.full((2, 2, 4), 0.6)
    layers[1].last_gates[1, 1] = 1.0  # position 1 of sentence 1: padding
    mask = torch.tensor([[True, True], [True, False]])
    # the three real positions average (0.2 + 0.6) / 2 = 0.4
    assert model.mean_gate(mask).item() == pytest.approx(0.4)


def test_criterion_loss_is_label_smoothed_ce_minus_beta_mean_gate():
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model("transformer_flexible", d).float().train()
    src, src_lengths, prev = random_batch(d, [5, 3], tgt_len=4)
    target = torch.cat([prev[:, 1:], torch.full((2, 1), d.eos())], dim=1)
    target[1, -1] = d.pad()
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths,
                            "prev_output_tokens": prev},
              "target": target, "ntokens": int(target.ne(d.pad()).sum())}
    task = TinyTask(d)
    criterion = LabelSmoothedCrossEntropyWithGateCriterion(
        task, sentence_avg=False, label_smoothing=0.1, gate_beta=0.25)
    torch.manual_seed(1)
    loss, sample_size, logging = criterion(model, sample)

    torch.manual_seed(1)  # the same forward again, by hand
    logits, _ = model(**sample["net_input"])
    lprobs = torch.log_softmax(logits.float(), -1)
    ce, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                    0.1, ignore_index=d.pad())
    gates = torch.stack([layer.encoder_attn.last_gates for layer in model.decoder.layers])
    real = target.ne(d.pad()).t()  # (tgt_len, bsz)
    mean_gate = gates.mean(dim=(0, 3))[real].mean()
    assert sample_size == sample["ntokens"] == 7
    torch.testing.assert_close(loss, ce - 0.25 * mean_gate * 7)
    assert logging["gate"] == pytest.approx(float(mean_gate.detach()) * 7)


def test_criterion_refuses_models_without_flexible_attention():
    d = make_dictionary()
    model = build_model("transformer_hard_dec", d).float()
    src, src_lengths, prev = random_batch(d, [5, 3], tgt_len=4)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths,
                            "prev_output_tokens": prev}, "target": prev, "ntokens": 8}
    criterion = LabelSmoothedCrossEntropyWithGateCriterion(TinyTask(d), False, 0.1)
    with pytest.raises(ConfigError, match="needs a model with flexible attention"):
        criterion(model, sample)
