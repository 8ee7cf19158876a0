"""float32 Linear layers on oneDNN's prepacked kernels within the search:
the outputs of nn.Linear, a weight changed since the last block seen (even
through .data, as fairseq's optimizer changes it; a model prepared for
decoding keeps its packing until a weight changes), and every layer
restored on leaving, even when the block fails; oneDNN's products (float32
packed, bfloat16, int8) on rows padded to few sizes. (The search over every
architecture: tests/unit/test_beam_search.py.)"""

import platform
import subprocess
import sys

import pytest
import torch
from torch import nn

from fairseq_hardattn.decoding.packed_linear import (MIN_PACKED_WEIGHT, onednn_linear_available,
                                                        packed_linears)
from fairseq_hardattn.decoding.row_shapes import in_few_shapes

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="PyTorch without oneDNN")


def model_of_three_layers():
    torch.manual_seed(0)
    side = int(MIN_PACKED_WEIGHT ** 0.5)
    return nn.ModuleDict({
        "large": nn.Linear(side, side),  # packs
        "large_without_bias": nn.Linear(side, side, bias=False),  # packs
        "small": nn.Linear(side // 2, side // 2),  # below the size that gains: stays
    })


@torch.no_grad()
def test_packed_layers_give_nn_linears_outputs_and_see_a_weight_changed_since_the_last_block():
    model = model_of_three_layers()
    x = torch.randn(3, 7, model["large"].in_features)
    expected = {name: layer(x[..., :layer.in_features]) for name, layer in model.items()}
    with packed_linears(model) as packed:
        assert packed == {model["large"], model["large_without_bias"]}
        for name, layer in model.items():
            torch.testing.assert_close(layer(x[..., :layer.in_features]), expected[name])
    large = model["large"]
    # as fairseq's optimizer updates: through .data, the weight's version unchanged
    version = large.weight._version
    large.weight.data.mul_(2)
    large.bias.data.zero_()
    assert large.weight._version == version
    with packed_linears(model):
        torch.testing.assert_close(large(x), torch.nn.functional.linear(x, large.weight, large.bias))


@torch.no_grad()
def test_a_prepared_models_packing_is_kept_for_the_next_block_until_a_weight_changes():
    model = model_of_three_layers()
    model.prepared_for_inference = True  # as fairseq's tools leave it: its weights are final
    large = model["large"]
    x = torch.randn(3, large.in_features)
    with packed_linears(model):
        first = vars(large)["forward"]
    with packed_linears(model):
        assert vars(large)["forward"] is first  # not packed again
    large.load_state_dict({"weight": large.weight * 2, "bias": large.bias})  # in place: another version
    with packed_linears(model):
        assert vars(large)["forward"] is not first
        torch.testing.assert_close(large(x), torch.nn.functional.linear(x, large.weight, large.bias))
    large.weight = nn.Parameter(large.weight + 1)  # another tensor
    with packed_linears(model):
        torch.testing.assert_close(large(x), torch.nn.functional.linear(x, large.weight, large.bias))


@torch.no_grad()
def test_layers_are_restored_when_the_block_fails():
    model = model_of_three_layers()
    with pytest.raises(RuntimeError, match="inside"):
        with packed_linears(model):
            raise RuntimeError("inside")
    assert not any("forward" in vars(layer) for layer in model.values())


def test_float64_layers_stay_nn_linear():
    model = model_of_three_layers().double()
    with packed_linears(model) as packed:
        assert packed == set()


def test_overlapping_blocks_share_one_packing_until_the_last_closes():
    """A search inside a search, searches in several threads, worker
    processes forked inside a block: the later blocks use the first one's
    packing (the same weights throughout), and leaving one unpacks nothing
    while another is open."""
    model = model_of_three_layers()
    first, second = packed_linears(model), packed_linears(model)
    layers = first.__enter__()
    forwards = {layer: vars(layer)["forward"] for layer in layers}
    assert layers and second.__enter__() == layers
    first.__exit__(None, None, None)  # the second block is still open: nothing unpacked
    assert all(vars(layer)["forward"] is forwards[layer] for layer in layers)
    second.__exit__(None, None, None)
    assert not any("forward" in vars(layer) for layer in model.values())


def test_onednn_products_run_on_few_row_counts_and_give_each_rows_own_output():
    """A search's rows change with every step and batch; oneDNN keeps a kernel
    per shape: its products see 51 row counts for every count up to 512 and
    16 more for each doubling, at most 7 rows more (a sixteenth from 256);
    one, two and four rows are their own."""
    seen = []

    def product(x, weight):
        seen.append(x.size(0))
        return torch.nn.functional.linear(x, weight)

    weight = torch.randn(5, 4)
    wrapped = in_few_shapes(product)
    for rows in range(1, 1025):
        x = torch.randn(rows, 4)
        torch.testing.assert_close(wrapped(x, weight), torch.nn.functional.linear(x, weight))
        padded = seen[-1]
        assert padded >= rows and padded - rows <= max(7, rows // 16)
        assert rows not in (1, 2, 4) or padded == rows
    assert len(set(seen[:512])) == 51 and len(set(seen)) == 67
    assert wrapped(torch.randn(3, 7, 4), weight).shape == (3, 7, 5)


HEAP_PROBE = """
import os
from fairseq_hardattn.decoding.heap import keep_large_blocks_in_the_heap
from hardattn_tools.process_memory import pss_mb

keep_large_blocks_in_the_heap()
before = pss_mb(os.getpid())
blocks = [bytearray(b"x" * (4 << 20)) for _ in range(40)]  # 160 MB in 4 MB blocks: the heap's, not mmap's
held = pss_mb(os.getpid())
del blocks
print(held - before, pss_mb(os.getpid()) - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's allocator")
def test_blocks_kept_in_the_heap_are_given_back_past_32_mb_free():
    """A step's large outputs stay in the heap (not re-faulted each step), but
    what a process frees beyond 32 MB at the heap's top goes back to the
    system: a long run's memory does not climb by hundreds of MB."""
    out = subprocess.run([sys.executable, "-c", HEAP_PROBE], capture_output=True, text=True, check=True)
    held, after = map(float, out.stdout.split())
    assert held > 150, out.stdout
    assert after < 40, out.stdout
