"""A model's output depends only on its inputs and the call's own settings,
never on an earlier call: every architecture, in-process through fairseq's
generator and the plugin's beam search (greedy, beam, sampling) and teacher
forcing. The CLI and hub side of the matrix is in ``test_cli_every_arch.py``."""

import pytest
import torch
from fairseq.search import Sampling
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

import fairseq_hardattn
from fairseq_hardattn.decoding import PluginBeamSearch, PluginBeamSearchWithAlignment

from conftest import build_model, make_dictionary, random_batch

ARCHS = fairseq_hardattn.registered_architectures()
LENGTHS = [8, 6, 5, 3]  # >= 4 sentences of different lengths (sorted, as fairseq batches)


def generate(generator, src, src_lengths, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    with torch.no_grad():
        return generator.generate(None, sample)


def rows(src, src_lengths, selected):
    """Some sentences as fairseq's collater batches them (left padding trimmed)."""
    src, src_lengths = src[selected], src_lengths[selected]
    return src[:, src.size(1) - int(src_lengths.max()):], src_lengths


def tokens(hypotheses):
    return [[h["tokens"].tolist() for h in hyps] for hyps in hypotheses]


# the two beam searches, each with its alignment variant
SEARCHES = {"fairseq": (SequenceGenerator, SequenceGeneratorWithAlignment),
            "plugin": (PluginBeamSearch, PluginBeamSearchWithAlignment)}


@pytest.fixture(params=sorted(SEARCHES))
def search(request):
    return SEARCHES[request.param]


@pytest.fixture(params=ARCHS)
def model_and_batch(request):
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model(request.param, d).eval()
    src, src_lengths, prev = random_batch(d, LENGTHS, seed=1)
    return model, d, src, src_lengths, prev


def test_beam_1_after_beam_4_equals_a_fresh_beam_1(model_and_batch, search):
    model, d, src, src_lengths, _ = model_and_batch
    beam_search = search[0]
    greedy = beam_search([model], d, beam_size=1, max_len_b=8)
    fresh = tokens(generate(greedy, src, src_lengths))
    generate(beam_search([model], d, beam_size=4, max_len_b=8), *rows(src, src_lengths, [0]))
    assert tokens(generate(greedy, src, src_lengths)) == fresh
    # a beam of another size in between, on another batch size, changes nothing either
    generate(beam_search([model], d, beam_size=3, max_len_b=8),
             *rows(src, src_lengths, [1, 2, 3]))
    assert tokens(generate(greedy, src, src_lengths)) == fresh


def test_teacher_forced_forward_after_generation_equals_the_one_before(model_and_batch, search):
    model, d, src, src_lengths, prev = model_and_batch
    with torch.no_grad():
        before = model(src, src_lengths, prev)[0]
        generate(search[0]([model], d, beam_size=4, max_len_b=8), src, src_lengths)
        after = model(src, src_lengths, prev)[0]
    assert torch.equal(before, after)


def test_sampling_after_beam_search_equals_sampling_alone(model_and_batch, search):
    model, d, src, src_lengths, _ = model_and_batch
    sampler = SequenceGenerator([model], d, beam_size=2, max_len_b=8, search_strategy=Sampling(d))
    first = rows(src, src_lengths, [0, 1, 2])
    fresh = tokens(generate(sampler, *first, seed=5))
    assert all(len(hyps) == 2 for hyps in fresh)
    generate(search[0]([model], d, beam_size=4, max_len_b=8), src, src_lengths)
    assert tokens(generate(sampler, *first, seed=5)) == fresh


def test_alignment_is_one_source_position_per_target_token(model_and_batch, search):
    """The alignment generators (``--print-alignment``) on every family."""
    model, d, src, src_lengths, _ = model_and_batch
    if search[1] is PluginBeamSearchWithAlignment and not getattr(model, "full_context_alignment", False):
        pytest.skip("aligned from per-step attention: fairseq's generator decodes it")
    aligner = search[1]([model], d, beam_size=4, max_len_b=8)
    for i, hyps in enumerate(generate(aligner, src, src_lengths)):
        best = hyps[0]
        target_words = (best["tokens"] != d.eos()).sum().item()
        alignment = best["alignment"]
        assert len(alignment) == target_words, f"sentence {i}"
        source_words = LENGTHS[i] - 1  # EOS is not a word
        assert all(0 <= int(s) < source_words for s, _ in alignment)
        assert [int(t) for _, t in alignment] == list(range(target_words))
