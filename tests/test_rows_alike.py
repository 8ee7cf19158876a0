"""A sentence decodes to the same bits whatever sentences share its batch
(float32 on a CPU): each Linear layer in the search rounds a row alike at
any row count and thread count, and so does every architecture's search,
which lets the all-cores workers share a large batch out
(tests/test_decoding_workers.py)."""

import pytest
import torch
from torch import nn

import fairseq_hardattn
from fairseq_hardattn.generation import PluginBeamSearch, packed_linear
from fairseq_hardattn.generation.workers import decodes_rows_alike, rows_of
from fairseq_hardattn.modules import FlexibleAttention, LocalAttention

from conftest import build_model, make_dictionary, random_batch

pytestmark = pytest.mark.skipif(not packed_linear.onednn_linear_available(), reason="PyTorch without oneDNN")

ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]


@torch.no_grad()
@pytest.mark.parametrize("features", [(16, 40), (128, 256), (256, 10000), (512, 2048), (2048, 512), (1024, 32)])
def test_each_row_of_a_linear_layer_is_the_same_whatever_rows_and_threads_share_its_call(features):
    """Fewer rows than ROWS_ALIKE (matrix-vector and small-matrix paths) and,
    on MKL, more than 512 input features over two threads round otherwise."""
    torch.manual_seed(0)
    layer = nn.Linear(*features)
    x = torch.randn(300, features[0])
    threads = torch.get_num_threads()
    with packed_linear.packed_linears(nn.ModuleList([layer])):
        try:
            torch.set_num_threads(1)
            whole = layer(x)
            for count in (1, 2):
                torch.set_num_threads(count)
                for rows in [*range(1, 40), 299]:
                    assert torch.equal(layer(x[-rows:]), whole[-rows:]), (count, rows)
        finally:
            torch.set_num_threads(threads)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_gives_a_sentence_the_same_bits_alone_and_in_a_batch(arch):
    """Beam 2: the whole batch steps on 16 rows, a sentence alone on 2. Local
    and flexible attention say they do not (their centres' elementwise ops),
    and the workers keep their batches whole."""
    d = make_dictionary(40)
    torch.manual_seed(0)
    model = build_model(arch, d, flexible_mean_source_length=6.0).eval().float()
    windowed = any(isinstance(m, (LocalAttention, FlexibleAttention)) for m in model.modules())
    assert decodes_rows_alike([model]) is not windowed
    if windowed:
        return
    src, src_lengths, _ = random_batch(d, [9, 7, 6, 4, 3, 8, 5, 9], seed=4)
    sample = {"id": torch.arange(8), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    generator = PluginBeamSearch([model], d, beam_size=2, max_len_b=10)
    with torch.no_grad():
        whole = generator.generate([model], sample)
        alone = [generator.generate([model], rows_of(sample, torch.tensor([i])))[0] for i in range(8)]
    for batch_hypotheses, alone_hypotheses in zip(whole, alone):
        for a, b in zip(batch_hypotheses, alone_hypotheses):
            assert torch.equal(a["tokens"], b["tokens"])
            assert torch.equal(a["positional_scores"], b["positional_scores"])
