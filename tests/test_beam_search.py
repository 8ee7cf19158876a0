"""The plugin's beam search against fairseq's SequenceGenerator: the same
hypotheses, in the same order, with the same scores (to float32 rounding),
for every architecture and every option it supports; fairseq-generate,
fairseq-interactive and the hub decode with it; unsupported options fall
back to fairseq's generator with one log line."""

import argparse
import logging

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

import fairseq_hardattn
from fairseq_hardattn.generation import PluginBeamSearch, PluginBeamSearchWithAlignment, generator_class

from conftest import build_model, decisive_model, make_dictionary, random_batch

ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]
# float32 rounding: the normaliser is summed in another order than fairseq's log_softmax, and
# scores accumulate over a sentence (magnitudes up to ~20: float32 steps of 2e-6)
SCORES = dict(rtol=1e-5, atol=1e-4)


def sample_of(dictionary, lengths=(9, 7, 6, 4, 3, 8), seed=2):
    src, src_lengths, _ = random_batch(dictionary, list(lengths), seed=seed)
    return {"id": torch.arange(len(lengths)), "net_input": {"src_tokens": src, "src_lengths": src_lengths}}


def assert_same_hypotheses(ours, theirs):
    assert len(ours) == len(theirs)
    for mine, fairseqs in zip(ours, theirs):
        assert [h["tokens"].tolist() for h in mine] == [h["tokens"].tolist() for h in fairseqs]
        torch.testing.assert_close(torch.stack([h["score"] for h in mine]),
                                   torch.stack([h["score"] for h in fairseqs]), **SCORES)
        for a, b in zip(mine, fairseqs):
            torch.testing.assert_close(a["positional_scores"], b["positional_scores"], **SCORES)
            if torch.is_tensor(b["alignment"]):
                assert torch.equal(a["alignment"], b["alignment"])
            else:  # --print-alignment: (source, target) pairs
                assert a["alignment"] == b["alignment"]


def both(model, dictionary, sample, generator_cls=(PluginBeamSearch, SequenceGenerator), prefix=None,
         **options):
    found = []
    for cls in generator_cls:
        generator = cls([model], dictionary, **options)
        with torch.no_grad():
            found.append(generator.generate([model], sample, prefix_tokens=prefix))
    return found


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_architecture_decodes_fairseqs_hypotheses(arch, dtype):
    """float32 on a CPU: self-attention reads caches never reordered, through
    their ancestors (the lineage kernel); float64: the PyTorch ops."""
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).to(dtype)
    assert_same_hypotheses(*both(model, d, sample_of(d), beam_size=4, max_len_b=12))


OPTIONS = {
    "beam 1": dict(beam_size=1, max_len_b=10),
    "beam 5, nbest": dict(beam_size=5, max_len_b=10),
    "length penalty": dict(beam_size=4, max_len_b=10, len_penalty=0.6),
    "unnormalized": dict(beam_size=4, max_len_b=10, normalize_scores=False),
    "unk penalty": dict(beam_size=4, max_len_b=10, unk_penalty=-3.0),
    "min length": dict(beam_size=4, max_len_b=12, min_len=6),
    "max length a/b": dict(beam_size=4, max_len_a=0.5, max_len_b=3),
    "fixed length": dict(beam_size=4, min_len=7, max_len_b=7),
    "no repeat 2-grams": dict(beam_size=4, max_len_b=12, no_repeat_ngram_size=2),
    "temperature": dict(beam_size=4, max_len_b=10, temperature=0.7),
}


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_hard_dec_small",
                                  "transformer_topk_dec_small", "transformer_aan_small"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_search_option_decodes_fairseqs_hypotheses(arch, option):
    d = make_dictionary(40)
    model = decisive_model(arch, d)
    assert_same_hypotheses(*both(model, d, sample_of(d), **OPTIONS[option]))


def test_sentences_finishing_at_different_steps_leave_the_batch():
    """A plain (not sharpened) model: hypotheses end at many different steps."""
    d = make_dictionary(12)
    torch.manual_seed(2)
    model = build_model("transformer_hard_dec_small", d).eval()
    with torch.no_grad():
        model.decoder.output_projection.weight.mul_(4)  # ties further apart than float32 rounding
    sample = sample_of(d, lengths=(3, 9, 5, 7, 2, 6, 4, 8), seed=5)
    ours, theirs = both(model, d, sample, beam_size=3, max_len_b=15)
    lengths = {len(h["tokens"]) for hyps in theirs for h in hyps}
    assert len(lengths) > 3  # the case this test is for
    assert_same_hypotheses(ours, theirs)


def test_prefix_tokens_are_forced():
    d = make_dictionary(40)
    model = decisive_model("transformer_hard_dec_small", d)
    sample = sample_of(d)
    prefix = torch.randint(d.nspecial, len(d), (6, 3), generator=torch.Generator().manual_seed(1))
    prefix[1, 2] = d.pad()  # a shorter prefix
    ours, theirs = both(model, d, sample, prefix=prefix, beam_size=4, max_len_b=10)
    assert_same_hypotheses(ours, theirs)
    assert all(h["tokens"][:2].tolist() == prefix[i, :2].tolist() for i, hyps in enumerate(ours) for h in hyps)


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_hard_dec_small",
                                  "transformer_cross_self_small", "transformer_flexible_small"])
def test_alignments_are_fairseqs(arch):
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0)
    ours, theirs = both(model, d, sample_of(d), beam_size=4, max_len_b=10,
                        generator_cls=(PluginBeamSearchWithAlignment, SequenceGeneratorWithAlignment))
    assert all(len(h["alignment"]) for hyps in ours for h in hyps)
    assert_same_hypotheses(ours, theirs)


@pytest.mark.parametrize("options, reason", [
    (dict(sampling=True), "--sampling"),
    (dict(diverse_beam_groups=2), "--diverse-beam-groups"),
    (dict(constraints="ordered"), "--constraints"),
    (dict(match_source_len=True), "--match-source-len"),
])
def test_unsupported_options_fall_back_to_fairseqs_generator_with_one_line(options, reason, caplog):
    model = decisive_model("transformer_hard_dec_small", make_dictionary(40))
    args = argparse.Namespace(**options)
    with caplog.at_level(logging.INFO, logger="fairseq_hardattn.generation"):
        assert generator_class([model], args) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"the plugin's beam search does not run {reason}: decoding with fairseq's generator"]
    assert generator_class([model], argparse.Namespace())[0] is PluginBeamSearch
    model.decoder.decoding_engine = "fairseq"
    assert generator_class([model], argparse.Namespace()) is None
