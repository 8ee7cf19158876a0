"""The decoder's step as direct calls (decoding/direct_step.py): for every
architecture it takes, the search's hypotheses and scores are bit for bit
those of the modules' path, in float32, with oneDNN's packed Linear layers,
int8 and bfloat16; the others keep the modules' path, with a reason."""

import pytest
import torch
from fairseq.search import Sampling

import fairseq_hardattn
from fairseq_hardattn.decoding import PluginBeamSearch, bf16, direct_step, native_search, packed_linear
from fairseq_hardattn.decoding.int8 import quantize_for_decoding

from conftest import decisive_model, make_dictionary, sample_of

ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]
# the families whose decoder layers are fairseq's with the lineage's attention kinds
DIRECT_FAMILIES = ("SoftTransformerModel", "HardRetrievalTransformerModel", "TopKRetrievalTransformerModel")


def decode(model, dictionary, sample, direct: bool, monkeypatch, **options):
    """The search's output and how many steps ran as direct calls."""
    steps = []
    original_call = direct_step.DirectStep.__call__

    def counted(self, *args):
        steps.append(1)
        return original_call(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(direct_step.DirectStep, "__call__", counted)
        # (the Python search's steps: the native search's are test_native_search.py's)
        patch.setattr(native_search, "why_not", lambda *args: "turned off by the test")
        if not direct:
            patch.setattr(direct_step, "supports", lambda decoder: "turned off by the test")
        with torch.no_grad():
            found = PluginBeamSearch([model], dictionary, **options).generate([model], sample)
    return found, len(steps)


def assert_identical(ours, theirs):
    assert len(ours) == len(theirs)
    for mine, expected in zip(ours, theirs):
        assert [h["tokens"].tolist() for h in mine] == [h["tokens"].tolist() for h in expected]
        for a, b in zip(mine, expected):
            assert torch.equal(a["positional_scores"], b["positional_scores"])
            assert torch.equal(a["score"], b["score"])


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_decodes_the_same_bits_through_direct_calls(arch, monkeypatch):
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).float()
    sample = sample_of(d)
    reason = direct_step.supports(model.decoder)
    assert (reason is None) == (type(model).__name__ in DIRECT_FAMILIES), reason
    direct, steps = decode(model, d, sample, True, monkeypatch, beam_size=4, max_len_b=12)
    modules, no_steps = decode(model, d, sample, False, monkeypatch, beam_size=4, max_len_b=12)
    assert no_steps == 0
    assert (steps > 0) == (reason is None)
    assert_identical(direct, modules)


@pytest.mark.parametrize("precision", ["onednn", "int8", "bf16"])
@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_soft_prenorm_small",
                                  "transformer_hard_dec_small"])
def test_packed_int8_and_bf16_layers_decode_the_same_bits_through_direct_calls(arch, precision, monkeypatch):
    d = make_dictionary(40)
    model = decisive_model(arch, d).float()
    if precision == "onednn":
        if not packed_linear.onednn_linear_available():
            pytest.skip("PyTorch without oneDNN")
        monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHT", 1)
    elif precision == "int8":
        quantize_for_decoding(model)
    else:
        if not bf16.cpu_bf16_feature():  # (emulated by PyTorch: the same numbers, slower)
            monkeypatch.setattr(bf16, "cpu_bf16_feature", lambda: "AMX")
        bf16.to_bf16_for_decoding(model)
    sample = sample_of(d)
    direct, steps = decode(model, d, sample, True, monkeypatch, beam_size=4, max_len_b=12)
    modules, _ = decode(model, d, sample, False, monkeypatch, beam_size=4, max_len_b=12)
    assert steps > 0
    assert_identical(direct, modules)


def test_sampling_and_greedy_search_decode_the_same_bits_through_direct_calls(monkeypatch):
    d = make_dictionary(40)
    model = decisive_model("transformer_hard_dec_small", d).float()
    sample = sample_of(d)
    for options in (dict(beam_size=3, max_len_b=10, search_strategy=Sampling(d, 5), seed=7),
                    dict(beam_size=1, max_len_b=10)):
        direct, steps = decode(model, d, sample, True, monkeypatch, **options)
        modules, _ = decode(model, d, sample, False, monkeypatch, **options)
        assert steps > 0
        assert_identical(direct, modules)


def test_a_layer_with_a_part_the_direct_step_lacks_keeps_the_modules_path():
    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    assert direct_step.supports(model.decoder) is None
    layer = model.decoder.layers[1]
    layer.ffn_layernorm = torch.nn.LayerNorm(layer.fc1.out_features)
    assert "optional parts" in direct_step.supports(model.decoder)


def test_a_forward_hook_on_a_decoder_module_keeps_the_modules_path(monkeypatch):
    """A hook may change what its module returns: the direct calls would skip it."""
    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    sample = sample_of(d)
    plain, _ = decode(model, d, sample, True, monkeypatch, beam_size=4, max_len_b=12)
    handle = model.decoder.layers[0].fc2.register_forward_hook(lambda module, args, out: out * 0.5)
    assert "hooks" in direct_step.supports(model.decoder)
    hooked, steps = decode(model, d, sample, True, monkeypatch, beam_size=4, max_len_b=12)
    assert steps == 0
    assert [h["tokens"].tolist() for s in hooked for h in s] != [h["tokens"].tolist() for s in plain for h in s] \
        or not all(torch.equal(a["score"], b["score"]) for x, y in zip(hooked, plain) for a, b in zip(x, y))
    handle.remove()
    assert direct_step.supports(model.decoder) is None


def sublayer_calls(monkeypatch):
    """Counts of the sublayer kernels' calls, by kernel."""
    from fairseq_hardattn import kernels

    calls = {}
    for name in ("self_attention_sublayer", "cross_attention_sublayer", "feed_forward_sublayer"):
        original = getattr(kernels, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(kernels, name, counted)
    return calls


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_soft_prenorm_small",
                                  "transformer_hard_dec_small", "transformer_topk_dec_small"])
def test_each_sublayer_runs_as_one_kernel_call_with_the_bits_of_its_pytorch_calls(arch, monkeypatch):
    """Where PyTorch's BLAS is found and its products give F.linear's bits,
    a step's sublayers are one kernel call each (decoder_sublayers.c; the
    layers as one call turned off): the same hypotheses and scores, bit for
    bit, as the step's PyTorch calls, in beam search (sentences finishing,
    beams reordered) and sampling."""
    from fairseq_hardattn import kernels

    monkeypatch.setattr(direct_step._NativeLayers, "of", classmethod(lambda cls, decoder, layers: None))
    if not kernels.has_blas():
        pytest.skip("no sublayer kernels here (no compiler, or PyTorch without an exported BLAS)")
    d = make_dictionary(40)
    model = decisive_model(arch, d).float()
    layer = model.decoder.layers[0]
    if not direct_step._gives_torchs_bits(layer.fc1.weight):
        pytest.skip("this CPU's BLAS products differ from F.linear's here: the sublayers stay PyTorch's calls")
    sample = sample_of(d)
    for options in (dict(beam_size=4, max_len_b=12),
                    dict(beam_size=2, max_len_b=10, search_strategy=Sampling(d, 5), seed=3)):
        with monkeypatch.context() as patch:
            calls = sublayer_calls(patch)
            native, steps = decode(model, d, sample, True, patch, **options)
        assert steps > 0 and calls == {name: steps * len(model.decoder.layers) for name in calls} and len(calls) == 3
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "has_blas", lambda: False)
            calls = sublayer_calls(patch)
            python, python_steps = decode(model, d, sample, True, patch, **options)
        assert python_steps == steps and not calls
        assert_identical(native, python)


def native_layers_or_skip(model):
    """The model's layers as one call (``_NativeLayers``), or a skip naming what is missing here."""
    from fairseq_hardattn import kernels

    if not kernels.has_blas():
        pytest.skip("no decoder step kernel here (no compiler, or PyTorch without an exported BLAS)")
    if not direct_step._gives_torchs_bits(model.decoder.layers[0].fc1.weight):
        pytest.skip("this CPU's BLAS products differ from F.linear's here: the sublayers stay PyTorch's calls")
    if kernels.layer_norm_variant(model.decoder.embed_dim, 1e-5) is None:
        pytest.skip("this PyTorch's LayerNorm sums in an order layer_norm.c does not repeat")
    return direct_step.DirectStep(model.decoder, 8).native


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_soft_prenorm_small",
                                  "transformer_hard_dec_small", "transformer_topk_dec_small"])
def test_a_steps_layers_run_as_one_kernel_call_with_the_bits_of_their_pytorch_calls(arch, monkeypatch):
    """Where every sublayer is a kernel's and every layer norm's rows are
    layer_norm.c's with PyTorch's bits, a step's layers (and the last norm)
    are one call (kernels.decoder_step): the hypotheses and scores, bit for
    bit, of a sublayer a call and of the step's PyTorch calls, in beam
    search and sampling."""
    from fairseq_hardattn import kernels

    d = make_dictionary(40)
    model = decisive_model(arch, d).float()
    assert native_layers_or_skip(model) is not None
    sample = sample_of(d)
    for options in (dict(beam_size=4, max_len_b=12),
                    dict(beam_size=2, max_len_b=10, search_strategy=Sampling(d, 5), seed=3)):
        with monkeypatch.context() as patch:
            calls, original = [], kernels.decoder_step
            patch.setattr(kernels, "decoder_step", lambda *a, **k: calls.append(1) or original(*a, **k))
            native, steps = decode(model, d, sample, True, patch, **options)
        assert steps > 0 and len(calls) == steps
        with monkeypatch.context() as patch:
            patch.setattr(direct_step._NativeLayers, "of", classmethod(lambda cls, decoder, layers: None))
            sublayers, _ = decode(model, d, sample, True, patch, **options)
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "has_blas", lambda: False)
            python, _ = decode(model, d, sample, True, patch, **options)
        assert_identical(native, sublayers)
        assert_identical(native, python)


def test_the_layers_stay_a_call_a_sublayer_where_a_norm_is_not_layer_norm_cs():
    """A norm without a weight and a bias, or over rows whose sums the
    kernel does not repeat, keeps the calls a sublayer (and PyTorch's norms)."""
    from fairseq_hardattn import kernels

    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    assert native_layers_or_skip(model) is not None
    layer = model.decoder.layers[1]
    layer.final_layer_norm = torch.nn.LayerNorm(layer.embed_dim, elementwise_affine=False)
    step = direct_step.DirectStep(model.decoder, 8)
    assert step.native is None and all(layer.native_self is not None for layer in step.layers)
    assert kernels.layer_norm_variant(100, 1e-5) is None


@pytest.mark.parametrize("n", [32, 128, 512, 1024])
def test_layer_norm_c_gives_pytorchs_bits_on_rows_it_was_not_tried_on(n):
    """The variant found once per row size holds on other rows: of other
    sizes of batch, means and scales, and a weight and bias of other values."""
    from fairseq_hardattn import kernels

    variant = kernels.layer_norm_variant(n, 1e-5)
    if variant is None:
        pytest.skip("no layer_norm kernel here, or this PyTorch's LayerNorm sums in another order")
    generator = torch.Generator().manual_seed(n)
    for rows, offset, scale in ((1, 0.0, 1.0), (7, 100.0, 0.01), (300, -3.0, 50.0)):
        x = torch.randn(rows, n, generator=generator) * scale + offset
        weight, bias = torch.rand(n, generator=generator) + 0.5, torch.randn(n, generator=generator)
        assert torch.equal(kernels.layer_norm(x, weight, bias, 1e-5, *variant),
                           torch.nn.functional.layer_norm(x, (n,), weight, bias, 1e-5))


def test_a_sublayer_keeps_pytorchs_calls_where_the_kernel_would_not_give_their_bits(monkeypatch):
    """An activation other than ReLU, a Linear layer without a bias, or a
    BLAS whose products differ from F.linear's keep the sublayer's PyTorch
    calls; the others still run as kernels (int8 layers too, on theirs)."""
    from fairseq_hardattn import kernels

    if not kernels.has_blas():
        pytest.skip("no sublayer kernels here (no compiler, or PyTorch without an exported BLAS)")
    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    if not direct_step._gives_torchs_bits(model.decoder.layers[0].fc1.weight):
        pytest.skip("this CPU's BLAS products differ from F.linear's here")
    model.decoder.layers[0].activation_fn = torch.nn.functional.gelu
    step = direct_step.DirectStep(model.decoder, 8)
    assert step.layers[0].native_feed_forward is None and step.layers[0].native_self is not None
    assert all(layer.native_feed_forward is not None for layer in step.layers[1:])
    model.decoder.layers[1].self_attn.k_proj.bias = None
    step = direct_step.DirectStep(model.decoder, 8)
    assert step.layers[1].native_self is None and step.layers[1].native_cross is not None
    monkeypatch.setattr(direct_step, "_gives_torchs_bits", lambda weight: False)
    step = direct_step.DirectStep(model.decoder, 8)
    assert all(layer.native_self is layer.native_cross is layer.native_feed_forward is None for layer in step.layers)
    monkeypatch.undo()
    quantize_for_decoding(model)  # int8 layers: the int8 kernel's products within the sublayers
    step = direct_step.DirectStep(model.decoder, 8)
    assert all(layer.native_self is not None and layer.native_cross is not None for layer in step.layers)
