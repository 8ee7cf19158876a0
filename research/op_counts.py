#!/usr/bin/env python
"""Operations and host synchronisations dispatched during one beam search,
per architecture, beside fairseq's own transformer: the per-step overhead a
GPU pays (kernel launches, waits for the device), counted on any device.

Every model decodes the same random batch with fairseq's generator, each
hypothesis for exactly --steps steps; syncs inside the plugin's attention
modules are counted apart (fairseq's generator and decoder make their own).

Usage: research/op_counts.py [--arch NAME=ARCH ...] [--json F] [--markdown F]
"""

import argparse
import os
import sys
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import torch  # noqa: E402

from hardattn_tools import fixtures  # noqa: E402
from hardattn_tools.op_counting import counting  # noqa: E402
from hardattn_tools.reporting import write_outputs  # noqa: E402

DEFAULT_ARCHS = [
    "fairseq=transformer", "fairseq_cross_self=transformer", "soft=transformer_soft",
    "hard=transformer_hard_dec", "cross_self=transformer_cross_self",
    "hard_cross_self=transformer_hard_cross_self", "aan=transformer_aan",
    "local=transformer_local", "flexible=transformer_flexible",
    "flexible_without_kernel=transformer_flexible", "fairseq_lstm=lstm",
    "lstm_flexible=lstm_flexible",
]
OVERRIDES = [
    "fairseq_cross_self={'cross_self_attention': True, 'no_cross_attention': True}",
    "flexible={'flexible_mean_source_length': 12.0}",
    "flexible_without_kernel={'flexible_mean_source_length': 12.0}",
    "lstm_flexible={'flexible_mean_source_length': 12.0}",
]
WITHOUT_KERNEL = "without_kernel"  # models whose name says so run with FAIRSEQ_HARDATTN_KERNELS=0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", action="append", metavar="NAME=ARCH",
                   help=f"default: {', '.join(DEFAULT_ARCHS)}")
    p.add_argument("--override", action="append", metavar="NAME=DICT")
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
    p.add_argument("--sentences", type=int, default=8)
    p.add_argument("--src-len", type=int, default=12)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    archs = args.arch or DEFAULT_ARCHS
    overrides = args.override if args.arch else OVERRIDES
    task = fixtures.DictionaryTask(fixtures.synthetic_dictionary(1000))
    specs = fixtures.parse_model_specs(None, archs, overrides)
    dims = dict(encoder_layers=args.layers, decoder_layers=args.layers, encoder_embed_dim=64,
                decoder_embed_dim=64, encoder_ffn_embed_dim=128, decoder_ffn_embed_dim=128,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_hidden_size=64,
                decoder_hidden_size=64, decoder_out_embed_dim=64, criterion="cross_entropy")
    models = fixtures.load_models(specs, task, arch_overrides=dims)
    (batch,) = fixtures.random_batches(task.source_dictionary, args.sentences, args.src_len,
                                      args.sentences)
    rows = []
    for spec in specs:
        model = fixtures.prepare_for_decoding(models[spec.name], args.beam)
        generator = fixtures.make_generator(model, task.target_dictionary, args.beam, args.steps)
        if WITHOUT_KERNEL in spec.name:
            os.environ["FAIRSEQ_HARDATTN_KERNELS"] = "0"
        try:
            with torch.no_grad(), counting(model) as counts:
                generator.generate(None, batch)
        finally:
            os.environ.pop("FAIRSEQ_HARDATTN_KERNELS", None)
        rows.append({"model": spec.name, "arch": spec.arch, "ops": counts.ops(),
                     "syncs": counts.syncs(), "ops_in_attention": counts.ops(inside=True),
                     "syncs_in_attention": counts.syncs(inside=True),
                     "sync_ops": counts.sync_ops()})
    base = next((r for r in rows if r["arch"] == "transformer" and r["model"] == "fairseq"), rows[0])
    steps = args.steps + 1  # the generator's last step writes EOS
    lines = [f"One beam search: {args.sentences} sentences of {args.src_len} tokens, beam "
             f"{args.beam}, {steps} steps, {args.layers}+{args.layers} layers; ratio to "
             f"`{base['model']}`.", "",
             "| model | ops | ops per step | ops vs fairseq | host syncs | syncs in our attention |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        r["ops_vs_fairseq"] = round(r["ops"] / base["ops"], 3)
        lines.append(f"| {r['model']} | {r['ops']} | {r['ops'] / steps:.0f} | "
                     f"{r['ops_vs_fairseq']:.2f}x | {r['syncs']} | {r['syncs_in_attention']} |")
    settings = dict(vars(args), torch=torch.__version__)
    write_outputs({"settings": settings, "results": rows}, "\n".join(lines), args.json,
                  args.markdown)


if __name__ == "__main__":
    main()
