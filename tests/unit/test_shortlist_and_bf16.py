"""A vocabulary shortlist (decoding/shortlist.py): each batch decodes over
its candidates, with fairseq's hypotheses for a model whose other logits
are -inf (every architecture; beam search, sampling, int8, ensembles);
the table's format and its builder; what a shortlist does not run with.
bfloat16 Linear layers (decoding/bf16.py): refused without the CPU feature,
and where it is there (or made to seem there: PyTorch emulates it) float32's
hypotheses to bfloat16's rounding."""

import argparse
import math

import numpy as np
import pytest
import torch
from fairseq.search import Sampling
from fairseq.sequence_generator import SequenceGenerator

import fairseq_hardattn
from fairseq_hardattn import ConfigError
from fairseq_hardattn.decoding import PluginBeamSearch, bf16, generator_class, packed_linear
from fairseq_hardattn.decoding.int8 import quantize_for_decoding
from fairseq_hardattn.decoding.shortlist import Shortlist, restricted_projection
from fairseq_hardattn import shortlist_table

from conftest import assert_same_hypotheses, decisive_model, make_dictionary, sample_of

ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]


def write_table(path, dictionary, always, rows):
    with open(path, "w") as f:
        f.write("\t" + " ".join(dictionary[i] for i in always) + "\n")
        for source, targets in rows.items():
            f.write(f"{dictionary[source]}\t{' '.join(dictionary[t] for t in targets)}\n")
    return path


def a_table(tmp_path, dictionary, k=3, seed=0):
    """Each word's k candidates at random, two tokens for every sentence."""
    g = torch.Generator().manual_seed(seed)
    words = range(dictionary.nspecial, len(dictionary))
    rows = {w: (torch.randperm(len(dictionary) - dictionary.nspecial, generator=g)[:k] + dictionary.nspecial).tolist()
            for w in words}
    return write_table(tmp_path / "vmap.txt", dictionary, [dictionary.nspecial, dictionary.nspecial + 1], rows)


def masked_to(model, columns):
    """``model`` whose logits outside ``columns`` are -inf (for fairseq's
    generator: the shortlist's scores are normalised over its columns)."""
    output_layer = model.decoder.output_layer
    mask = torch.full((len(model.decoder.dictionary),), -math.inf)
    mask[columns] = 0.0

    def masked(features):
        logits = output_layer(features)
        return logits + mask.to(logits.dtype)

    model.decoder.output_layer = masked
    return model


def test_the_table_gives_each_batch_the_union_of_its_candidates(tmp_path):
    d = make_dictionary(20)
    w = d.nspecial
    path = write_table(tmp_path / "vmap.txt", d, [w], {w + 1: [w + 5, w + 6, w + 7], w + 2: [w + 8]})
    shortlist = Shortlist.load(str(path), d, d, k=2)
    src = torch.tensor([[d.pad(), w + 1, d.eos()], [w + 2, w + 3, d.eos()]])
    found = shortlist.candidates(src, pad=d.pad()).tolist()
    assert found == sorted({d.bos(), d.eos(), d.unk(), w, w + 5, w + 6, w + 8})
    prefixed = shortlist.candidates(src, torch.tensor([[w + 9], [d.pad()]]), pad=d.pad()).tolist()
    assert prefixed == sorted(found + [w + 9])
    with pytest.raises(ConfigError, match="no tab"):
        (tmp_path / "bad.txt").write_text("w1 w2\n")
        Shortlist.load(str(tmp_path / "bad.txt"), d, d)
    with pytest.raises(ConfigError, match="shortlist_k must be at least 1"):
        Shortlist.load(str(path), d, d, k=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_decodes_fairseqs_hypotheses_over_the_shortlist(arch, tmp_path):
    d = make_dictionary(200)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).float()
    model.shortlist = Shortlist.load(str(a_table(tmp_path, d, k=2)), d, d)
    sample = sample_of(d)
    columns = model.shortlist.candidates(sample["net_input"]["src_tokens"], pad=d.pad())
    assert len(columns) < len(d) / 2
    with torch.no_grad():
        ours = PluginBeamSearch([model], d, beam_size=4, max_len_b=12).generate([model], sample)
        del model.shortlist
        theirs = SequenceGenerator([masked_to(model, columns)], d, beam_size=4, max_len_b=12).generate(
            [model], sample)
    assert_same_hypotheses(ours, theirs)
    assert all(set(h["tokens"].tolist()) <= set(columns.tolist()) for s in ours for h in s)


@pytest.mark.skipif(not packed_linear.onednn_linear_available(), reason="PyTorch without oneDNN")
def test_the_shortlists_rows_packed_for_onednn_decode_fairseqs_hypotheses(tmp_path, monkeypatch):
    """The float32 rows of the shortlist's tokens on oneDNN's Linear, as a
    large enough projection runs (the tiny model's is made to pack)."""
    packed = []
    original = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHT", 1)
    d = make_dictionary(200)
    model = decisive_model("transformer_soft_small", d).float()
    model.shortlist = Shortlist.load(str(a_table(tmp_path, d, k=3)), d, d)
    sample = sample_of(d)
    columns = model.shortlist.candidates(sample["net_input"]["src_tokens"], pad=d.pad())
    with torch.no_grad():
        restricted = restricted_projection(model.decoder.output_projection, columns)
        features = torch.randn(5, model.decoder.output_projection.in_features)
        torch.testing.assert_close(restricted(features),
                                   features @ model.decoder.output_projection.weight[columns].t())
        monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight",
                            lambda weight: packed.append(weight.shape) or original(weight), raising=False)
        ours = PluginBeamSearch([model], d, beam_size=4, max_len_b=12).generate([model], sample)
        del model.shortlist
        theirs = SequenceGenerator([masked_to(model, columns)], d, beam_size=4, max_len_b=12).generate(
            [model], sample)
    assert (len(columns), model.decoder.output_projection.in_features) in packed
    assert_same_hypotheses(ours, theirs)


@pytest.mark.parametrize("setting", ["sampling", "int8", "ensemble", "prefix", "min_len"])
def test_the_shortlist_with_sampling_int8_ensembles_and_prefixes(setting, tmp_path):
    d = make_dictionary(200)
    table = a_table(tmp_path, d, k=4)
    models = [decisive_model("transformer_hard_dec_small", d).float()]
    if setting == "ensemble":
        torch.manual_seed(3)
        models.append(decisive_model("transformer_soft_small", d).float())
    if setting == "int8":
        quantize_for_decoding(models[0])
    sample = sample_of(d)
    options = dict(beam_size=3, max_len_b=10)
    if setting == "sampling":
        options = dict(beam_size=2, max_len_b=10, search_strategy=Sampling(d, 6), seed=5)
    if setting == "min_len":
        options["min_len"] = 4
    prefix = sample["net_input"]["src_tokens"][:, -3:-1].clone() if setting == "prefix" else None
    for model in models:
        model.shortlist = Shortlist.load(str(table), d, d)
    columns = models[0].shortlist.candidates(sample["net_input"]["src_tokens"], prefix, pad=d.pad())
    with torch.no_grad():
        ours = PluginBeamSearch(models, d, **options).generate(models, sample, prefix_tokens=prefix)
    for model in models:
        del model.shortlist
        masked_to(model, columns)
    if setting == "sampling":  # each sentence alone, seeded as the plugin's search seeds it
        from fairseq_hardattn.decoding.sampling import sentence_seed

        theirs = []
        generator = SequenceGenerator(models, d, beam_size=2, max_len_b=10, search_strategy=Sampling(d, 6))
        for i in range(len(ours)):
            torch.manual_seed(sentence_seed(5, i))
            one = {"id": sample["id"][i:i + 1],
                   "net_input": {k: v[i:i + 1] for k, v in sample["net_input"].items()}}
            with torch.no_grad():
                theirs += generator.generate(models, one)
    else:
        options.pop("seed", None)
        with torch.no_grad():
            theirs = SequenceGenerator(models, d, **options).generate(models, sample, prefix_tokens=prefix)
    assert_same_hypotheses(ours, theirs)


def test_what_a_shortlist_does_not_run_with_is_one_line(tmp_path):
    d = make_dictionary(40)
    model = decisive_model("transformer_hard_dec_small", d)
    model.shortlist = Shortlist.load(str(a_table(tmp_path, d)), d, d)
    assert generator_class([model], argparse.Namespace())[0] is PluginBeamSearch
    with pytest.raises(ConfigError, match="a shortlist decodes with the plugin's search only"):
        generator_class([model], argparse.Namespace(diverse_beam_groups=2))
    with pytest.raises(ConfigError, match="--no-repeat-ngram-size exclude each other"):
        generator_class([model], argparse.Namespace(no_repeat_ngram_size=2))
    model.decoder.decoding_engine = "fairseq"
    with pytest.raises(ConfigError, match="a shortlist decodes with the plugin's search only"):
        generator_class([model], argparse.Namespace())


def test_model_1_gives_each_source_word_its_translation():
    """Source word i is always translated as target word i, next to frequent
    words every sentence has: each word's best candidate is its translation,
    where co-occurrence counts would rank the frequent words first."""
    rng = np.random.default_rng(0)
    sources, targets = [], []
    eos, frequent = 2, (4, 5)
    for _ in range(400):
        words = rng.choice(np.arange(6, 30), size=5, replace=False)
        sources.append(np.append(words, eos))
        targets.append(np.append(np.concatenate([words, frequent]), eos))
    source_of, target_of, probabilities = shortlist_table.model1(sources, targets, 30, 30, iterations=5)
    keep = ~np.isin(target_of, frequent) & (source_of < 30)
    best = shortlist_table.table(source_of[keep], target_of[keep], probabilities[keep], 1)
    assert all(best[w] == [w] for w in range(6, 30))


def test_bf16_is_refused_without_amx_or_avx512_bf16(monkeypatch):
    monkeypatch.setattr(bf16, "cpu_bf16_feature", lambda: "")
    model = decisive_model("transformer_hard_dec_small", make_dictionary(40))
    with pytest.raises(ConfigError, match="needs a CPU with AMX or AVX512-BF16"):
        bf16.check_bf16_decoding(model)


def test_a_bf16_linear_is_the_product_of_bfloat16_numbers_rounded_to_bfloat16():
    """bfloat16 input and weight, products summed in float32, the output
    rounded to bfloat16 (as PyTorch's bfloat16 Linear gives it) and the bias
    added in float32."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48)
    x = torch.randn(9, 64)
    found = bf16.BF16Linear(layer)(x)
    exact = x.bfloat16().double() @ layer.weight.bfloat16().double().t()
    assert found.dtype == torch.float32
    torch.testing.assert_close(found.double() - layer.bias.double(), exact, rtol=2 ** -7, atol=1e-5)


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_hard_dec_small", "transformer_aan_small",
                                  "transformer_cross_self_small", "transformer_flexible_small"])
def test_bf16_linears_keep_most_of_float32s_best_hypotheses(arch, monkeypatch):
    """Where the CPU has no bfloat16 unit the feature is made to seem there
    (PyTorch emulates the products: the same numbers, slower). Every Linear
    layer rounds to 8 bits, so hypotheses whose scores are close may change
    places: most sentences keep float32's best hypothesis, and where they
    do, its score to bfloat16's rounding."""
    if not bf16.cpu_bf16_feature():
        monkeypatch.setattr(bf16, "cpu_bf16_feature", lambda: "AMX")
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).float()
    with torch.no_grad():
        sample = sample_of(d)
        expected = PluginBeamSearch([model], d, beam_size=4, max_len_b=10).generate([model], sample)
        bf16.check_bf16_decoding(model)
        bf16.to_bf16_for_decoding(model)
        assert not any(type(m) is torch.nn.Linear for m in model.modules())
        found = PluginBeamSearch([model], d, beam_size=4, max_len_b=10).generate([model], sample)
    same = [i for i, (a, b) in enumerate(zip(found, expected))
            if a[0]["tokens"].tolist() == b[0]["tokens"].tolist()]
    assert len(same) >= len(expected) / 2, same
    torch.testing.assert_close(torch.stack([found[i][0]["score"] for i in same]),
                               torch.stack([expected[i][0]["score"] for i in same]), rtol=0.02, atol=0.1)
    assert all(h["tokens"][-1] == d.eos() for s in found for h in s)
