"""The plugin's beam search against fairseq's SequenceGenerator: the same
hypotheses, in the same order, with the same scores (to float32 rounding),
for every architecture and every option it supports; fairseq-generate,
fairseq-interactive and the hub decode with it; unsupported options fall
back to fairseq's generator with one log line."""

import argparse
import collections
import contextlib
import logging
import math

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

import fairseq_hardattn
from fairseq_hardattn import kernels
from fairseq_hardattn.decoding import PluginBeamSearch, PluginBeamSearchWithAlignment, generator_class
from fairseq_hardattn.decoding import beam_search, lineage, native_search, packed_linear
from fairseq_hardattn.modules import (CrossSelfAttention, HardRetrievalAttention, LocalAttention,
                                      SoftAttention, TopKAttention)

from conftest import assert_same_hypotheses, build_model, decisive_model, make_dictionary, sample_of

ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]


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
    their ancestors, and cross-attention the encoder's in place (the step
    kernel); float64: the PyTorch ops."""
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).to(dtype)
    assert_same_hypotheses(*both(model, d, sample_of(d), beam_size=4, max_len_b=12))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_attention_with_a_kernel_mode_attends_through_the_kernel_on_every_step(arch, monkeypatch):
    """float32 on a CPU: each decoder attention module that has a kernel mode
    (self-, cross- and cross+self attention of the soft, hard and top-k
    kinds; local attention) steps through the step kernel, once per step,
    none through PyTorch's ops; sentences finish early, so the batch shrinks
    on the way (the Python search's steps: the native search runs the same
    kernel for these kinds, test_native_search.py)."""
    monkeypatch.setattr(native_search, "why_not", lambda *args: "turned off by the test")
    calls = collections.Counter()
    for name in ("self_attention", "source_attention", "window_attention"):
        def spy(self, module, *args, _original=getattr(lineage.Lineage, name), **kwargs):
            calls[module] += 1
            return _original(self, module, *args, **kwargs)
        monkeypatch.setattr(lineage.Lineage, name, spy)
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).float()
    with torch.no_grad():
        PluginBeamSearch([model], d, beam_size=4, max_len_b=12).generate([model], sample_of(d))
    kinds = (SoftAttention, HardRetrievalAttention, TopKAttention, CrossSelfAttention, LocalAttention)
    with_mode = [m for m in model.decoder.modules() if isinstance(m, kinds)]
    assert all(type(m).kernel_mode for m in with_mode)
    assert set(calls) == set(with_mode)
    assert len(set(calls.values())) <= 1  # every step, each of them


@pytest.mark.skipif(not packed_linear.onednn_linear_available(), reason="PyTorch without oneDNN")
@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_decodes_fairseqs_hypotheses_with_onednn_linears(arch, monkeypatch):
    """Every Linear layer packed for oneDNN (the tiny models' are below the
    size that packs): the same hypotheses, and the model as it was after."""
    monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHT", 1)
    packed_in_the_search, packing = [], beam_search.packed_linears

    @contextlib.contextmanager
    def recording(model):
        with packing(model) as layers:
            packed_in_the_search.append(set(layers))
            yield layers

    monkeypatch.setattr(beam_search, "packed_linears", recording)
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).float()
    sample = sample_of(d)
    generator = PluginBeamSearch([model], d, beam_size=4, max_len_b=12)
    with torch.no_grad():
        before = model(**sample["net_input"], prev_output_tokens=sample["net_input"]["src_tokens"])[0]
        ours = generator.generate([model], sample)
        after = model(**sample["net_input"], prev_output_tokens=sample["net_input"]["src_tokens"])[0]
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert linears and packed_in_the_search == [set(linears)]
    assert not any("forward" in vars(m) for m in linears)
    assert torch.equal(before, after)
    assert_same_hypotheses(ours, both(model, d, sample, generator_cls=(SequenceGenerator,),
                                      beam_size=4, max_len_b=12)[0])


@pytest.mark.skipif(not packed_linear.onednn_linear_available(), reason="PyTorch without oneDNN")
@pytest.mark.parametrize("options", [dict(beam_size=4), dict(beam_size=1, temperature=0.7),
                                     dict(beam_size=1, search_strategy="topk")], ids=["beam", "greedy", "sampled"])
def test_a_packed_output_projections_candidates_a_block_of_rows_at_a_time_are_all_rows_at_once(options,
                                                                                               monkeypatch):
    """With oneDNN's packed output projection the Python search's step
    logits are made and read a block of rows at a time: the same hypotheses
    and scores, bit for bit, as from the logits of every row at once (the
    native search's blocks: test_native_search.py)."""
    monkeypatch.setattr(native_search, "why_not", lambda *args: "turned off by the test")
    monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHT", 1)
    monkeypatch.setattr(beam_search.StepLogits, "CANDIDATE_ROWS", 5)  # (24 rows: blocks of 5, then 4)
    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    sample = sample_of(d)
    if options.get("search_strategy") == "topk":
        options = dict(options, search_strategy=search.Sampling(d, 8))
    blocks = []
    made = beam_search.StepLogits.candidates
    monkeypatch.setattr(beam_search.StepLogits, "candidates",
                        lambda step, prefix, *rest: blocks.append(prefix.size(0)) or made(step, prefix, *rest))
    with torch.no_grad():
        in_blocks = PluginBeamSearch([model], d, max_len_b=12, seed=3, **options).generate([model], sample)
        monkeypatch.setattr(beam_search.StepLogits, "in_row_blocks", lambda step, prefix: False)
        at_once = PluginBeamSearch([model], d, max_len_b=12, seed=3, **options).generate([model], sample)
    assert max(blocks) > 5
    for mine, theirs in zip(in_blocks, at_once):
        for a, b in zip(mine, theirs):
            assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["score"], b["score"])
            assert torch.equal(a["positional_scores"], b["positional_scores"])


@pytest.mark.parametrize("packed", [False, True], ids=["mm output projection", "onednn linears"])
def test_a_generator_sees_weights_updated_through_data_between_calls(packed, monkeypatch):
    """--eval-bleu's generator lives through training, and fairseq's
    optimizer updates weights through .data (their version unchanged): each
    call decodes the weights as they are then, as a new generator does."""
    if packed:
        if not packed_linear.onednn_linear_available():
            pytest.skip("PyTorch without oneDNN")
        monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHT", 1)
    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    sample = sample_of(d)
    generator = PluginBeamSearch([model], d, beam_size=4, max_len_b=12)
    with torch.no_grad():
        before = generator.generate([model], sample)
        torch.manual_seed(3)
        for parameter in model.parameters():  # an optimizer step, as fairseq's Adam makes it
            parameter.data.add_(torch.randn_like(parameter), alpha=0.5)
        after = generator.generate([model], sample)
        fresh = PluginBeamSearch([model], d, beam_size=4, max_len_b=12).generate([model], sample)
        fairseqs = SequenceGenerator([model], d, beam_size=4, max_len_b=12).generate([model], sample)
    assert [h["tokens"].tolist() for hyps in before for h in hyps] != \
        [h["tokens"].tolist() for hyps in fresh for h in hyps]  # the update changes the decoding
    assert_same_hypotheses(after, fresh)
    assert_same_hypotheses(after, fairseqs)


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


@pytest.mark.parametrize("beam, topk", [(1, None), (1, 5), (3, 0)])
def test_rows_that_continue_their_own_rows_leave_the_caches_as_they_are(beam, topk, monkeypatch):
    """Greedy search and sampling (``topk`` not None): a row continues its
    own row until sentences leave the batch (or a sentence's sample ends),
    so only then are the caches reordered; greedy search decodes fairseq's
    hypotheses."""
    d = make_dictionary(12)
    torch.manual_seed(2)
    model = build_model("transformer_hard_dec_small", d).eval()  # hypotheses end at many steps
    sample = sample_of(d, lengths=(3, 9, 5, 7, 2, 6, 4, 8), seed=5)
    options = dict(beam_size=beam, max_len_b=15)
    if topk is not None:
        options["search_strategy"] = search.Sampling(d, topk)
    reorders = []
    decoder_class = type(model.decoder)
    original = decoder_class.reorder_incremental_state_scripting

    def recorded(decoder, incremental_state, order):
        reorders.append(order.tolist())
        return original(decoder, incremental_state, order)

    with monkeypatch.context() as m:
        m.setattr(decoder_class, "reorder_incremental_state_scripting", recorded)
        ours = both(model, d, sample, generator_cls=(PluginBeamSearch,), **options)[0]
    assert len(reorders) >= 2  # (sentences ended at different steps)
    rows = sample["id"].numel() * beam
    for order in reorders:  # each a sentence leaving, or a sample ending: never every row its own
        assert order != list(range(rows))
        rows = len(order)
    if topk is None:
        assert_same_hypotheses(ours, both(model, d, sample, generator_cls=(SequenceGenerator,), **options)[0])


def test_a_forced_prefix_with_fewer_candidates_than_the_beam():
    """A beam of 8 over 7 words with a forced first token: most hypotheses
    start at -inf, and some end with pad, which the search's decoder call
    must not read as padding (found by tests/unit/test_differential.py)."""
    d = make_dictionary(7)
    model = decisive_model("transformer_soft_small", d).float()
    sample = sample_of(d, lengths=(12, 5))
    prefix = torch.full((2, 1), d.nspecial + 1)
    assert_same_hypotheses(*both(model, d, sample, prefix=prefix, beam_size=8, max_len_b=6, min_len=2))


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


@pytest.mark.parametrize("archs", [
    ("transformer_soft_small", "transformer_soft_small"),
    ("transformer_soft_small", "transformer_hard_dec_prenorm_small", "transformer_cross_self_small"),
    ("transformer_aan_small", "transformer_flexible_small", "transformer_topk_dec_small"),
], ids=["two soft", "soft, hard, cross+self", "aan, flexible, top-k"])
@pytest.mark.parametrize("option", ["", "temperature", "min_len", "unk_penalty"])
def test_ensembles_decode_fairseqs_hypotheses(archs, option):
    """fairseq's EnsembleModel: the mean of the models' probabilities (not
    renormalised), the same search; each model with its own caches."""
    d = make_dictionary(40)
    models = []
    for seed, arch in enumerate(archs):
        model = decisive_model(arch, d, flexible_mean_source_length=6.0).float()
        torch.manual_seed(seed + 1)
        with torch.no_grad():  # another model from the first of its architecture
            for parameter in model.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        models.append(model)
    options = {"": {}, "temperature": dict(temperature=1.5), "min_len": dict(min_len=5),
               "unk_penalty": dict(unk_penalty=2.0)}[option]
    assert generator_class(models, argparse.Namespace())[0] is PluginBeamSearch
    sample = sample_of(d)
    found = []
    for cls in (PluginBeamSearch, SequenceGenerator):
        with torch.no_grad():
            found.append(cls(models, d, beam_size=4, max_len_b=12, **options).generate(models, sample))
    assert_same_hypotheses(*found)


def test_hard_alignments_of_every_row_at_once_are_fairseqs():
    """--print-alignment's pairs for a whole batch at once, against fairseq's
    extract_hard_alignment row by row: pad and EOS on both sides, ties (the
    first strongest source token), a target of EOS alone, a source of only
    pad and EOS."""
    from fairseq import utils

    from fairseq_hardattn.decoding.beam_search import hard_alignments

    g = torch.Generator().manual_seed(3)
    pad, eos, rows, tgt_len, src_len = 1, 2, 40, 7, 9
    src = torch.randint(3, 12, (rows, src_len), generator=g)
    tgt = torch.randint(3, 12, (rows, tgt_len), generator=g)
    for row in range(rows):
        src[row, :row % 4] = pad  # left padding
        src[row, -1] = eos
        tgt[row, tgt_len - 1 - row % 3:] = pad
        tgt[row, tgt_len - 2 - row % 3] = eos
    tgt[0] = pad
    tgt[0, 0] = eos
    src[1] = pad
    src[1, -1] = eos
    attention = torch.randint(0, 4, (rows, tgt_len, src_len), generator=g).float()  # many ties
    expected = [utils.extract_hard_alignment(attention[r], src[r], tgt[r], pad, eos) for r in range(rows)]
    assert hard_alignments(attention, src, tgt, pad, eos) == expected
    assert expected[0] == expected[1] == [] and all(expected[2:])


@pytest.mark.parametrize("options, reason", [
    (dict(sampling=True, prefix_size=1), "--sampling with --prefix-size"),
    (dict(diverse_beam_groups=2), "--diverse-beam-groups"),
    (dict(constraints="ordered"), "--constraints"),
    (dict(match_source_len=True), "--match-source-len"),
])
def test_unsupported_options_fall_back_to_fairseqs_generator_with_one_line(options, reason, caplog):
    model = decisive_model("transformer_hard_dec_small", make_dictionary(40))
    args = argparse.Namespace(**options)
    with caplog.at_level(logging.INFO, logger="fairseq_hardattn.decoding"):
        assert generator_class([model], args) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"the plugin's beam search does not run {reason}: decoding with fairseq's generator"]
    assert generator_class([model], argparse.Namespace())[0] is PluginBeamSearch
    model.decoder.decoding_engine = "fairseq"
    assert generator_class([model], argparse.Namespace()) is None


@pytest.mark.parametrize("vocab, k", [(40, 8), (130, 1), (1000, 16), (64, 5)])
def test_the_candidates_kernel_is_logsumexp_and_topk(vocab, k):
    """beam_candidates.c: each row's normaliser of the raw logits and its
    best k tokens, the special columns adjusted (pad never, unk penalised,
    EOS blocked), against PyTorch's logsumexp and topk."""
    assert kernels.available(), "the native kernels did not build"
    g = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(12, vocab, generator=g) * 4
    logits[3, 5] = 30.0  # a clear winner
    logits[4, 1] = 50.0  # pad would win: never chosen, but in the normaliser
    columns, adds = torch.tensor([1, 3, 2]), torch.tensor([math.nan, -2.5, math.nan])
    top, tokens, lse = kernels.beam_candidates(logits, columns, adds, k)
    torch.testing.assert_close(lse, torch.logsumexp(logits, 1, keepdim=True), rtol=1e-6, atol=1e-5)
    adjusted = logits.clone()
    adjusted[:, 1] = adjusted[:, 2] = -math.inf
    adjusted[:, 3] -= 2.5
    expected, expected_tokens = adjusted.topk(k, dim=1)
    assert torch.equal(top, expected) and torch.equal(tokens, expected_tokens)


@pytest.mark.parametrize("vocab, k", [(1000, 8), (2213, 16), (130, 1), (300, 8)])
def test_the_candidates_kernel_keeps_the_lower_token_first_among_equal_logits(vocab, k):
    """beam_candidates.c with many equal logits (whole numbers), rows of
    nearly all -inf and rows of one value: the best k by value, the lower
    token first among equals, as a stable sort gives them."""
    g = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(10, vocab, generator=g).mul(2).round()
    logits[1] = -math.inf
    logits[1, vocab // 2:vocab // 2 + k + 2] = 3.0
    logits[2] = 1.0
    logits[3, ::7] = 9.0  # ties spread over every block
    columns, adds = torch.tensor([1, 3, 2]), torch.tensor([math.nan, -2.5, math.nan])
    top, tokens, _ = kernels.beam_candidates(logits, columns, adds, k)
    adjusted = logits.clone()
    adjusted[:, 1] = adjusted[:, 2] = -math.inf
    adjusted[:, 3] -= 2.5
    expected, order = adjusted.sort(dim=1, descending=True, stable=True)
    assert torch.equal(top, expected[:, :k]) and torch.equal(tokens, order[:, :k])


@pytest.mark.parametrize("step", [0, 1, 9])
def test_finished_hypotheses_are_read_back_along_the_pointers(step):
    """read_back (beam_candidates.c): each hypothesis's tokens and
    positional scores, followed back from its row through the steps'
    back-pointers, bit for bit as PyTorch's indexing reads them."""
    g = torch.Generator().manual_seed(step)
    steps, rows = 12, 6  # (the histories' capacity beyond the steps read)
    step_tokens = torch.randint(0, 50, (steps, rows), generator=g)
    step_scores = torch.randn(steps, rows, generator=g).cumsum(0)
    step_parents = torch.randint(0, rows, (steps, rows), generator=g)
    ending = torch.tensor([4, 0, 4, 5])
    tokens = torch.full((len(ending), step + 1), 2, dtype=torch.long)
    scores = torch.zeros(len(ending), step + 1)
    scores[:, step] = torch.randn(len(ending), generator=g) - 20
    expected_tokens, expected_scores = tokens.clone(), scores.clone()
    at = ending
    for s in range(step - 1, -1, -1):
        expected_tokens[:, s], expected_scores[:, s] = step_tokens[s, at], step_scores[s, at]
        at = step_parents[s, at]
    expected_scores[:, 1:] = expected_scores[:, 1:] - expected_scores[:, :-1].clone()
    assert kernels.read_back(step_tokens, step_scores, step_parents, ending, step, tokens, scores)
    assert torch.equal(tokens, expected_tokens) and torch.equal(scores, expected_scores)
    assert not kernels.read_back(step_tokens, step_scores.double(), step_parents, ending, step, tokens,
                                 scores.double())


# (32 and 64: the kernel's instances for those head sizes; 160: wider than it sums in registers)
@pytest.mark.parametrize("dim", [8, 32, 64, 160])
# (5 heads: a group of four scored side by side and one more; 21 + 12 positions: three vectors' rows)
@pytest.mark.parametrize("heads, src_len, length", [(2, 5, 7), (5, 21, 12)])
@pytest.mark.parametrize("parts", ["lineage", "source", "both"])
@pytest.mark.parametrize("mode", ["soft", "hard", "topk"])
def test_the_step_kernel_attends_the_encoder_and_each_hypothesis_history(mode, parts, heads, src_len, length, dim):
    """step_attention.c against PyTorch: the keys and values of the
    hypothesis's sentence (padding skipped; a time-major cache's strides; the
    sentence found through a table, where the caches still hold sentences
    that finished) and of its ancestors, gathered, then one soft attention,
    hard retrieval's argmax or top-3 attention over both."""
    g = torch.Generator().manual_seed(7)
    capacity, rows0, rows, group = 13, 6, 6, 3
    q = torch.randn(rows, heads, dim, generator=g)
    gathered_k, gathered_v, visible, source, lineage = [], [], [], None, None
    if parts != "lineage":
        # as fairseq's projection lays them out: (src_len, sentences, heads, dim), viewed batch-major
        cached = rows // group + 2  # (two sentences finished, left in the caches)
        src_k = torch.randn(src_len, cached, heads, dim, generator=g).permute(1, 2, 0, 3)
        src_v = torch.randn(src_len, cached, heads, dim, generator=g).permute(1, 2, 0, 3)
        padding = torch.zeros(cached, src_len, dtype=torch.bool)
        padding[3, :2] = True
        sentences = torch.tensor([3, 0])  # the cached sentence each group of rows reads
        source = kernels.source_part(src_k, kernels.transposed_keys(src_k), src_v, padding, group, sentences)
        sentence = sentences[torch.arange(rows) // group]
        gathered_k.append(src_k[sentence].transpose(1, 2))  # (rows, src_len, heads, dim)
        gathered_v.append(src_v[sentence].transpose(1, 2))
        visible.append(~padding[sentence])
    if parts != "source":
        keys = torch.randn(capacity, rows0, heads, dim, generator=g)
        values = torch.randn(capacity, rows0, heads, dim, generator=g)
        ancestors = torch.randint(0, rows0, (rows, capacity), generator=g)
        lineage = (keys, values, ancestors, length)
        positions = torch.arange(length)
        gathered_k.append(keys[positions, ancestors[:, :length]])  # (rows, length, heads, dim)
        gathered_v.append(values[positions, ancestors[:, :length]])
        visible.append(torch.ones(rows, length, dtype=torch.bool))
    history_k, history_v = torch.cat(gathered_k, 1), torch.cat(gathered_v, 1)
    scores = torch.einsum("rhd,rshd->rhs", q, history_k)
    scores = scores.masked_fill(~torch.cat(visible, 1)[:, None, :], -math.inf)
    scale = dim ** -0.5
    if mode == "hard":
        weights = torch.nn.functional.one_hot(scores.argmax(-1), scores.size(-1)).float()
    elif mode == "topk":
        kept = scores.topk(3, dim=-1).indices
        weights = torch.zeros_like(scores).scatter(-1, kept, torch.softmax(scores.gather(-1, kept) * scale, -1))
    else:
        weights = torch.softmax(scores * scale, -1)
    out = torch.empty_like(q)
    kernels.step_attention(q, scale, mode, 3, out, source=source, lineage=lineage)
    torch.testing.assert_close(out, torch.einsum("rhs,rshd->rhd", weights, history_v), rtol=1e-5, atol=1e-5)


def test_the_kernels_split_rows_over_torchs_threads_with_the_same_sums():
    """With two intra-op threads the step kernel and the candidates kernel
    split their rows between them (torch's OpenMP pool), and give one
    thread's results bit for bit (they own their order of sums); a whole
    search, whose other operators are PyTorch's (whose sums may depend on the
    thread count), gives the same hypotheses with scores to float32 rounding."""
    g = torch.Generator().manual_seed(5)
    rows, heads, dim, src_len = 64, 4, 32, 40
    q = torch.randn(rows, heads, dim, generator=g)
    src_k, src_v = torch.randn(2, rows // 4, heads, src_len, dim, generator=g)
    source = kernels.source_part(src_k, kernels.transposed_keys(src_k), src_v, None, 4)
    logits = torch.randn(rows, 3000, generator=g)
    columns, adds = torch.tensor([1, 3]), torch.tensor([math.nan, -1.0])
    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    sample = sample_of(d, lengths=(9, 7, 6, 4, 3, 8) * 4)
    found = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert kernels.step_attention_threads(rows, heads, dim, src_len) == threads
            steps = {}
            for mode in ("soft", "hard", "topk"):
                steps[mode] = torch.empty_like(q)
                kernels.step_attention(q, dim ** -0.5, mode, 3, steps[mode], source=source)
            generator = PluginBeamSearch([model], d, beam_size=4, max_len_b=12)
            with torch.no_grad():
                found[threads] = (steps, kernels.beam_candidates(logits, columns, adds, 8),
                                  generator.generate([model], sample))
    finally:
        torch.set_num_threads(1)
    for mode in ("soft", "hard", "topk"):
        assert torch.equal(found[1][0][mode], found[2][0][mode])
    assert all(torch.equal(a, b) for a, b in zip(found[1][1], found[2][1]))
    assert_same_hypotheses(found[2][2], found[1][2])


def test_top_k_beyond_the_kernels_k_takes_pytorchs_ops():
    """The step kernel keeps at most its header's STEP_MAX_K best keys: a
    larger k attends through PyTorch's ops instead of failing mid-decoding."""
    from fairseq_hardattn.modules import TopKAttention

    q = torch.zeros(1, 2, 8)
    most = kernels.step_max_k()
    for k, expected in ((most, True), (most + 1, False)):
        module = TopKAttention(16, 2, k=k, self_attention=True)
        assert lineage.Lineage(1, 1).usable(module, q) is expected
    # the limit Python reads is the kernel's own
    keys = torch.randn(1, 1, 2, 8)
    parts = (keys, keys, torch.zeros(1, 1, dtype=torch.int64), 1)
    kernels.step_attention(q, 1.0, "topk", most, torch.empty_like(q), lineage=parts)
    with pytest.raises(ValueError, match=f"k <= {most}"):
        kernels.step_attention(q, 1.0, "topk", most + 1, torch.empty_like(q), lineage=parts)


def test_the_step_kernels_local_window_is_local_attentions_step():
    """step_attention.c's local mode against LocalAttention's PyTorch step:
    the softmax over |s - c| <= D around each head's centre (left padding
    skipped), weighted by the Gaussian."""
    from fairseq_hardattn.modules import LocalAttention

    g = torch.Generator().manual_seed(3)
    heads, head_dim, kv_bsz, beam, src_len = 2, 8, 3, 4, 11
    module = LocalAttention(heads * head_dim, heads, window=2, encoder_decoder_attention=True)
    bsz = kv_bsz * beam
    q = torch.randn(bsz * heads, 1, head_dim, generator=g)
    k = torch.randn(kv_bsz * heads, src_len, head_dim, generator=g)
    v = torch.randn(kv_bsz * heads, src_len, head_dim, generator=g)
    padding = torch.zeros(kv_bsz, src_len, dtype=torch.bool)
    padding[1, :3] = True
    starts = torch.tensor([0.0, 3.0, 0.0]).repeat_interleave(beam * heads)
    lengths = (~padding).sum(-1).float()
    centres = starts + lengths.repeat_interleave(beam * heads) * torch.rand(bsz * heads, generator=g)
    centres[:2] = torch.tensor([0.0, 2.5])  # the edges: the first position, a half-way centre
    expected = module._window_step(q * module.scaling, k, v, padding, kv_bsz, bsz,
                                   centres.unsqueeze(1), lengths)
    out = lineage.attend_window(module, q, k, v, padding, centres, kv_bsz)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def search_and_fairseq_on_a_gpu(model, dictionary, **options):
    """The hypotheses of the plugin's search over the captured step and of
    fairseq's generator over fairseq's step, for ``sample_of``'s batch on CUDA."""
    sample = {key: value.cuda() for key, value in sample_of(dictionary)["net_input"].items()}
    sample = {"id": torch.arange(6).cuda(), "net_input": sample}
    found = []
    for engine, cls in (("search", PluginBeamSearch), ("fairseq", SequenceGenerator)):
        model.decoder.decoding_engine = engine
        found += both(model, dictionary, sample, generator_cls=(cls,), **options)
    return found


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["transformer_soft", "transformer_hard_dec", "transformer_topk_dec",
                                  "transformer_cross_self", "transformer_aan", "transformer_flexible",
                                  "transformer_local"])
def test_the_search_with_the_captured_step_decodes_fairseqs_hypotheses_on_a_gpu(arch):
    """On CUDA the plugin's search (``search``) steps through the captured
    graph: fairseq's generator over fairseq's own step decodes the same
    hypotheses, sentences finishing early and caches outgrowing their first
    capacity included."""
    d = make_dictionary(40)
    model = decisive_model(arch, d, flexible_mean_source_length=6.0).float().cuda()
    assert_same_hypotheses(*search_and_fairseq_on_a_gpu(model, d, beam_size=4, max_len_b=24))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_search_option_decodes_fairseqs_hypotheses_on_a_gpu(option):
    """The options of the CPU's test above, on CUDA: the plugin's search over
    the captured step against fairseq's generator over fairseq's step."""
    d = make_dictionary(40)
    model = decisive_model("transformer_hard_dec_small", d).float().cuda()
    assert_same_hypotheses(*search_and_fairseq_on_a_gpu(model, d, **OPTIONS[option]))
