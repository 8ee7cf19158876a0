"""The native search (decoding/native_search.py, kernels/search.cpp): where
it runs, its hypotheses and scores are the Python search's bit for bit (the
same operations on the same tensors), in every search option it takes, with
either output projection; what it does not run stays on the Python search,
its reason logged; it releases the GIL while it decodes."""

import logging
import threading
import time

import pytest
import torch
from fairseq.search import Sampling

from fairseq_hardattn import kernels
from fairseq_hardattn.decoding import PluginBeamSearch, bf16, native_search, packed_linear

from conftest import build_model, decisive_model, make_dictionary, sample_of
from test_beam_search import OPTIONS as BEAM_SEARCH_OPTIONS
from test_direct_step import assert_identical

pytestmark = pytest.mark.skipif(not kernels.has_blas(), reason="no native library here")

NATIVE_ARCHS = ["transformer_soft_small", "transformer_soft_prenorm_small", "transformer_hard_dec_small",
                "transformer_topk_dec_small", "transformer_soft_prenorm_h8_small"]
# the Python search's options (test_beam_search.py) less n-gram blocking, which stays Python's
OPTIONS = {name: options for name, options in BEAM_SEARCH_OPTIONS.items() if "no_repeat_ngram_size" not in options}
OPTIONS.update({"beam 4": dict(beam_size=4, max_len_b=12), "one step": dict(beam_size=3, max_len_b=0, min_len=0)})


def decode(model, dictionary, sample, native: bool, monkeypatch, **options):
    """The search's hypotheses, and how many batches the native search decoded."""
    calls = []
    searched = native_search.NativeModel.search
    with monkeypatch.context() as patch:
        patch.setattr(native_search.NativeModel, "search", lambda *args: calls.append(1) or searched(*args))
        if not native:
            patch.setattr(native_search, "why_not", lambda *args: "turned off by the test")
        with torch.no_grad():
            found = PluginBeamSearch([model], dictionary, **options).generate([model], sample)
    return found, len(calls)


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_the_native_search_decodes_the_python_searchs_bits(arch, option, monkeypatch):
    d = make_dictionary(40)
    model = decisive_model(arch, d).float()
    sample = sample_of(d)
    native, batches = decode(model, d, sample, True, monkeypatch, **OPTIONS[option])
    python, none = decode(model, d, sample, False, monkeypatch, **OPTIONS[option])
    assert batches == 1 and none == 0
    assert_identical(native, python)


# sampling with one sample a sentence (back-translation's): the options the native search takes
SAMPLING = {
    "top-k 5": dict(topk=5),
    "every token": dict(topk=-1),
    "top-k 5, temperature, unk penalty, min_len": dict(topk=5, temperature=0.7, unk_penalty=1.5, min_len=3),
    "every token, temperature, unk penalty, min_len": dict(topk=-1, temperature=1.3, unk_penalty=-0.5, min_len=2),
    "to max_len": dict(topk=5, max_len_b=2),
}


def sampling_options(dictionary, case: str) -> dict:
    options = dict(beam_size=1, max_len_b=30, seed=11)
    options.update(SAMPLING[case])
    options["search_strategy"] = Sampling(dictionary, options.pop("topk"))
    return options


@pytest.mark.parametrize("case", sorted(SAMPLING))
@pytest.mark.parametrize("arch", NATIVE_ARCHS)
def test_sampling_natively_draws_the_python_searchs_samples(arch, case, monkeypatch):
    d = make_dictionary(8)  # (few tokens: EOS among a row's best 5 often enough that samples end)
    torch.manual_seed(0)
    model = build_model(arch, d).float().eval()  # (as built: samples differ from the most probable tokens)
    sample = sample_of(d, lengths=(9, 7, 6, 4, 3, 8, 5, 2), ids=[4, 0, 9, 2, 7, 1, 3, 30])
    native, batches = decode(model, d, sample, True, monkeypatch, **sampling_options(d, case))
    python, none = decode(model, d, sample, False, monkeypatch, **sampling_options(d, case))
    assert batches == 1 and none == 0
    assert_identical(native, python)
    if case != "to max_len":
        assert len({len(h[0]["tokens"]) for h in python}) > 3  # (samples that end at several steps)


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("block", [5, 256])
def test_a_packed_output_projection_in_blocks_of_rows(block, sampled, monkeypatch):
    """oneDNN's packed output projection (a vocabulary large enough to pack),
    a block of rows at a time as the Python search makes it: the same bits."""
    if not packed_linear.onednn_linear_available():
        pytest.skip("PyTorch without oneDNN")
    from fairseq_hardattn.decoding import beam_search

    monkeypatch.setattr(beam_search.StepLogits, "CANDIDATE_ROWS", block)
    d = make_dictionary(2100)
    torch.manual_seed(2)
    model = build_model("transformer_hard_dec_small", d).float().eval()
    assert model.decoder.output_projection.weight.numel() >= packed_linear.MIN_PACKED_WEIGHT
    with torch.no_grad():
        model.decoder.output_projection.weight.mul_(4)
    sample = sample_of(d, lengths=(3, 9, 5, 7, 2, 6, 4, 8), seed=5)
    options = sampling_options(d, "top-k 5") if sampled else dict(beam_size=3, max_len_b=15)
    native, batches = decode(model, d, sample, True, monkeypatch, **options)
    python, _ = decode(model, d, sample, False, monkeypatch, **options)
    assert batches == 1
    assert_identical(native, python)


@pytest.mark.parametrize("arch", ["transformer_soft_small", "transformer_hard_dec_prenorm_small"])
def test_layers_on_onednns_packed_kernel(arch, monkeypatch):
    """Every Linear layer packed for oneDNN (as Transformer Base's are; the
    tiny models' are below the size that packs), the encoder's keys and
    values projected by them too: the same bits as the Python search."""
    if not packed_linear.onednn_linear_available():
        pytest.skip("PyTorch without oneDNN")
    monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHT", 1)
    d = make_dictionary(40)
    model = decisive_model(arch, d).float()
    sample = sample_of(d)
    native, batches = decode(model, d, sample, True, monkeypatch, beam_size=4, max_len_b=12)
    python, _ = decode(model, d, sample, False, monkeypatch, beam_size=4, max_len_b=12)
    assert batches == 1
    assert_identical(native, python)
    assert not any("forward" in vars(m) for m in model.modules())  # (the model as it was)


def test_the_native_search_decodes_batches_whose_sentences_end_at_many_steps(monkeypatch):
    """A plain model: hypotheses end at many steps, sentences leave the batch."""
    d = make_dictionary(12)
    torch.manual_seed(2)
    model = build_model("transformer_soft_small", d).float().eval()
    with torch.no_grad():
        model.decoder.output_projection.weight.mul_(4)
    sample = sample_of(d, lengths=(3, 9, 5, 7, 2, 6, 4, 8, 11, 1), seed=5)
    native, batches = decode(model, d, sample, True, monkeypatch, beam_size=3, max_len_b=15)
    python, _ = decode(model, d, sample, False, monkeypatch, beam_size=3, max_len_b=15)
    assert batches == 1
    assert len({len(h["tokens"]) for hyps in python for h in hyps}) > 3
    assert_identical(native, python)


@pytest.mark.parametrize("case, expected", [
    ("several samples a sentence", "several samples a sentence"),
    ("nucleus sampling", "nucleus sampling"),
    ("ensemble", "an ensemble"),
    ("prefix", "a prefix"),
    ("n-gram blocking", "n-gram blocking"),
    ("bfloat16", "bfloat16"),
    ("cross+self attention", "cross+self attention"),
    ("average attention", "AverageAttention"),
])
def test_what_the_native_search_does_not_run_stays_on_the_python_search_with_its_reason(case, expected, caplog,
                                                                                      monkeypatch):
    d = make_dictionary(40)
    arch = {"cross+self attention": "transformer_cross_self_small",
            "average attention": "transformer_aan_small"}.get(case, "transformer_soft_small")
    model = decisive_model(arch, d).float()
    models, options, prefix = [model], dict(beam_size=2, max_len_b=6), None
    if case == "several samples a sentence":
        options["search_strategy"] = Sampling(d, 5)
    elif case == "nucleus sampling":
        options.update(beam_size=1, search_strategy=Sampling(d, sampling_topp=0.6))
    elif case == "ensemble":
        models = [model, decisive_model(arch, d).float()]
    elif case == "prefix":
        prefix = torch.full((6, 1), 7, dtype=torch.long)
    elif case == "n-gram blocking":
        options["no_repeat_ngram_size"] = 2
    elif case == "bfloat16":
        if not bf16.cpu_bf16_feature():  # (emulated by PyTorch: the same numbers, slower)
            monkeypatch.setattr(bf16, "cpu_bf16_feature", lambda: "AMX")
        bf16.to_bf16_for_decoding(model)
    calls = []
    searched = native_search.NativeModel.search
    monkeypatch.setattr(native_search.NativeModel, "search", lambda *args: calls.append(1) or searched(*args))
    with caplog.at_level(logging.DEBUG, logger="fairseq_hardattn.decoding.beam_search"), torch.no_grad():
        found = PluginBeamSearch(models, d, **options).generate(models, sample_of(d), prefix_tokens=prefix)
    assert not calls and len(found) == 6
    said = [r.getMessage() for r in caplog.records if "the native search does not take" in r.getMessage()]
    assert said and expected in said[0], said


def test_the_native_search_releases_the_gil_while_it_decodes():
    """Another Python thread runs while a batch decodes natively."""
    d = make_dictionary(40)
    model = decisive_model("transformer_soft_small", d).float()
    sample = sample_of(d, lengths=(30,) * 48)
    generator = PluginBeamSearch([model], d, beam_size=8, max_len_b=60, min_len=60)
    ticks, running = [], threading.Event()

    def tick():
        running.set()
        while running.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        running.wait()
        with torch.no_grad():
            start = time.perf_counter()
            generator.generate([model], sample)
            end = time.perf_counter()
    finally:
        running.clear()
        ticker.join()
    assert end - start > 0.05
    assert sum(start < t < end for t in ticks) >= 5
