"""int8 Linear layers (decoding/int8.py, kernels/int8_linear.c): the
kernel's products are PyTorch's ops' numbers for the same quantization, bit
for bit (integer sums are exact), at every shape, row count, bias or none,
zero and non-finite rows, on one thread or two; a layer of some output rows
is those rows of the whole; a quantized model decodes the same hypotheses
through the native search, the Python search and fairseq's generator, and
stays near float32."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator
from torch import nn

from fairseq_hardattn import kernels
from fairseq_hardattn.decoding import PluginBeamSearch, native_search
from fairseq_hardattn.decoding.int8 import Int8Linear, int8_product, quantize_for_decoding, quantize_rows

from conftest import assert_same_hypotheses, decisive_model, make_dictionary, sample_of
from test_direct_step import assert_identical

needs_library = pytest.mark.skipif(not kernels.available(), reason="no native library here")


def same_numbers(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))


@needs_library
@pytest.mark.parametrize("out, inputs", [(16, 4), (17, 5), (100, 128), (1000, 128), (128, 256), (33, 1),
                                         (96, 2048)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_the_kernel_gives_the_numbers_of_pytorchs_ops(out, inputs, with_bias):
    generator = torch.Generator().manual_seed(out * inputs)
    weight = torch.randn(out, inputs, generator=generator) * 0.3
    weight[min(3, out - 1)] = 0  # a row of zeros: scale 0
    bias = torch.randn(out, generator=generator) if with_bias else None
    native = kernels.int8_linear(weight, bias)
    values, scales = quantize_rows(weight)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            for rows in (1, 2, 3, 4, 7, 8, 9, 33, 130):
                x = torch.randn(rows, inputs, generator=generator) * 3
                if rows > 2:
                    x[1] = 0
                if rows > 3:
                    x[2, 0] = float("inf")  # a row that is not finite: NaN out
                assert same_numbers(native(x), int8_product(x, values, scales, bias)), (rows, threads)
        finally:
            torch.set_num_threads(1)
    x = torch.randn(2, 3, inputs, generator=generator)  # (any leading dims)
    assert same_numbers(native(x), int8_product(x, values, scales, bias))


@needs_library
def test_activations_are_quantized_as_pytorchs_ops_quantize_them():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(50, 77, generator=generator) * torch.rand(50, 1, generator=generator) * 10
    x[3] = 0
    x[4, 5] = float("nan")
    ours, ours_scales = kernels.int8_quantize_rows(x)
    theirs, their_scales = quantize_rows(x)
    assert torch.equal(ours, theirs) and same_numbers(ours_scales, their_scales)
    assert ours.abs().max() == 127 and (ours_scales[3] == 0) and ours_scales[4].isnan()


@pytest.mark.parametrize("native", [True, False], ids=["kernel", "pytorch ops"])
def test_a_layer_of_some_rows_is_those_rows_of_the_whole(native, monkeypatch):
    if native and not kernels.available():
        pytest.skip("no native library here")
    if not native:
        monkeypatch.setattr(kernels, "int8_linear", lambda weight, bias: None)
    torch.manual_seed(0)
    layer = Int8Linear(nn.Linear(64, 300))
    assert (layer.native is not None) == native
    columns = torch.tensor([299, 0, 17, 17, 150])
    x = torch.randn(5, 64)
    assert torch.equal(layer.rows(columns)(x), layer(x)[:, columns])


def test_without_the_library_int8_decodes_the_same_numbers_in_pytorchs_ops(monkeypatch):
    d = make_dictionary(40)
    sample = sample_of(d)
    found = []
    for library in (True, False):
        with monkeypatch.context() as patch:
            if not library:
                patch.setattr(kernels, "int8_linear", lambda weight, bias: None)
            model = quantize_for_decoding(decisive_model("transformer_hard_dec_small", d).float())
            with torch.no_grad():
                found.append(PluginBeamSearch([model], d, beam_size=4, max_len_b=12).generate([model], sample))
    if kernels.available():
        assert_identical(*found)
    else:
        assert_same_hypotheses(*found)


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_soft_prenorm_small",
                                  "transformer_hard_dec_small", "transformer_topk_dec_small"])
@pytest.mark.parametrize("beam", [1, 4])
def test_a_quantized_model_decodes_one_set_of_hypotheses_by_every_search(arch, beam, monkeypatch):
    """The native search, the Python search and fairseq's generator: int8
    products depend on their row alone, so the same hypotheses and scores."""
    d = make_dictionary(40)
    model = quantize_for_decoding(decisive_model(arch, d).float())
    sample = sample_of(d)
    calls, searched = [], native_search.NativeModel.search
    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(native_search.NativeModel, "search", lambda *args: calls.append(1) or searched(*args))
        native = PluginBeamSearch([model], d, beam_size=beam, max_len_b=12).generate([model], sample)
        patch.setattr(native_search, "why_not", lambda *args: "turned off by the test")
        python = PluginBeamSearch([model], d, beam_size=beam, max_len_b=12).generate([model], sample)
        fairseqs = SequenceGenerator([model], d, beam_size=beam, max_len_b=12).generate([model], sample)
    assert calls == ([1] if kernels.available() else [])
    assert_identical(native, python)
    assert_same_hypotheses(native, fairseqs)


def test_a_quantized_layer_stays_near_float32():
    torch.manual_seed(0)
    linear = nn.Linear(256, 1000)
    x = torch.randn(32, 256)
    with torch.no_grad():
        expected = linear(x)
        error = (Int8Linear(linear)(x) - expected).norm() / expected.norm()
    assert error < 0.02
