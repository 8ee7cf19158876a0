"""panel_linear.c: float32 products of few rows in the BLAS's order.

The kernel computes one formula (the bias, then block by block of the inner
dimension a sum from zero, one fused multiply-add at a time), checked here
against that formula in exact arithmetic; a layer's panels replace PyTorch's
product only for the row counts where they gave its bits, so every product
through them equals ``F.linear``'s, whether or not this CPU's BLAS keeps the
formula."""

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fairseq_hardattn import kernels

pytestmark = pytest.mark.skipif(kernels.native() is None, reason="the native library is not built here")


def to_float32(value: Fraction) -> Fraction:
    """``value`` rounded to the nearest float32 (ties to even), exactly."""
    if value == 0:
        return Fraction(0)
    sign, magnitude = (-1 if value < 0 else 1), abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    while Fraction(2) ** exponent > magnitude:
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= magnitude:
        exponent += 1
    ulp = Fraction(2) ** (max(exponent, -126) - 23)
    units = magnitude / ulp
    whole = units.numerator // units.denominator
    rest = units - whole
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2):
        whole += 1
    return sign * whole * ulp


def formula(x, weight, bias, block):
    """The panels' formula, each fused multiply-add and sum rounded once."""
    rows, inner = x.shape
    out = weight.shape[0]
    xs = [[Fraction(float(v)) for v in row] for row in x]
    ws = [[Fraction(float(v)) for v in row] for row in weight]
    y = np.zeros((rows, out), dtype=np.float32)
    for r in range(rows):
        for o in range(out):
            total = Fraction(float(bias[o])) if bias is not None else Fraction(0)
            for start in range(0, inner, block):
                partial = Fraction(0)
                for k in range(start, min(start + block, inner)):
                    partial = to_float32(xs[r][k] * ws[o][k] + partial)
                total = to_float32(total + partial)
            y[r, o] = float(total)
    return torch.from_numpy(y)


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("rows, out, inner, block", [(5, 20, 40, 16), (4, 16, 24, 24), (1, 3, 7, 64), (9, 33, 10, 4)])
def test_the_kernel_computes_its_formula(rows, out, inner, block, with_bias):
    generator = torch.Generator().manual_seed(rows * 1000 + out)
    x = torch.randn(rows, inner, generator=generator)
    weight = torch.randn(out, inner, generator=generator)
    bias = torch.randn(out, generator=generator) if with_bias else None
    got = kernels.native().panel_product(x, weight, bias, block)
    assert torch.equal(got, formula(x, weight, bias, block))


def test_a_transposed_weight_packs_as_the_same_weight():
    generator = torch.Generator().manual_seed(3)
    x, weight = torch.randn(6, 48, generator=generator), torch.randn(40, 48, generator=generator)
    straight = kernels.native().panel_product(x, weight, None, 16)
    through_t = kernels.native().panel_product(x, weight.t().contiguous().t(), None, 16)
    assert torch.equal(straight, through_t)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("out, inner, with_bias", [(128, 128, True), (384, 128, True), (128, 256, True),
                                                   (512, 512, True), (1000, 128, False), (40, 72, True)])
def test_every_product_has_linears_bits(out, inner, with_bias, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(out + inner)
        weight = torch.randn(out, inner, generator=generator) * 0.1
        bias = torch.randn(out, generator=generator) * 0.1 if with_bias else None
        layer = kernels.native().Panelled(weight, bias)
        most = kernels.native().PANEL_MAX_ROWS
        row_counts = list(range(1, 14)) + [31, 64, 200, most, most + 3]
        # first the checks (the BLAS's product kept), then products the panels may make
        for _ in range(2):
            for rows in row_counts:
                x = torch.randn(rows, inner, generator=generator)
                assert torch.equal(layer(x), F.linear(x, weight, bias)), rows
                x3 = torch.randn(rows, 1, inner, generator=generator)  # (..., in) as the encoder's
                assert torch.equal(layer(x3), F.linear(x3, weight, bias)), rows
        if layer.block is not None:
            used = [rows for rows in row_counts[:-1] if layer.checked(rows) == threads]
            refused = [rows for rows in row_counts[:-1] if layer.checked(rows) == -threads]
            assert sorted(used + refused) == sorted(row_counts[:-1])  # each count checked once
    finally:
        torch.set_num_threads(before)


def test_a_count_checked_under_other_threads_is_checked_again():
    generator = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(128, 128, generator=generator), torch.randn(128, generator=generator)
    layer = kernels.native().Panelled(weight, bias)
    if layer.block is None:
        pytest.skip("no block of this CPU's BLAS found for this weight")
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            x = torch.randn(8, 128, generator=generator)
            assert torch.equal(layer(x), F.linear(x, weight, bias))
            assert abs(layer.checked(8)) == threads
    finally:
        torch.set_num_threads(before)


def test_a_sublayers_products_keep_linears_bits_once_the_panels_take_them():
    """The native decoder's products: a feed-forward sublayer called again
    and again at each row count (the first call checks the panels, the
    later ones may use them) gives PyTorch's sublayer every time."""
    generator = torch.Generator().manual_seed(7)
    fc1 = (torch.randn(256, 128, generator=generator) * 0.1, torch.randn(256, generator=generator) * 0.1)
    fc2 = (torch.randn(128, 256, generator=generator) * 0.1, torch.randn(128, generator=generator) * 0.1)
    layers = kernels.feed_forward(fc1, fc2)
    for _ in range(3):
        for rows in (1, 3, 4, 8, 13, 64, 300):
            x = torch.randn(rows, 128, generator=generator)
            residual = torch.randn(rows, 128, generator=generator)
            expected = residual + F.linear(torch.relu(F.linear(x, *fc1)), *fc2)
            assert torch.equal(kernels.feed_forward_sublayer(layers, x, residual), expected), rows
