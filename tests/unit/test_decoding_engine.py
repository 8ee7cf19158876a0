"""The decoding engine's steps (decoding/engines.py, decoding/fixed_shape_step.py):
the fixed-shape step gives the hypotheses of fairseq's for every Transformer architecture
(finished sentences leaving the batch, caches growing past their first
capacity); its step is capturable (torch.compile with fullgraph, on the
CPU); on a GPU the CUDA-graph replay gives the eager hypotheses."""

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from fairseq import search
from fairseq.sequence_generator import SequenceGenerator

import fairseq_hardattn
from fairseq_hardattn.decoding import engines, fixed_shape_step
from fairseq_hardattn.errors import ConfigError
from fairseq_hardattn.modules import decoding_step

from conftest import REPO, assert_same_hypotheses, build_model, decisive_model, make_dictionary, random_batch

TRANSFORMER_ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]


def hypotheses(model, d, src, lengths, engine, prefix_tokens=None, **generator_args):
    model.decoder.decoding_engine = engine
    generator = SequenceGenerator([model], d, **generator_args)
    torch.manual_seed(5)  # sampling draws the same numbers for each engine
    with torch.no_grad():
        found = generator.generate(None, {"net_input": {"src_tokens": src, "src_lengths": lengths}},
                                   prefix_tokens=prefix_tokens)
    return found


# natural endings: sentences finish at different steps and leave the batch
FINISHING = dict(beam_size=4, max_len_b=10)


def five_sentences(d):
    """The batch the search tests decode: five sources of different lengths."""
    src, lengths, _ = random_batch(d, [9, 7, 6, 4, 3], seed=2)
    return src, lengths


@pytest.mark.parametrize("arch", TRANSFORMER_ARCHS)
def test_static_engine_gives_fairseqs_hypotheses(arch):
    d = make_dictionary()
    model = decisive_model(arch, d)
    src, lengths = five_sentences(d)
    assert_same_hypotheses(hypotheses(model, d, src, lengths, "static", **FINISHING),
                           hypotheses(model, d, src, lengths, "fairseq", **FINISHING))
    # 24 steps: the caches outgrow their first capacity (16) once
    long = dict(beam_size=3, min_len=24, max_len_a=0, max_len_b=24)
    assert_same_hypotheses(hypotheses(model, d, src, lengths, "static", **long),
                           hypotheses(model, d, src, lengths, "fairseq", **long))


# the searches fairseq-generate offers besides plain beam search (the engine
# is the default on CUDA): sampling, forced prefixes, diverse beams, n-gram blocking
OTHER_SEARCHES = {
    "sampling": lambda d: dict(beam_size=2, max_len_b=10,
                               search_strategy=search.Sampling(d, sampling_topk=5)),
    "prefix": lambda d: dict(beam_size=3, max_len_b=10),
    "diverse_beam": lambda d: dict(beam_size=4, max_len_b=10,
                                   search_strategy=search.DiverseBeamSearch(d, 2, 0.5)),
    "no_repeat_ngram": lambda d: dict(beam_size=4, max_len_b=10, no_repeat_ngram_size=2),
}


def other_search_and_fairseqs_step(model, d, src, lengths, engine, search_name):
    """The hypotheses of fairseq's generator running ``OTHER_SEARCHES[search_name]``
    over ``engine``'s step and over fairseq's own."""
    prefix = src[:, -3:-1] if search_name == "prefix" else None  # two tokens forced per sentence
    generator_args = OTHER_SEARCHES[search_name](d)
    return [hypotheses(model, d, src, lengths, step, prefix, **generator_args) for step in (engine, "fairseq")]


# one architecture of each family (the engine's state differs by family)
FAMILIES = ["transformer_soft", "transformer_hard_dec", "transformer_cross_self",
            "transformer_aan", "transformer_local", "transformer_flexible"]


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("search_name", sorted(OTHER_SEARCHES))
def test_static_engine_gives_fairseqs_hypotheses_of_other_searches(arch, search_name):
    d = make_dictionary()
    model = decisive_model(arch, d)
    src, lengths = five_sentences(d)
    assert_same_hypotheses(*other_search_and_fairseqs_step(model, d, src, lengths, "static", search_name))


def decoder_heads(model):
    return {m.num_heads for m in model.decoder.modules() if hasattr(m, "num_heads")}


# more decoder heads than encoder heads (the parity section's 8-head models:
# --decoder-attention-heads 8 beside 4 encoder heads): the static caches are
# laid out per decoder head
@pytest.mark.parametrize("arch", FAMILIES)
def test_static_engine_with_more_decoder_heads_than_encoder_heads(arch):
    d = make_dictionary()
    model = decisive_model(arch, d, decoder_attention_heads=8)
    assert decoder_heads(model) == {8}
    src, lengths = five_sentences(d)
    assert_same_hypotheses(hypotheses(model, d, src, lengths, "static", **FINISHING),
                           hypotheses(model, d, src, lengths, "fairseq", **FINISHING))


def test_the_static_state_keeps_its_tensors_across_steps():
    """What a replayed graph needs: the same cache tensors at every step
    (written in place), a fixed number of rows after sentences finish."""
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model("transformer_hard_dec", d).eval()
    model.decoder.decoding_engine = "static"
    src, lengths, _ = random_batch(d, [6, 4], seed=1)
    encoder_out = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths),
                                                    torch.tensor([0, 0, 1, 1]))
    state, tokens = {}, torch.full((4, 1), d.eos())
    seen = []
    with torch.no_grad():
        for step in range(3):
            logits, _ = model.decoder(tokens, encoder_out, incremental_state=state)
            buffer = model.decoder.layers[0].self_attn._get_input_buffer(state)
            seen.append(buffer["prev_key"].data_ptr())
            tokens = torch.cat([tokens, logits.argmax(-1)], dim=1)
            model.decoder.reorder_incremental_state_scripting(state, torch.tensor([1, 0, 3, 2]))
    assert len(set(seen)) == 1
    static = decoding_step.fixed_shape(state)
    assert (static.rows, static.capacity, static.filled) == (4, fixed_shape_step.INITIAL_CAPACITY, 2)
    # a sentence finishes: two rows in use, still four computed
    model.decoder.reorder_incremental_state_scripting(state, torch.tensor([2, 3]))
    with torch.no_grad():
        logits, _ = model.decoder(tokens[2:], encoder_out, incremental_state=state)
    assert logits.shape[0] == 2 and static.active == 2 and static.rows == 4


@pytest.mark.parametrize("arch", ["transformer_soft", "transformer_hard_dec",
                                  "transformer_hard_cross_self", "transformer_aan",
                                  "transformer_flexible", "transformer_local"])
def test_the_engine_step_compiles_as_one_graph(arch):
    """torch.compile(fullgraph=True) of the layers of a step: no graph break,
    no host sync, the eager result (a CUDA graph needs the same)."""
    torch.manual_seed(0)
    d = make_dictionary()
    model = build_model(arch, d).eval()
    model.decoder.decoding_engine = "static"
    src, lengths, _ = random_batch(d, [6, 4], seed=1)
    encoder_out = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths),
                                                    torch.tensor([0, 0, 1, 1]))
    compiled = torch.compile(fixed_shape_step.layers_step, backend="aot_eager", fullgraph=True)
    eager_state, compiled_state = {}, {}
    tokens = torch.full((4, 1), d.eos())
    with torch.no_grad():
        for step in range(3):
            outputs = []
            for state, run in ((eager_state, fixed_shape_step.layers_step), (compiled_state, compiled)):
                if step == 0:  # the first step caches the encoder states (eagerly)
                    out, _ = model.decoder(tokens, encoder_out, incremental_state=state)
                else:
                    static = decoding_step.fixed_shape(state)
                    static.filled = step
                    static.position.fill_(step)
                    x = fixed_shape_step.embed_last_token(model.decoder, tokens, state)
                    out = run(model.decoder, x, model.decoder.encoder_states_per_layer(encoder_out),
                              encoder_out["encoder_padding_mask"][0], state,
                              tokens[:, -1:].eq(d.pad()))
                outputs.append(out)
            torch.testing.assert_close(outputs[1], outputs[0])
            tokens = torch.cat([tokens, outputs[0].argmax(-1)], dim=1)


def test_the_default_engine_steps_fairseqs_way_on_a_cpu():
    d = make_dictionary()
    model = build_model("transformer_hard_dec", d).eval()
    assert model.decoder.decoding_engine == "auto"
    src, _, _ = random_batch(d, [5, 3], seed=1)
    assert engines.step_of("auto", src) == engines.LINEAGE_STEP  # fairseq's forward, the search's caches
    assert engines.step_of("fairseq", src) == engines.FAIRSEQS_STEP
    assert engines.step_of("static", src) == engines.STATIC_STEP
    state = {}
    tokens = torch.full((2, 1), d.eos())
    with torch.no_grad():
        model.decoder(tokens, model.encoder(src, torch.tensor([5, 3])), incremental_state=state)
    assert decoding_step.fixed_shape(state) is None  # no fixed-shape caches: fairseq's own step ran


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", TRANSFORMER_ARCHS)
def test_captured_graph_gives_the_eager_hypotheses_on_a_gpu(arch):
    d = make_dictionary()
    model = decisive_model(arch, d).float().cuda()
    src, lengths = five_sentences(d)
    src, lengths = src.cuda(), lengths.cuda()
    assert engines.step_of("search", src) == engines.GRAPH_STEP  # the plugin's search on CUDA
    fixed = dict(beam_size=4, min_len=20, max_len_a=0, max_len_b=20)  # outgrows the first capacity
    for generator_args in (fixed, FINISHING):
        expected = hypotheses(model, d, src, lengths, "fairseq", **generator_args)
        for engine in ("graph", "search"):
            assert_same_hypotheses(hypotheses(model, d, src, lengths, engine, **generator_args), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("search_name", sorted(OTHER_SEARCHES))
def test_captured_graph_gives_fairseqs_hypotheses_of_other_searches_on_a_gpu(arch, search_name):
    """What fairseq's generator decodes on CUDA under ``auto`` (sampling
    among them): its hypotheses over the captured step."""
    d = make_dictionary()
    model = decisive_model(arch, d).float().cuda()
    src, lengths = five_sentences(d)
    src, lengths = src.cuda(), lengths.cuda()
    assert_same_hypotheses(*other_search_and_fairseqs_step(model, d, src, lengths, "graph", search_name))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", FAMILIES)
def test_captured_graph_with_more_decoder_heads_than_encoder_heads_on_a_gpu(arch):
    d = make_dictionary()
    model = decisive_model(arch, d, decoder_attention_heads=8).float().cuda()
    src, lengths = five_sentences(d)
    src, lengths = src.cuda(), lengths.cuda()
    assert_same_hypotheses(hypotheses(model, d, src, lengths, "graph", **FINISHING),
                           hypotheses(model, d, src, lengths, "fairseq", **FINISHING))


class OnCuda:
    """Stands for a CUDA tensor where ``resolved`` reads only the device."""
    is_cuda = True


def test_on_cuda_auto_is_fairseqs_generator_until_the_gpu_check_passes(monkeypatch, caplog):
    """``auto`` on CUDA: fairseq's generator and step, with one log line
    naming the other choice, until scripts/gpu_check.sh has passed on a GPU
    (``engines.CUDA_SEARCH_PASSED_AT``, recorded in results/gpu_check/verdict.json);
    ``search`` chooses the plugin's search there; a CPU is not affected.
    Sampling on CUDA is fairseq's generator's in any case."""
    from fairseq_hardattn import decoding
    from fairseq_hardattn.decoding import PluginBeamSearch

    d = make_dictionary()
    model = decisive_model("transformer_hard_dec", d)
    args = SimpleNamespace(beam=4, nbest=1, sampling=False, print_alignment=False)
    monkeypatch.setattr(engines, "CUDA_SEARCH_PASSED_AT", None)
    assert engines.step_of("auto", OnCuda()) == engines.FAIRSEQS_STEP
    assert engines.step_of("search", OnCuda()) == engines.GRAPH_STEP
    assert engines.step_of("auto", torch.zeros(1)) == engines.LINEAGE_STEP
    assert decoding.generator_class([model], args)[0] is PluginBeamSearch  # on this CPU
    monkeypatch.setattr(engines, "on_cuda", lambda models: True)
    with caplog.at_level(logging.INFO):
        assert decoding.generator_class([model], args) is None
    said = [r.message for r in caplog.records if "gpu_check" in r.message]
    assert len(said) == 1 and "{'decoding_engine': 'search'}" in said[0]
    model.decoder.decoding_engine = "search"
    assert decoding.generator_class([model], args)[0] is PluginBeamSearch
    model.decoder.decoding_engine = "auto"
    monkeypatch.setattr(engines, "CUDA_SEARCH_PASSED_AT", "0" * 40)
    assert engines.step_of("auto", OnCuda()) == engines.GRAPH_STEP
    assert decoding.generator_class([model], args)[0] is PluginBeamSearch
    # sampling on CUDA: fairseq's generator (each sentence's generator is a CPU one), one line
    caplog.clear()
    sampling = SimpleNamespace(beam=2, nbest=1, sampling=True, sampling_topk=5, sampling_topp=-1.0,
                               print_alignment=False)
    with caplog.at_level(logging.INFO):
        assert decoding.generator_class([model], sampling) is None
    assert [r.message for r in caplog.records] == [
        "the plugin's beam search does not run --sampling on CUDA: decoding with fairseq's generator"]
    model.shortlist = object()  # a shortlist needs the plugin's search: the refusal names why
    with pytest.raises(ConfigError, match="which these options do not run: --sampling on CUDA$"):
        decoding.generator_class([model], sampling)
    del model.shortlist
    monkeypatch.setattr(engines, "on_cuda", lambda models: False)
    assert decoding.generator_class([model], sampling)[0] is PluginBeamSearch


def test_auto_is_the_search_everywhere_only_at_a_commit_the_device_check_passed():
    """A commit in ``CUDA_SEARCH_PASSED_AT`` is one at which the record of
    scripts/gpu_check.sh says every GPU test ran and passed."""
    commit = engines.CUDA_SEARCH_PASSED_AT
    record = REPO / "results" / "gpu_check" / "verdict.json"
    if commit is None:
        pytest.skip("the GPU check has not passed on a GPU at a recorded commit: auto is fairseq's on CUDA")
    verdict = json.loads(record.read_text())
    assert verdict["passed"] and verdict["commit"] == commit and verdict["device"] == "cuda"
    assert verdict["tests_passed"] > 0 and verdict["tests_failed"] == verdict["tests_skipped"] == 0
