"""No host synchronisation inside any attention module of the plugin while
decoding: counted with a dispatch mode during a beam search, for every
architecture, with flexible attention's C kernel on and off (off is the path
a GPU runs); the whole search makes no more syncs than fairseq's own
transformer on the same batch."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

import fairseq_hardattn
from fairseq_hardattn.modules import decoding_step
from hardattn_tools.op_counting import counting

from conftest import build_model, make_dictionary, random_batch

ARCHS = fairseq_hardattn.registered_architectures()
STEPS = 10


def beam_search_counts(arch):
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model(arch, d).eval()
    src, lengths, _ = random_batch(d, [8, 6, 5, 3], seed=1)
    # every hypothesis runs the same number of steps: the generator's own work is alike
    generator = SequenceGenerator([model], d, beam_size=4, min_len=STEPS, max_len_a=0,
                                  max_len_b=STEPS)
    with torch.no_grad(), counting(model) as counts:
        generator.generate(None, {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    return counts


@pytest.fixture(scope="module")
def fairseq_syncs():
    return beam_search_counts("transformer").syncs()


# flexible attention also without its C kernel: the path a GPU runs
CASES = [(arch, "1") for arch in ARCHS] + [(arch, "0") for arch in ARCHS if "flexible" in arch]


@pytest.mark.parametrize("arch, kernels", CASES)
def test_no_host_sync_inside_our_modules(arch, kernels, fairseq_syncs, monkeypatch):
    monkeypatch.setenv("FAIRSEQ_HARDATTN_KERNELS", kernels)
    counts = beam_search_counts(arch)
    assert counts.ops(inside=True) > 0  # the hooks did see the modules at work
    assert counts.sync_ops(inside=True) == {}
    assert counts.syncs() <= fairseq_syncs, counts.sync_ops()


def test_the_counter_sees_a_sync_inside_a_module(monkeypatch):
    """The check can fail: a module that asks the device for a value is caught."""
    from fairseq_hardattn.modules import HardRetrievalAttention

    original = HardRetrievalAttention.attend

    def asking(self, *args, **kwargs):
        bool(args[1].q.abs().sum() > 0)  # waits for the device
        return original(self, *args, **kwargs)

    monkeypatch.setattr(HardRetrievalAttention, "attend", asking)
    counts = beam_search_counts("transformer_hard_dec")
    assert counts.sync_ops(inside=True).get("aten._local_scalar_dense", 0) > 0


def test_an_expansion_other_than_sentence_by_sentence_fails_loudly():
    d = make_dictionary()
    model = build_model("transformer_hard_dec", d).eval()
    src, lengths, _ = random_batch(d, [5, 3], seed=1)
    encoder_out = model.encoder(src, src_lengths=lengths)
    grouped = model.encoder.reorder_encoder_out(encoder_out, torch.tensor([0, 0, 1, 1]))
    assert decoding_step.reordered_count(encoder_out, torch.tensor([0, 0, 1, 1])) == 2
    assert grouped["encoder_out"][0].size(1) == 4
    with pytest.raises(RuntimeError, match="expanded other than sentence by sentence"):
        model.encoder.reorder_encoder_out(encoder_out, torch.tensor([0, 1, 0, 1]))
