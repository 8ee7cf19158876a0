"""CTranslate2 as a peer in the decoding benchmarks: the engine users pick
for fast decoding, given the same weights (a fairseq ``transformer``, or one
of this plugin's soft transformers: the same parameters) through its own
fairseq converter, decoding the same batches with the same beam and the same
number of steps, timed in turn with the other models.

``ctranslate2`` is a benchmark extra (``pip install -e .[bench]``), never
needed by the plugin.
"""

import argparse
import os
from typing import Callable, List

from fairseq_hardattn.errors import ConfigError
from fairseq_hardattn.modules import CachedProjectionAttention, SoftAttention
from .scratch import scratch_folder

COMPUTE_TYPES = ("float32", "int8", "int8_float32", "int16")


def _fairseq_transformer_flags(model) -> List[str]:
    """fairseq-train flags that build ``model`` as fairseq's ``transformer``."""
    cfg = model.cfg
    flags = ["--arch", "transformer",
             "--encoder-embed-dim", cfg.encoder.embed_dim, "--decoder-embed-dim", cfg.decoder.embed_dim,
             "--encoder-ffn-embed-dim", cfg.encoder.ffn_embed_dim,
             "--decoder-ffn-embed-dim", cfg.decoder.ffn_embed_dim,
             "--encoder-layers", cfg.encoder.layers, "--decoder-layers", cfg.decoder.layers,
             "--encoder-attention-heads", cfg.encoder.attention_heads,
             "--decoder-attention-heads", cfg.decoder.attention_heads]
    for option, on in (("--encoder-normalize-before", cfg.encoder.normalize_before),
                       ("--decoder-normalize-before", cfg.decoder.normalize_before),
                       ("--share-all-embeddings", cfg.share_all_embeddings),
                       ("--share-decoder-input-output-embed", cfg.share_decoder_input_output_embed),
                       ("--no-scale-embedding", cfg.no_scale_embedding),
                       ("--layernorm-embedding", cfg.layernorm_embedding)):
        if on:
            flags.append(option)
    return [str(flag) for flag in flags]


def check_convertible(name: str, model):
    """A fairseq transformer, or a plugin model whose every attention is soft."""
    from fairseq.models.transformer import TransformerModel

    attention = [m for m in model.modules() if isinstance(m, CachedProjectionAttention)]
    plugin_soft = (type(model).__module__.startswith("fairseq_hardattn.") and attention
                   and all(type(m) is SoftAttention for m in attention))
    if type(model) is not TransformerModel and not plugin_soft:
        raise ConfigError(f"--ctranslate2 converts a fairseq transformer (or the plugin's soft one); "
                          f"{name} is {type(model).__name__}")


def convert(model, dictionary, work_dir: str) -> str:
    """``model``'s weights as a CTranslate2 model directory (in ``work_dir``)."""
    import torch
    from ctranslate2.converters import FairseqConverter
    from fairseq import options

    for lang in ("src", "tgt"):  # the plugin's models share one dictionary
        dictionary.save(os.path.join(work_dir, f"dict.{lang}.txt"))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [work_dir, "--task", "translation", "-s", "src", "-t", "tgt"]
                                       + _fairseq_transformer_flags(model))
    checkpoint = os.path.join(work_dir, "transformer.pt")
    torch.save({"args": args, "cfg": None, "model": model.state_dict()}, checkpoint)
    output = os.path.join(work_dir, "ct2")
    try:
        FairseqConverter(checkpoint, work_dir, source_lang="src", target_lang="tgt",
                         unsafe_deserialization=True).convert(output, force=True)
    except RuntimeError as error:  # e.g. parameters a fairseq transformer does not have
        raise ConfigError(f"--ctranslate2: these weights are not a fairseq transformer's "
                          f"({str(error).splitlines()[0][:200]})") from None
    return output


# CTranslate2's two ways of using several cores: one batch over all of them
# (intra-op threads), or a batch per core (inter_threads, one thread each)
CONFIGS = ("intra", "inter")


def runner(model_dir: str, compute_type: str, dictionary, batches, beam: int, steps: int,
           threads: int, config: str = "intra") -> Callable[[], int]:
    """A function that decodes ``batches`` (fairseq samples) with CTranslate2,
    every hypothesis exactly ``steps`` tokens (EOS included, as fairseq's
    fixed-length decoding), and returns the tokens generated. ``config``
    ``intra``: one batch at a time on ``threads`` threads; ``inter``:
    ``threads`` batches at a time, one thread each (submitted at once)."""
    import ctranslate2

    inter = threads if config == "inter" else 1
    translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type,
                                        inter_threads=inter, intra_threads=threads // inter)
    pad, eos = dictionary.pad(), dictionary.eos()
    sources = [[[dictionary[int(t)] for t in row if int(t) not in (pad, eos)]
                for row in batch["net_input"]["src_tokens"]] for batch in batches]
    options = dict(beam_size=beam, min_decoding_length=steps, max_decoding_length=steps,
                   return_end_token=True)

    def run() -> int:
        results = [translator.translate_batch(words, max_batch_size=len(words), asynchronous=inter > 1,
                                              **options) for words in sources]
        return sum(len((r.result() if inter > 1 else r).hypotheses[0]) for batch in results for r in batch)

    return run


def peer_names(specs, threads: int) -> List[str]:
    """The peers ``--ctranslate2`` gives on ``threads`` threads: one per spec
    on one thread; on more, each in both configurations (NAME: intra-op
    threads, NAME_inter: a batch per thread)."""
    names = [text.partition("=")[0] for text in specs or []]
    return names if threads == 1 else [n + suffix for n in names for suffix in ("", "_inter")]


def peers(specs, models, dictionary, batches, beam, fixed_output_len, threads, only=None):
    """name -> runner for each ``--ctranslate2 NAME=MODEL:COMPUTE_TYPE`` in
    each configuration (``peer_names``); ``only``: just that peer."""
    if specs and not fixed_output_len:
        raise ConfigError("--ctranslate2 needs --fixed-output-len (its length limits are not fairseq's)")
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ConfigError("--ctranslate2 needs the ctranslate2 package (pip install -e .[bench])") from None
    runs, converted = {}, {}
    work = str(scratch_folder("ct2-"))
    for text in specs or []:
        name, _, source = text.partition("=")
        model_name, _, compute_type = source.partition(":")
        if not name or model_name not in models or compute_type not in COMPUTE_TYPES:
            raise ConfigError(f"--ctranslate2 {text!r}: expected NAME=MODEL:COMPUTE_TYPE, MODEL one of "
                              f"{sorted(models)}, COMPUTE_TYPE one of {COMPUTE_TYPES}")
        for peer in peer_names([text], threads):
            if only is not None and peer != only:
                continue
            if model_name not in converted:
                check_convertible(model_name, models[model_name])
                directory = os.path.join(work, model_name)
                os.makedirs(directory)
                converted[model_name] = convert(models[model_name], dictionary, directory)
            runs[peer] = runner(converted[model_name], compute_type, dictionary, batches, beam,
                                fixed_output_len + 1, threads, "inter" if peer.endswith("_inter") else "intra")
    return runs


def add_args(parser: argparse.ArgumentParser):
    parser.add_argument("--ctranslate2", action="append", metavar="NAME=MODEL:COMPUTE_TYPE",
                        help="CTranslate2 decoding MODEL's weights (a fairseq transformer or the "
                             f"plugin's soft one) in COMPUTE_TYPE ({', '.join(COMPUTE_TYPES)}), "
                             "with --fixed-output-len; needs the ctranslate2 package")
