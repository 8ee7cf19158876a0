"""Randomized differential testing of the plugin's search against fairseq's
generator: random search options x every architecture x decode-time kinds
and k x batch sizes x source and target lengths, with the edges (a 1-token
source, a length limit of 1, a beam wider than the vocabulary allows, every
hypothesis ending at the first step, sentences finishing at different steps,
left padding), on random weights and on trained tiny models.

In float32 the two may differ where two candidates' scores are within
float32 rounding: the engine sums a normaliser, and hard retrieval's scores,
in another order than PyTorch's ops (its C kernels). A difference counts as
such a tie when either
- fairseq's generator gives the engine's hypotheses for that sentence decoded
  alone (fairseq's own result depends on the batch there), or
- both searches agree on the same case in float64 (where the kernels step
  aside and rounding no longer decides; fairseq's normaliser, which computes
  in float32 whatever its input, in float64 too): the same search, fed values
  that differ by float32 rounding (each kernel is tested against PyTorch's
  ops to it in tests/unit/test_beam_search.py);
and as a defect otherwise: the test fails and names the case.

The CI slice decodes ``DIFFERENTIAL_CASES`` cases from a fixed seed, in
``PARTS`` tests that pytest-xdist's workers share;
``FAIRSEQ_HARDATTN_DIFF_CASES=10000 pytest tests/unit/test_differential.py``
(with ``FAIRSEQ_HARDATTN_DIFF_SEED``) is the long run, whose summary each part
prints.
"""

import collections
import contextlib
import copy
import os
import random

import pytest
import torch
from fairseq import utils as fairseq_utils
from fairseq.sequence_generator import SequenceGenerator

import fairseq_hardattn
from fairseq_hardattn.decoding import PluginBeamSearch

from conftest import FLOAT32_ROUNDING as SCORES, build_model, load_with_overrides, make_dictionary

DIFFERENTIAL_CASES = int(os.environ.get("FAIRSEQ_HARDATTN_DIFF_CASES", "600"))
SEED = int(os.environ.get("FAIRSEQ_HARDATTN_DIFF_SEED", "2026"))
PARTS = 4  # case n is decoded by part n % PARTS (the same cases, whatever the split)
ARCHS = [a for a in fairseq_hardattn.registered_architectures() if "lstm" not in a]
# decode-time kinds for the archs whose decoder attention is built of kinds
KINDS = [None, ("hard", None), ("topk", 1), ("topk", 2), ("topk", 3)]

VOCABS = {"small": 11, "usual": 40}  # 11: 7 words, a beam of 8 has not 2 x beam candidates


class Models:
    """Tiny models built once per (arch, kinds, vocab, weights), float32 and float64."""

    def __init__(self):
        self.cache = {}
        self.dictionaries = {name: make_dictionary(size - 4) for name, size in VOCABS.items()}

    def get(self, arch, kinds, vocab, weights):
        key = (arch, kinds, vocab, weights)
        if key not in self.cache:
            d = self.dictionaries[vocab]
            options = dict(flexible_mean_source_length=6.0)
            if kinds is not None and arch.startswith(("transformer_soft", "transformer_hard_dec",
                                                       "transformer_topk")):
                kind, k = kinds
                options.update(dec_self_attn_kind=kind, dec_cross_attn_kind=kind, retrieval_k=k)
            torch.manual_seed(len(self.cache) % 7)
            try:
                model = build_model(arch, d, **options).eval()
            except Exception:  # a family whose layers take no such kind: its own kinds
                torch.manual_seed(len(self.cache) % 7)
                model = build_model(arch, d, flexible_mean_source_length=6.0).eval()
            with torch.no_grad():
                projection = model.decoder.output_projection.weight
                if weights == "decisive":  # one token dominates: scores far apart
                    projection.mul_(20)
                elif weights == "eos first":  # every hypothesis ends at once
                    projection[d.eos()].mul_(60).add_(projection.abs().max())
            self.cache[key] = (model.float(), copy.deepcopy(model).double(), d)
        return self.cache[key]


def random_case(rng: random.Random):
    vocab = rng.choice(["usual", "usual", "small"])
    beam = rng.choice([1, 2, 3, 4, 5, 8])
    max_len_b = rng.choice([1, 2, 5, 12, 12])
    case = dict(
        arch=rng.choice(ARCHS), kinds=rng.choice(KINDS), vocab=vocab,
        weights=rng.choice(["random", "decisive", "decisive", "eos first"]),
        lengths=[rng.choice([1, 2, 3, 5, 8, 12]) for _ in range(rng.choice([1, 1, 2, 3, 5, 8]))],
        batch_seed=rng.randrange(10 ** 6),
        options=dict(beam_size=beam, max_len_a=rng.choice([0, 0, 0, 1.2]), max_len_b=max_len_b,
                     min_len=rng.choice([1, 1, 2, 3]), len_penalty=rng.choice([1.0, 1.0, 0.5, 1.4, 2.0]),
                     unk_penalty=rng.choice([0.0, 0.0, 1.5, -1.0]),
                     no_repeat_ngram_size=rng.choice([0, 0, 0, 2, 3]),
                     temperature=rng.choice([1.0, 1.0, 0.7, 1.5])),
        prefix=rng.random() < 0.1,
    )
    return case


def sample_of(case, dictionary):
    g = torch.Generator().manual_seed(case["batch_seed"])
    lengths = case["lengths"]
    src = torch.full((len(lengths), max(lengths)), dictionary.pad(), dtype=torch.long)
    for i, n in enumerate(lengths):  # left-padded, each ending with EOS (a 1-token source: EOS alone)
        words = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g)
        src[i, src.size(1) - n:] = torch.cat([words, torch.tensor([dictionary.eos()])])
    prefix = None
    if case["prefix"]:
        prefix = torch.randint(dictionary.nspecial, len(dictionary), (len(lengths), 1), generator=g)
    return {"id": torch.arange(len(lengths)),
            "net_input": {"src_tokens": src, "src_lengths": torch.tensor(lengths)}}, prefix


def decode(cls, model, dictionary, sample, prefix, options):
    with torch.no_grad():
        return cls([model], dictionary, **options).generate([model], sample, prefix_tokens=prefix)


def agree(ours, theirs) -> bool:
    if len(ours) != len(theirs):
        return False
    for mine, fairseqs in zip(ours, theirs):
        if [h["tokens"].tolist() for h in mine] != [h["tokens"].tolist() for h in fairseqs]:
            return False
        for a, b in zip(mine, fairseqs):
            if not torch.allclose(a["score"].double(), b["score"].double(), **SCORES) or not torch.allclose(
                    a["positional_scores"].double(), b["positional_scores"].double(), **SCORES):
                return False
    return True


def one_sentence(sample, prefix, i):
    part = {"id": sample["id"][i:i + 1],
            "net_input": {k: v[i:i + 1] for k, v in sample["net_input"].items()}}
    return part, None if prefix is None else prefix[i:i + 1]


def classify(case, models):
    """'same', a tie ('fairseq alone', 'float32 rounding'), or 'defect'."""
    model, model64, d = models.get(case["arch"], case["kinds"], case["vocab"], case["weights"])
    sample, prefix = sample_of(case, d)
    options = case["options"]
    if options["min_len"] > int(options["max_len_a"] * sample["net_input"]["src_tokens"].size(1)
                                + options["max_len_b"]):
        options = dict(options, min_len=1)
    ours = decode(PluginBeamSearch, model, d, sample, prefix, options)
    theirs = decode(SequenceGenerator, model, d, sample, prefix, options)
    if agree(ours, theirs):
        return "same"
    differing = [i for i in range(len(ours)) if not agree([ours[i]], [theirs[i]])]
    if all(agree([ours[i]], decode(SequenceGenerator, model, d, *one_sentence(sample, prefix, i), options))
           for i in differing):
        return "tie: fairseq's generator gives the engine's hypotheses for the sentence alone"
    with float64_normalisers():
        if agree(decode(PluginBeamSearch, model64, d, sample, prefix, options),
                 decode(SequenceGenerator, model64, d, sample, prefix, options)):
            return "tie: float32 rounding (both agree in float64)"
    return "defect"


@contextlib.contextmanager
def float64_normalisers():
    """fairseq's ``utils.log_softmax`` (its decoders' normaliser) in the
    inputs' precision: it computes in float32 whatever its input, so a
    float64 model's two candidates within float32 rounding stayed a tie."""
    log_softmax = fairseq_utils.log_softmax

    def in_its_precision(x, dim, onnx_trace=False):
        if x.dtype == torch.float64:
            return torch.nn.functional.log_softmax(x, dim=dim)
        return log_softmax(x, dim, onnx_trace)

    fairseq_utils.log_softmax = in_its_precision
    try:
        yield
    finally:
        fairseq_utils.log_softmax = log_softmax


def run_cases(count, seed, part=0, parts=1):
    rng = random.Random(seed)
    models = Models()
    outcomes, defects = collections.Counter(), []
    for number in range(count):
        case = random_case(rng)  # (every case drawn, so that each part's are the same cases)
        if number % parts != part:
            continue
        try:
            outcome = classify(case, models)
        except Exception as error:  # a crash is a defect too: name the case
            outcome, case = "defect", dict(case, error=repr(error))
        outcomes[outcome] += 1
        if outcome == "defect":
            defects.append((number, case))
    return outcomes, defects


@pytest.mark.parametrize("part", range(PARTS))
def test_random_cases_decode_fairseqs_hypotheses_or_a_tie(part):
    outcomes, defects = run_cases(DIFFERENTIAL_CASES, SEED, part, PARTS)
    cases = sum(outcomes.values())
    print(f"\n{cases} of {DIFFERENTIAL_CASES} random cases (seed {SEED}, part {part} of {PARTS}): " + ", ".join(
        f"{n} {outcome}" for outcome, n in outcomes.most_common()))
    assert cases == len(range(part, DIFFERENTIAL_CASES, PARTS))
    assert not defects, f"{len(defects)} defects, the first: case {defects[0][0]}: {defects[0][1]}"
    assert outcomes["same"] >= 0.9 * cases  # ties are rare, or the test tests little


@pytest.mark.slow
def test_trained_tiny_models_decode_fairseqs_hypotheses_or_a_tie(trained_checkpoints):
    """The tiny trained models (fairseq's transformer and hard retrieval, a
    few updates: flat distributions, many near-ties), decoded as trained and
    with decode-time kinds."""
    rng = random.Random(SEED + 1)
    d = None
    outcomes, defects = collections.Counter(), []
    for kind in ("soft", "hard"):
        for overrides in ({}, {"dec_self_attn_kind": "hard", "dec_cross_attn_kind": "hard"},
                          {"dec_self_attn_kind": "topk", "dec_cross_attn_kind": "topk", "retrieval_k": 2}):
            model = load_with_overrides(trained_checkpoints[kind], dict(overrides)).float().eval()
            model64 = copy.deepcopy(model).double()
            d = model.decoder.dictionary
            for _ in range(12):
                case = random_case(rng)
                case.update(vocab="trained", arch=kind, kinds=str(overrides), weights="trained")
                models = Models()
                models.cache[(kind, str(overrides), "trained", "trained")] = (model, model64, d)
                outcome = classify(case, models)
                outcomes[outcome] += 1
                if outcome == "defect":
                    defects.append(case)
    assert not defects, f"{len(defects)} defects, the first: {defects[0]}"


def test_case_1563_of_the_long_run_is_a_float32_tie():
    """Case 1563 of seed 2026 (cross+self, hard self-attention, beam 1,
    temperature 1.5, unk penalty 1.5): at its fourth step two candidates'
    log-probabilities are one float32 unit apart, and the searches may pick
    either; in float64 (fairseq's normaliser too) both pick the same."""
    rng, number, built = random.Random(2026), 1563, []
    for n in range(number + 1):
        case = random_case(rng)
        key = (case["arch"], case["kinds"], case["vocab"], case["weights"])
        if n % PARTS == number % PARTS and key not in built:  # (the models its part builds, in order)
            built.append(key)
    assert case["arch"] == "cross_self_transformer" and case["options"]["temperature"] == 1.5
    models = Models()  # a model's weights are seeded by how many its part built before it
    models.cache.update({("built before", i): None for i in range(built.index(key))})
    assert classify(case, models) in ("same", "tie: float32 rounding (both agree in float64)")
    model, model64, d = models.get(case["arch"], case["kinds"], case["vocab"], case["weights"])
    sample, _ = sample_of(case, d)
    with float64_normalisers():
        assert agree(decode(PluginBeamSearch, model64, d, sample, None, case["options"]),
                     decode(SequenceGenerator, model64, d, sample, None, case["options"]))
