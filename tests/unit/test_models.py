"""Every registered architecture, in-process: decoding equivalences and gradients."""

import argparse

import pytest
import torch
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

import fairseq_hardattn
from fairseq_hardattn import ConfigError
from fairseq_hardattn.modules import HardRetrievalAttention, decoding_step

from conftest import build_model, make_dictionary, random_batch

ARCHS = fairseq_hardattn.registered_architectures()


def test_the_issue_presets_are_registered():
    for arch in ("transformer_hard_dec", "transformer_hard_dec_big",
                 "transformer_hard_dec_iwslt_de_en", "transformer_hard_dec_small",
                 "transformer_hard_cross", "transformer_hard_all",
                 "transformer_soft_small"):
        assert arch in ARCHS


@pytest.mark.parametrize(
    "arch, dims",
    [
        ("transformer_hard_dec", (6, 6, 512, 2048, 8)),
        ("transformer_hard_dec_big", (6, 6, 1024, 4096, 16)),
        ("transformer_hard_dec_iwslt_de_en", (6, 6, 512, 1024, 4)),
        ("transformer_hard_dec_small", (4, 4, 128, 256, 4)),
        ("transformer_soft_small", (4, 4, 128, 256, 4)),
    ],
)
def test_preset_dimensions(arch, dims):
    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.encoder_layers, args.decoder_layers, args.decoder_embed_dim,
            args.decoder_ffn_embed_dim, args.decoder_attention_heads) == dims


@pytest.mark.parametrize("prenorm, plain", [
    ("transformer_hard_dec_prenorm", "transformer_hard_dec"),
    ("transformer_hard_dec_prenorm_small", "transformer_hard_dec_small"),
    ("transformer_soft_prenorm", "transformer_soft"),
    ("transformer_soft_prenorm_small", "transformer_soft_small"),
])
def test_prenorm_presets_differ_from_theirs_only_in_the_parity_recipe(prenorm, plain):
    """The parity recipe's presets: pre-norm layers and fairseq's final layer
    norms (hard: straight-through argmax in training too), every other setting
    as the plain preset; an explicit option still wins."""
    with_norm, without = argparse.Namespace(), argparse.Namespace()
    ARCH_CONFIG_REGISTRY[prenorm](with_norm)
    ARCH_CONFIG_REGISTRY[plain](without)
    differing = {k for k in vars(with_norm) if vars(with_norm)[k] != vars(without).get(k)}
    recipe = {"encoder_normalize_before", "decoder_normalize_before"}
    if "hard" in prenorm:
        recipe.add("hard_train_retrieval")
        assert with_norm.hard_train_retrieval == "argmax" and without.hard_train_retrieval == "sample"
    assert differing == recipe
    assert with_norm.encoder_normalize_before and with_norm.decoder_normalize_before
    if prenorm.endswith("_small"):
        model = build_model(prenorm)
        assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None
        assert model.decoder.layers[0].normalize_before
        if "hard" in prenorm:
            assert model.decoder.layers[0].encoder_attn.train_retrieval == "argmax"
        assert build_model(plain).decoder.layer_norm is None
    explicit = argparse.Namespace(decoder_normalize_before=False)
    ARCH_CONFIG_REGISTRY[prenorm](explicit)
    assert explicit.decoder_normalize_before is False and explicit.encoder_normalize_before


@pytest.mark.parametrize("preset, parity_preset, recipe", [
    ("transformer_hard_dec_anneal_small", "transformer_hard_dec_prenorm_small",
     dict(decoder_attention_heads=8, hard_anneal_updates=1500)),
    ("transformer_soft_prenorm_h8_small", "transformer_soft_prenorm_small", dict(decoder_attention_heads=8)),
])
def test_curriculum_presets_are_the_parity_presets_with_their_recipe(preset, parity_preset, recipe):
    """The curriculum's presets are the models examples/multi30k trained as
    the parity presets with these options (8 decoder heads; hard: the
    soft-to-hard curriculum over 1500 updates); an explicit option still wins."""
    named, spelled_out = argparse.Namespace(), argparse.Namespace(**recipe)
    ARCH_CONFIG_REGISTRY[preset](named)
    ARCH_CONFIG_REGISTRY[parity_preset](spelled_out)
    assert vars(named) == vars(spelled_out)
    model = build_model(preset, decoder_attention_heads=None)  # the preset's, not the tiny dims'
    assert model.decoder.layers[0].self_attn.num_heads == 8
    assert model.encoder.layers[0].self_attn.num_heads == 4
    hard = [m for m in model.modules() if isinstance(m, HardRetrievalAttention)]
    assert all(m.anneal_updates == 1500 and m.train_retrieval == "argmax" for m in hard)
    assert len(hard) == (2 * model.decoder.num_layers if "hard" in preset else 0)
    explicit = argparse.Namespace(decoder_attention_heads=4, hard_anneal_updates=0)
    ARCH_CONFIG_REGISTRY[preset](explicit)
    assert explicit.decoder_attention_heads == 4 and explicit.hard_anneal_updates == 0


@pytest.mark.parametrize(
    "arch, kinds",
    [
        ("transformer_soft_small", ("soft", "soft", "soft")),
        ("transformer_hard_dec", ("soft", "hard", "hard")),
        ("transformer_hard_cross", ("soft", "soft", "hard")),
        ("transformer_hard_all", ("hard", "hard", "hard")),
    ],
)
def test_preset_attention_kinds_build_the_right_modules(arch, kinds):
    model = build_model(arch)
    built = (
        model.encoder.layers[0].self_attn,
        model.decoder.layers[0].self_attn,
        model.decoder.layers[0].encoder_attn,
    )
    for module, kind in zip(built, kinds):
        assert isinstance(module, HardRetrievalAttention) == (kind == "hard")


def test_unknown_attention_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="--dec-cross-attn-kind 'fuzzy'"):
        build_model("transformer_hard_dec", dec_cross_attn_kind="fuzzy")


def test_the_anneal_option_reaches_every_hard_retrieval_module():
    model = build_model("transformer_hard_dec_prenorm_small", hard_anneal_updates=40)
    hard = [m for m in model.modules() if isinstance(m, HardRetrievalAttention)]
    assert len(hard) == 2 * model.decoder.num_layers  # decoder self- and cross-attention
    model.set_num_updates(10)  # fairseq's trainer, before each update
    assert all(m.anneal_updates == 40 and m.hard_share() == 0.25 for m in hard)
    with pytest.raises(ConfigError, match="--hard-anneal-updates must be >= 0, got -1"):
        build_model("transformer_hard_dec_prenorm_small", hard_anneal_updates=-1)


# curricula whose every measured use made hard retrieval worse (HARD_PARITY.md)
RETIRED_OPTIONS = ("--hard-cooling-updates", "--hard-sharpening-updates", "--hard-entropy-penalty")


def test_no_model_declares_the_retired_training_options():
    """Not in any model's --help text (fairseq-train refuses them as any
    unknown option: tests/command_line/test_user_errors.py)."""
    from fairseq.models import MODEL_REGISTRY

    for model_class in set(MODEL_REGISTRY.values()):
        if model_class.__module__.startswith("fairseq_hardattn."):
            parser = argparse.ArgumentParser()
            model_class.add_args(parser)
            usage = parser.format_help()
            assert not [option for option in RETIRED_OPTIONS if option in usage], model_class


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_equals_full_forward(arch):
    torch.manual_seed(0)
    d = make_dictionary()
    # flexible attention: equal only without test-time skipping (training
    # estimates the previous centre, decoding knows it)
    model = build_model(arch, d, flexible_threshold="inf").eval()
    src, src_lengths, prev = random_batch(d, [7, 5, 3], tgt_len=6)
    with torch.no_grad():
        full, _ = model(src, src_lengths, prev)
        encoder_out = model.encoder(src, src_lengths=src_lengths)
        state = {}
        steps = [
            model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)[0][:, -1]
            for t in range(prev.size(1))
        ]
    # fairseq computes soft attention probabilities in float32 (utils.softmax)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-5, atol=1e-6)


def _hypotheses(generator, src, src_lengths):
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    with torch.no_grad():
        return [[h["tokens"].tolist() for h in hyps] for hyps in generator.generate(None, sample)]


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_on_a_batch_equals_each_sentence_alone(arch):
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model(arch, d).eval()
    generator = SequenceGenerator([model], d, beam_size=4, max_len_b=8)
    lengths = [8, 6, 5, 3]  # sorted: fairseq batches (and its LSTM) need it
    src, src_lengths, _ = random_batch(d, lengths, seed=1)
    batched = _hypotheses(generator, src, src_lengths)
    for i, n in enumerate(lengths):
        alone = _hypotheses(generator, src[i : i + 1, -n:], src_lengths[i : i + 1])
        assert alone[0] == batched[i], f"sentence {i}"


@pytest.mark.parametrize("arch", ARCHS)
def test_encoder_states_kept_once_per_sentence_decode_as_once_per_hypothesis(arch, monkeypatch):
    """Beam search keeps encoder K/V once per sentence (the count of
    hypotheses per sentence read from the call: ``decoding_step``); the
    translations are those of per-hypothesis K/V, as fairseq's
    TransformerModel keeps them."""
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model(arch, d).eval()
    generator = SequenceGenerator([model], d, beam_size=4, max_len_b=8)
    src, src_lengths, _ = random_batch(d, [8, 6, 5, 3], seed=1)
    counts = []
    original = decoding_step.hypotheses_per_sentence
    monkeypatch.setattr(decoding_step, "hypotheses_per_sentence",
                        lambda state: counts.append(original(state)) or counts[-1])
    per_sentence = _hypotheses(generator, src, src_lengths)
    if "lstm" not in arch:  # fairseq's LSTM keeps its own encoder states
        assert 4 in counts
    monkeypatch.setattr(decoding_step, "reordered_count", lambda *args: 1)
    counts.clear()
    assert _hypotheses(generator, src, src_lengths) == per_sentence
    assert set(counts) <= {1}


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_gets_a_gradient(arch):
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model(arch, d, dropout=0.1, attention_dropout=0.1).train()
    src, src_lengths, prev = random_batch(d, [7, 5, 3], tgt_len=6)
    logits, _ = model(src, src_lengths, prev)
    torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), torch.randint(4, len(d), (logits.numel() // logits.size(-1),))
    ).backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize("trained, decoded", [("soft", "hard"), ("hard", "soft")])
def test_a_model_trained_with_one_kind_decodes_with_the_other(trained, decoded):
    """Table 4's switch: same parameters, only the decoder attention kind changes."""
    d = make_dictionary()

    def model_with(kind):
        return build_model("hard_retrieval_transformer", d,
                           dec_self_attn_kind=kind, dec_cross_attn_kind=kind).eval()

    as_trained, switched = model_with(trained), model_with(decoded)
    switched.load_state_dict(as_trained.state_dict(), strict=True)
    assert isinstance(switched.decoder.layers[0].encoder_attn,
                      HardRetrievalAttention) == (decoded == "hard")
    src, src_lengths, prev = random_batch(d, [4, 6])
    with torch.no_grad():
        before = as_trained(src, src_lengths, prev)[0]
        after = switched(src, src_lengths, prev)[0]
    assert not torch.allclose(before, after)  # the decoding kind changed the computation
