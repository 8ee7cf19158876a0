"""Every fairseq Transformer through the plugin's engine: a checkpoint of
fairseq's own ``transformer`` family (its published presets, and every
option they use) is decoded by the plugin's search once the plugin is
loaded, with fairseq's hypotheses and scores; ``{'decoding_engine':
'fairseq'}`` keeps fairseq's generator; an option the plugin's layers lack
runs fairseq's model and generator, said in one line."""

import argparse
import copy
import logging

import pytest
import torch
from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn.compat import checkpoints
from fairseq_hardattn.decoding import PluginBeamSearch, generator_class

from conftest import assert_same_hypotheses, make_dictionary, random_batch

TINY = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
        "--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0", "--attention-dropout", "0",
        "--activation-dropout", "0"]
VARIANTS = {
    # fairseq's published presets (their dims made tiny; what else each sets stays)
    "transformer_wmt_en_de_big": ["--arch", "transformer_wmt_en_de_big"],
    "transformer_wmt_en_de_big_t2t": ["--arch", "transformer_wmt_en_de_big_t2t"],
    "transformer_vaswani_wmt_en_de_big": ["--arch", "transformer_vaswani_wmt_en_de_big"],
    "transformer_iwslt_de_en": ["--arch", "transformer_iwslt_de_en"],
    # the options those and other published models use
    "pre-norm": ["--encoder-normalize-before", "--decoder-normalize-before"],
    "learned positions": ["--encoder-learned-pos", "--decoder-learned-pos"],
    "layernorm embedding": ["--layernorm-embedding"],
    "no scale embedding": ["--no-scale-embedding"],
    "shared embeddings, one dictionary": ["--share-all-embeddings"],
    "shared decoder input and output": ["--share-decoder-input-output-embed"],
    "separate dictionaries": ["separate dictionaries"],
    "encoder wider than decoder": ["--encoder-embed-dim", "48", "--encoder-ffn-embed-dim", "96"],
    "decoder output dim": ["--decoder-output-dim", "24"],
}


class TwoDictionaryTask:
    def __init__(self, source, target):
        self.source_dictionary, self.target_dictionary = source, target


def fairseq_and_plugin_models(flags):
    """fairseq's model with random weights (a sharp output layer: one token
    dominates, scores further apart than float32 rounding) and the plugin's
    model that a checkpoint of it decodes as."""
    target = make_dictionary(40)
    source = make_dictionary(33) if "separate dictionaries" in flags else target
    flags = [f for f in flags if f != "separate dictionaries"]
    if "--arch" not in flags:
        flags = ["--arch", "transformer"] + flags
    args = options.parse_args_and_arch(options.get_training_parser(), ["data", *TINY, *flags])
    task = TwoDictionaryTask(source, target)
    torch.manual_seed(0)
    ours_args = copy.deepcopy(args)
    theirs = ARCH_MODEL_REGISTRY[args.arch].build_model(args, task).eval()
    assert type(theirs) is TransformerModel
    with torch.no_grad():
        theirs.decoder.output_projection.weight.mul_(20)
    cfg = {"model": ours_args}
    ours_args._name = checkpoints.plugin_architecture_for(cfg, {})
    ours = ARCH_MODEL_REGISTRY[ours_args._name].build_model(ours_args, task).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours, source, target


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_fairseq_transformer_decodes_fairseqs_hypotheses_through_the_engine(variant):
    theirs, ours, source, target = fairseq_and_plugin_models(VARIANTS[variant])
    assert generator_class([ours], argparse.Namespace())[0] is PluginBeamSearch
    src, lengths, _ = random_batch(source, [9, 7, 6, 4, 3, 8], seed=4)
    sample = {"id": torch.arange(6), "net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        found = PluginBeamSearch([ours], target, beam_size=4, max_len_b=12).generate([ours], sample)
        expected = SequenceGenerator([theirs], target, beam_size=4, max_len_b=12).generate([theirs], sample)
    assert_same_hypotheses(found, expected)


def test_fairseqs_own_cross_self_attention_keeps_fairseqs_model_with_one_line(caplog):
    args = options.parse_args_and_arch(options.get_training_parser(),
                                       ["data", *TINY, "--arch", "transformer", "--cross-self-attention"])
    with caplog.at_level(logging.INFO):
        assert checkpoints.plugin_architecture_for({"model": args}, {}) is None
    assert any("--cross-self-attention (fairseq's own), which the plugin's engine lacks" in r.message
               for r in caplog.records)


def test_transformer_align_keeps_fairseqs_model_with_one_line(caplog):
    """fairseq's transformer_align (alignment heads, trained to align): its
    model and generator, said in one line."""
    args = options.parse_args_and_arch(options.get_training_parser(), ["data", *TINY, "--arch", "transformer_align"])
    with caplog.at_level(logging.INFO):
        assert checkpoints.plugin_architecture_for({"model": args}, {}) is None
    assert [r.message for r in caplog.records if "engine does not build" in r.message] == [
        "the checkpoint is fairseq's transformer_align, which the plugin's engine does not build (what it "
        "adds to the transformer): decoding with fairseq's model and generator"]


