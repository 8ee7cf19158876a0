"""Sampling in the plugin's search (decoding/sampling.py): each sentence
draws what fairseq's ``Sampling`` draws for it alone with the process's
generator seeded with the sentence's seed (the same bits where the
probabilities are the same bits), whatever batch it shares; over many
draws the samples follow the model's distribution and fairseq's
generator's (chi-square); every architecture samples through the search."""

import argparse

import pytest
import torch
from fairseq.search import Sampling
from fairseq.sequence_generator import SequenceGenerator

import fairseq_hardattn
from fairseq_hardattn.decoding import PluginBeamSearch, generator_class
from fairseq_hardattn import kernels
from fairseq_hardattn.decoding import sampling
from fairseq_hardattn.decoding.sampling import SentenceDraws, sentence_seed

from conftest import assert_same_hypotheses, build_model, make_dictionary, random_batch, sample_of

ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]
SEED = 7
# (top-k, top-p, temperature)
SETTINGS = [(-1, -1.0, 1.0), (5, -1.0, 1.0), (-1, 0.6, 1.0), (3, -1.0, 0.7)]


def rows(sample, which):
    return {"id": sample["id"][which],
            "net_input": {key: value[which] for key, value in sample["net_input"].items()}}


def spread_model(arch, dictionary, dtype=torch.float32):
    """Random weights, output layer as built: the next token is far from
    certain, so samples differ."""
    torch.manual_seed(0)
    return build_model(arch, dictionary, flexible_mean_source_length=6.0).eval().to(dtype)


def plugin_samples(model, dictionary, sample, beam, topk=-1, topp=-1.0, temperature=1.0, **options):
    generator = PluginBeamSearch([model], dictionary, beam_size=beam, temperature=temperature,
                                 search_strategy=Sampling(dictionary, topk, topp), seed=SEED, **options)
    with torch.no_grad():
        return generator.generate([model], sample)


def fairseqs_samples_one_by_one(model, dictionary, sample, beam, topk=-1, topp=-1.0, temperature=1.0,
                                **options):
    """fairseq's generator on each sentence alone, the process's generator
    seeded with the sentence's seed."""
    generator = SequenceGenerator([model], dictionary, beam_size=beam, temperature=temperature,
                                  search_strategy=Sampling(dictionary, topk, topp), **options)
    found = []
    for i, sentence_id in enumerate(sample["id"].tolist()):
        torch.manual_seed(sentence_seed(SEED, sentence_id))
        with torch.no_grad():
            found += generator.generate([model], rows(sample, [i]))
    return found


@pytest.mark.parametrize("topk, topp", [(-1, -1.0), (5, -1.0), (-1, 0.6)])
@pytest.mark.parametrize("beam", [1, 3])
def test_each_step_draws_what_fairseqs_sampling_draws_for_the_sentence_alone(topk, topp, beam):
    """Four steps of the same log-probabilities: for one sentence, fairseq's
    ``Sampling.step`` with torch's generator seeded with the sentence's seed
    draws the same tokens with the same scores, bit for bit; for several at
    once, each draws its own (scores to float32 rounding: exp of a batch may
    round its last elements otherwise)."""
    vocab, ids = 50, [4, 0, 17, 2, 9]
    g = torch.Generator().manual_seed(3)
    lprobs = [torch.log_softmax(torch.randn(len(ids), 1 if step == 0 else beam, vocab, generator=g) * 3, -1)
              for step in range(4)]
    together = SentenceDraws(SEED, ids, beam, topk, topp)
    for s, sentence_id in enumerate(ids):
        alone = SentenceDraws(SEED, [sentence_id], beam, topk, topp)
        fairseqs = Sampling(make_dictionary(vocab - 4), topk, topp)
        torch.manual_seed(sentence_seed(SEED, sentence_id))
        for step in range(4):
            mine = alone.step(step, lprobs[step][s].clone())
            rows = lprobs[step][s:s + 1].expand(1, beam, vocab)  # (fairseq reads the first at step 0)
            theirs, their_tokens, _ = fairseqs.step(step, rows.clone(), torch.zeros(1, beam, step))
            assert torch.equal(mine[1], their_tokens) and torch.equal(mine[0], theirs), (s, step)
    alone = [SentenceDraws(SEED, [i], beam, topk, topp) for i in ids]
    for step in range(4):
        scores, tokens = together.step(step, lprobs[step].reshape(-1, vocab).clone())
        each = [draws.step(step, lprobs[step][s].clone()) for s, draws in enumerate(alone)]
        assert torch.equal(tokens, torch.cat([t for _, t in each]))
        torch.testing.assert_close(scores, torch.cat([sc for sc, _ in each]), rtol=1e-6, atol=1e-6)
        assert tokens.shape == (len(ids), beam) and bool((scores <= 0).all())


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_samples_what_fairseq_samples_for_each_sentence_alone(arch):
    d = make_dictionary(40)
    model = spread_model(arch, d)
    sample = sample_of(d)
    ours = plugin_samples(model, d, sample, 2, topk=8, max_len_b=10)
    assert_same_hypotheses(ours, fairseqs_samples_one_by_one(model, d, sample, 2, topk=8, max_len_b=10))


@pytest.mark.parametrize("topk, topp, temperature", SETTINGS)
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_setting_samples_what_fairseq_samples_for_each_sentence_alone(topk, topp, temperature, beam,
                                                                          dtype):
    """Top-k, nucleus, temperature and N samples per sentence (the best
    first, as fairseq-generate's --nbest prints them); samples that end
    early keep their rows until their sentence ends; float32 on the C
    candidates kernel, float64 on PyTorch's ops."""
    d = make_dictionary(8)  # EOS likely enough that samples end early
    model = spread_model("transformer_hard_dec_small", d, dtype)
    sample = sample_of(d)
    options = dict(topk=topk, topp=topp, temperature=temperature, max_len_b=12, min_len=2, unk_penalty=0.5)
    ours = plugin_samples(model, d, sample, beam, **options)
    assert_same_hypotheses(ours, fairseqs_samples_one_by_one(model, d, sample, beam, **options))
    assert all(len(sentence) == beam for sentence in ours)
    lengths = {len(h["tokens"]) for sentence in ours for h in sentence}
    assert len(lengths) > 1  # samples ended at different steps


def test_a_sentences_samples_do_not_depend_on_its_batch():
    """The same ids, other batches: in another order, split, alone."""
    d = make_dictionary(40)
    model = spread_model("transformer_soft_small", d)
    sample = sample_of(d, ids=[10, 11, 12, 13, 14, 15])
    whole = plugin_samples(model, d, sample, 3, topk=10, max_len_b=10)
    order = [5, 2, 0, 3, 1, 4]
    shuffled = plugin_samples(model, d, rows(sample, order), 3, topk=10, max_len_b=10)
    split = [h for part in ([0, 1], [2], [3, 4, 5])
             for h in plugin_samples(model, d, rows(sample, part), 3, topk=10, max_len_b=10)]
    assert_same_hypotheses([shuffled[order.index(i)] for i in range(6)], whole)
    assert_same_hypotheses(split, whole)
    # and another seed draws other samples
    other = PluginBeamSearch([model], d, beam_size=3, max_len_b=10, seed=SEED + 1,
                             search_strategy=Sampling(d, 10))
    with torch.no_grad():
        assert ([h["tokens"].tolist() for s in other.generate([model], sample) for h in s]
                != [h["tokens"].tolist() for s in whole for h in s])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_c_generators_draw_what_torchs_generators_draw(dtype):
    """``exponential_`` from ``torch.Generator().manual_seed(s)``, bit for
    bit, for 64-bit seeds, over calls of every size (the state renewed every
    312 draws), the states moving on from call to call."""
    seeds = [sentence_seed(SEED, i) for i in range(5)] + [0, (1 << 64) - 1]
    states = kernels.sentence_generators(seeds)
    if states is None:
        pytest.skip("no C compiler for the kernels")
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    for per in (1, 10, 311, 2000):
        ours = torch.empty(len(seeds), per, dtype=dtype)
        kernels.exponential_draws(states, ours)
        theirs = torch.stack([torch.empty(per, dtype=dtype).exponential_(generator=g) for g in generators])
        assert torch.equal(ours, theirs), per


def test_one_sample_a_sentence_runs_its_generators_in_c_and_falls_back_where_they_differ(monkeypatch):
    """Beam 1 without a nucleus draws with the C generators (fairseq's
    samples: the tests above); where this PyTorch's draws were not theirs,
    ``torch.Generator`` draws, with the same samples."""
    if kernels.sentence_generators([1]) is None:
        pytest.skip("no C compiler for the kernels")
    assert SentenceDraws(SEED, [3, 4], 1, 10, -1.0).states is not None
    assert SentenceDraws(SEED, [3, 4], 3, 10, -1.0).states is None
    assert SentenceDraws(SEED, [3, 4], 1, -1, 0.6).states is None
    d = make_dictionary(40)
    model = spread_model("transformer_soft_small", d)
    sample = sample_of(d)
    in_c = plugin_samples(model, d, sample, 1, topk=8, max_len_b=10)
    drawn = kernels.exponential_draws
    monkeypatch.setattr(kernels, "exponential_draws", lambda states, out: (drawn(states, out), out.mul_(1.5)))
    monkeypatch.setattr(sampling, "_checked", {})
    assert sampling.kernel_generators([1]) is None and SentenceDraws(SEED, [3], 1, 10, -1.0).states is None
    assert_same_hypotheses(plugin_samples(model, d, sample, 1, topk=8, max_len_b=10), in_c)


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Goodness of fit of counts ``observed`` to counts ``expected`` (cells
    expecting fewer than 5 pooled into one)."""
    rare = expected < 5
    observed = torch.cat([observed[~rare], observed[rare].sum().view(1)])
    expected = torch.cat([expected[~rare], expected[rare].sum().view(1)])
    keep = expected > 0
    statistic = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    freedom = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(freedom / 2.0, dtype=torch.float64),
                                         torch.tensor(statistic / 2.0, dtype=torch.float64)))


@pytest.mark.parametrize("topk, temperature", [pytest.param(-1, 1.0, marks=pytest.mark.slow), (10, 0.8)])
def test_twenty_thousand_samples_follow_the_models_distribution_and_fairseqs(topk, temperature):
    """One source, 20,000 sentences (ids): the first token drawn against the
    model's probabilities (cut to the top k, sharpened by the temperature),
    and the first two tokens against 20,000 of fairseq's generator."""
    d = make_dictionary(30)
    model = spread_model("transformer_soft_small", d)
    draws = 20000
    src, src_lengths, _ = random_batch(d, [6], seed=5)
    sample = {"id": torch.arange(draws),
              "net_input": {"src_tokens": src.expand(draws, -1), "src_lengths": src_lengths.expand(draws)}}
    ours = plugin_samples(model, d, sample, 1, topk=topk, temperature=temperature, max_len_b=2, min_len=2)
    generator = SequenceGenerator([model], d, beam_size=1, max_len_b=2, min_len=2, temperature=temperature,
                                  search_strategy=Sampling(d, topk))
    torch.manual_seed(SEED)
    with torch.no_grad():
        theirs = generator.generate([model], sample)
    vocab = len(d)
    with torch.no_grad():  # the first step's distribution, as the search sees it
        logits = model.decoder(torch.tensor([[d.eos()]]), encoder_out=model.encoder(src, src_lengths))[0][0, -1]
        logits = logits.double() / temperature
        logits[d.pad()] = logits[d.eos()] = float("-inf")  # (pad never; EOS not before min_len)
        if topk > 0:
            logits[logits < logits.topk(topk).values[-1]] = float("-inf")
        probs = torch.softmax(logits, -1)
    first = torch.bincount(torch.tensor([s[0]["tokens"][0] for s in ours]), minlength=vocab).double()
    assert chi_square_p_value(first, probs * draws) > 1e-3
    pairs = [torch.bincount(torch.tensor([int(s[0]["tokens"][0]) * vocab + int(s[0]["tokens"][1]) for s in found]),
                            minlength=vocab * vocab).double() for found in (ours, theirs)]
    total = pairs[0] + pairs[1]  # homogeneity: each half expects half of each cell
    assert chi_square_p_value(torch.cat(pairs), torch.cat([total / 2, total / 2])) > 1e-3
    assert ours[0][0]["tokens"].tolist() != ours[1][0]["tokens"].tolist() or \
        ours[1][0]["tokens"].tolist() != ours[2][0]["tokens"].tolist()


def test_sampling_and_greedy_search_run_the_plugins_search():
    d = make_dictionary(40)
    model = spread_model("transformer_hard_dec_small", d)
    for options in (dict(sampling=True, sampling_topk=10), dict(sampling=True, sampling_topp=0.9), dict(beam=1)):
        assert generator_class([model], argparse.Namespace(**options))[0] is PluginBeamSearch
    chosen = generator_class([model], argparse.Namespace(sampling=True, seed=3))
    assert chosen == (PluginBeamSearch, {"seed": 3})
    assert generator_class([model], argparse.Namespace(sampling=True, prefix_size=1)) is None
