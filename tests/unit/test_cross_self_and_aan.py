"""Cross+self attention (final, layer-wise, sharing) and the average attention network."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn import ConfigError
from fairseq_hardattn.models.cross_self_transformer import SHARING_LEVELS
from fairseq_hardattn.modules import AverageAttention, CrossSelfAttention, decoding_step

from conftest import assert_same_hypotheses, build_model, make_dictionary, random_batch


def hypotheses(model, dictionary, src, src_lengths, beam=4):
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_b=8)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    with torch.no_grad():
        return generator.generate(None, sample)


def test_soft_cross_self_equals_fairseqs_own_cross_self():
    """Same weights, same outputs: full forward and beam search, although the
    encoder part of K/V is kept once per sentence instead of per hypothesis."""
    torch.manual_seed(0)
    d = make_dictionary()
    fairseq_own = build_model("transformer", d, cross_self_attention=True,
                              no_cross_attention=True).eval()
    ours = build_model("transformer_cross_self", d).eval()
    assert isinstance(ours.decoder.layers[0].self_attn, CrossSelfAttention)
    ours.load_state_dict(fairseq_own.state_dict(), strict=True)
    src, src_lengths, prev = random_batch(d, [6, 3, 8, 5], tgt_len=5)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, src_lengths, prev)[0],
                                   fairseq_own(src, src_lengths, prev)[0])
    assert_same_hypotheses(hypotheses(ours, d, src, src_lengths), hypotheses(fairseq_own, d, src, src_lengths))


def test_cross_self_initialises_like_fairseqs_own_so_training_is_the_same():
    """Same seed, same initial parameters (names, shapes, values) as fairseq's
    ``--cross-self-attention --no-cross-attention``; with the equal forward
    above, training one is training the other: the Multi30k table decodes the
    one ``cross_self`` run both ways."""
    d = make_dictionary()
    torch.manual_seed(3)
    fairseq_own = build_model("transformer", d, cross_self_attention=True,
                              no_cross_attention=True).state_dict()
    torch.manual_seed(3)
    ours = build_model("transformer_cross_self", d).state_dict()
    assert ours.keys() == fairseq_own.keys()
    assert all(torch.equal(ours[name], fairseq_own[name]) for name in ours)


@pytest.mark.parametrize("beamable", [False, True])
def test_cross_self_decoding_never_copies_the_source_part(beamable, monkeypatch):
    """Our models read the hypotheses per sentence from the decoding call, so
    encoder K/V are stored per sentence (without that count: per hypothesis,
    as fairseq's own TransformerModel stores them); either way the source
    part is not copied when the beam reorders within sentences."""
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model("transformer_cross_self", d).eval()
    ungrouped = lambda *args: 1  # noqa: E731
    if not beamable:
        monkeypatch.setattr(decoding_step, "reordered_count", ungrouped)
    attn = model.decoder.layers[0].self_attn
    seen = []
    original = CrossSelfAttention.reorder_incremental_state

    def spy(self, incremental_state, new_order):
        before = self._source_state(incremental_state).get("key")
        result = original(self, incremental_state, new_order)
        after = self._source_state(incremental_state).get("key")
        if self is attn and before is not None:
            seen.append((before.size(0), new_order.numel(), before.data_ptr() == after.data_ptr()))
        return result

    src, src_lengths, _ = random_batch(d, [6, 4, 7], seed=2)
    CrossSelfAttention.reorder_incremental_state = spy
    try:
        beam_hyps = hypotheses(model, d, src, src_lengths, beam=4)
    finally:
        CrossSelfAttention.reorder_incremental_state = original
    assert seen and seen[0][:2] == ((3 if beamable else 12), 12)
    # while no sentence finishes, the source part is not touched at all
    assert all(same for stored, hyps, same in seen if stored * (4 if beamable else 1) == hyps)
    assert any(not same for stored, hyps, same in seen)  # finished sentences are dropped
    if beamable:
        monkeypatch.setattr(decoding_step, "reordered_count", ungrouped)
        assert_same_hypotheses(hypotheses(model, d, src, src_lengths, beam=4), beam_hyps)


def test_layerwise_decoder_layer_i_attends_to_encoder_layer_i():
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model("transformer_cross_self_layerwise", d).eval()
    src, src_lengths, prev = random_batch(d, [5, 3])
    keys = {}
    for i, layer in enumerate(model.decoder.layers):
        layer.self_attn.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: keys.__setitem__(i, kwargs["key"]), with_kwargs=True)
    with torch.no_grad():
        states = model.encoder(src, src_lengths)["encoder_states"]
        model(src, src_lengths, prev)
    src_len = src.size(1)
    assert len(states) == len(model.decoder.layers) + 1
    for i in range(len(model.decoder.layers)):
        torch.testing.assert_close(keys[i][:src_len], states[i + 1])
    assert not torch.allclose(keys[0][:src_len], keys[1][:src_len])


@pytest.mark.parametrize("options, message", [
    (dict(encoder_layers=3), "--encoder-layers \\(3\\) must equal --decoder-layers \\(2\\)"),
    (dict(decoder_embed_dim=16), "--encoder-embed-dim \\(32\\) must equal --decoder-embed-dim"),
    (dict(dec_cross_attn_kind="hard"), "--dec-cross-attn-kind does not apply"),
])
def test_cross_self_rejects_contradictory_options(options, message):
    with pytest.raises(ConfigError, match=message):
        build_model("transformer_cross_self_layerwise", **options)


def test_sharing_needs_equal_depths_even_for_final():
    with pytest.raises(ConfigError, match="--enc-dec-sharing attention pairs"):
        build_model("transformer_cross_self", encoder_layers=3, enc_dec_sharing="attention")


def test_aan_rejects_a_decoder_self_attention_kind():
    with pytest.raises(ConfigError, match="--dec-self-attn-kind does not apply to transformer_aan"):
        build_model("transformer_aan", dec_self_attn_kind="hard")


SHARED_NAMES = {
    "attention": ["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                  "self_attn.v_proj.weight", "self_attn.out_proj.bias"],
    "attention+ffn": ["fc1.weight", "fc2.bias"],
    "attention+ffn+norm": ["self_attn_layer_norm.weight", "final_layer_norm.bias"],
}


def _shared_up_to(level):
    names = []
    for lvl in SHARING_LEVELS[1:SHARING_LEVELS.index(level) + 1]:
        names += SHARED_NAMES[lvl]
    return names


@pytest.mark.parametrize("level", SHARING_LEVELS[1:])
def test_shared_parameters_are_one_tensor_with_gradients(level):
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model("transformer_cross_self", d, enc_dec_sharing=level)
    params = dict(model.named_parameters(remove_duplicate=False))
    for i in range(2):
        for name in _shared_up_to(level):
            assert params[f"encoder.layers.{i}.{name}"] is params[f"decoder.layers.{i}.{name}"]
    not_shared = [n for n in SHARED_NAMES.get("attention+ffn", []) if n not in _shared_up_to(level)]
    for name in not_shared:
        assert params[f"encoder.layers.0.{name}"] is not params[f"decoder.layers.0.{name}"]
    # fewer parameters at each level, as fairseq counts them (model.parameters())
    counts = [sum(p.numel() for p in build_model("transformer_cross_self", d,
                                                  enc_dec_sharing=lvl).parameters())
              for lvl in SHARING_LEVELS]
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == len(counts)
    # every (shared) parameter gets a gradient
    model.train()
    src, src_lengths, prev = random_batch(d, [5, 3])
    model(src, src_lengths, prev)[0].sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_shared_parameters_are_saved_once_and_reload_shared(tmp_path):
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model("transformer_cross_self", d, enc_dec_sharing="attention+ffn+norm")
    torch.save({"model": model.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt")["model"]
    for name in _shared_up_to("attention+ffn+norm"):
        a, b = state[f"encoder.layers.1.{name}"], state[f"decoder.layers.1.{name}"]
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()  # stored once
    fresh = build_model("transformer_cross_self", d, enc_dec_sharing="attention+ffn+norm")
    fresh.load_state_dict(state)
    assert fresh.decoder.layers[1].fc1.weight is fresh.encoder.layers[1].fc1.weight
    torch.testing.assert_close(fresh.decoder.layers[1].fc1.weight, model.encoder.layers[1].fc1.weight)


def test_average_attention_matches_the_definition():
    torch.manual_seed(0)
    aan = AverageAttention(8, 2, ffn_dim=0).double()
    x = torch.randn(5, 3, 8, dtype=torch.float64)
    out, _ = aan(x)
    for t in range(5):
        mean = x[: t + 1].mean(0)
        gates = torch.sigmoid(aan.gate(torch.cat([x[t], mean], -1)))
        torch.testing.assert_close(out[t], gates[:, :8] * x[t] + gates[:, 8:] * mean)


def test_average_attention_skips_padding_and_steps_match_full():
    torch.manual_seed(0)
    aan = AverageAttention(8, 2, ffn_dim=16).double().eval()
    x = torch.randn(6, 2, 8, dtype=torch.float64)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, :2] = True  # left-padded target
    full, _ = aan(x, key_padding_mask=pad)
    alone, _ = aan(x[2:, 1:2])
    torch.testing.assert_close(full[2:, 1:2], alone)  # the padding did not count
    state = {}
    steps = [aan(x[t:t + 1], key_padding_mask=pad[:, t:t + 1], incremental_state=state)[0]
             for t in range(6)]
    torch.testing.assert_close(torch.cat(steps), full)
    buffer = aan._get_input_buffer(state)
    assert buffer["sum"].shape == (2, 8) and buffer["steps"].shape == (2, 1)
    aan.reorder_incremental_state(state, torch.tensor([1, 1]))
    assert torch.equal(aan._get_input_buffer(state)["sum"][0], buffer["sum"][1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_average_attention_sums_in_float32_under_half_precision(dtype):
    """A half-precision cumulative sum of 3000 values ~60 overflows fp16 (max
    65504) and loses the increments in bf16; the running average must not."""
    torch.manual_seed(0)
    aan = AverageAttention(8, 2, ffn_dim=0)
    with torch.no_grad():  # gates fixed to i=0, f=1: the output is the average
        aan.gate.weight.zero_()
        aan.gate.bias.copy_(torch.cat([torch.full((8,), -30.0), torch.full((8,), 30.0)]))
    x = torch.randn(3000, 2, 8) * 5 + 60
    expected = x.cumsum(0) / torch.arange(1, 3001).view(-1, 1, 1)
    out, _ = aan.to(dtype)(x.to(dtype))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=0.0)
