#!/usr/bin/env python
"""Attention pictures of a trained model for one sentence pair.

- Heatmaps per layer (rows) and head (columns) of the decoder cross-attention
  (and, with --sublayer, decoder or encoder self-attention): soft weights, or
  for hard retrieval attention the chosen key of each query (a one-hot row).
- For flexible attention, the penalty strength g_t over the decoding steps of
  the model's own translation (Shu & Nakayama's Figure 5), per layer.

The pair is test sentence --index of a fairseq data-bin (teacher-forced on its
reference), or --source/--target text (tokenized and BPE'd like the data).

Example: scripts/plot_attention.py --data data-bin --checkpoint hard.pt --index 3 --out hard.png
"""

import argparse
import contextlib
import logging
import sys
import warnings

import torch

warnings.filterwarnings("ignore")
logging.getLogger("fairseq").setLevel(logging.WARNING)

from fairseq import checkpoint_utils  # noqa: E402
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

from hardattn_tools.fixtures import setup_translation_task  # noqa: E402
from hardattn_tools.plotting import pyplot  # noqa: E402
from fairseq_hardattn.modules import FlexibleAttention  # noqa: E402

SUBLAYERS = {"cross": ("decoder", "encoder_attn"), "decoder-self": ("decoder", "self_attn"),
             "encoder-self": ("encoder", "self_attn")}


@contextlib.contextmanager
def capture_weights(model, sublayer):
    """Per-layer (heads, tgt, src) weights of ``sublayer`` from the forwards
    inside the ``with`` block; the modules are restored on leaving it."""
    side, name = SUBLAYERS[sublayer]
    captured, patched = [], []
    for layer in getattr(model, side).layers:
        module = getattr(layer, name)
        if module is None:
            raise SystemExit(f"plot_attention: this model has no {sublayer} attention")
        original = module.forward

        def forward(*args, _original=original, **kwargs):
            kwargs["need_weights"] = kwargs["need_head_weights"] = True
            out, weights = _original(*args, **kwargs)
            if weights is None:
                raise SystemExit(f"plot_attention: {type(module).__name__} returns no weights")
            if weights.dim() == 3:  # fairseq's fused path averages over heads
                weights = weights.unsqueeze(0)
            captured.append(weights[:, 0].detach().float())  # (heads, tgt, src), sentence 0
            return out, weights

        module.forward = forward
        patched.append(module)
    try:
        yield captured
    finally:
        for module in patched:
            del module.forward  # back to the class's forward


def gate_trace(model, task, sample):
    """Mean g_t per flexible layer over the decoding steps of the model's own
    translation (greedy), and the tokens produced."""
    layers = [layer.encoder_attn for layer in model.decoder.layers
              if isinstance(getattr(layer, "encoder_attn", None), FlexibleAttention)]
    if not layers:
        return None, None
    trace = [[] for _ in layers]
    for i, module in enumerate(layers):
        module.register_forward_hook(
            lambda m, args, out, i=i: trace[i].append(float(m.last_gates[-1, 0].mean())))
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=1, max_len_b=100)
    with torch.no_grad():
        hypo = generator.generate(None, sample)[0][0]
    return [t[: len(hypo["tokens"])] for t in trace], hypo["tokens"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="fairseq data-bin")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--index", type=int, default=0, help="test sentence to show")
    p.add_argument("--subset", default="test")
    p.add_argument("--sublayer", choices=sorted(SUBLAYERS), default="cross")
    p.add_argument("--model-overrides", default="{}")
    p.add_argument("--out", required=True, help="PNG path for the heatmaps")
    p.add_argument("--gate-out", help="PNG path for the flexible-attention gate trace")
    args = p.parse_args(argv)

    plt = pyplot()

    task = setup_translation_task(args.data)
    from fairseq_hardattn.compat import loading

    with loading():
        models, _ = checkpoint_utils.load_model_ensemble(
            [args.checkpoint], arg_overrides=eval(args.model_overrides), task=task)
    model = models[0].eval()
    task.load_dataset(args.subset)
    dataset = task.dataset(args.subset)
    if not 0 <= args.index < len(dataset):
        p.error(f"--index must be in [0, {len(dataset)})")
    sample = dataset.collater([dataset[args.index]])
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    src_words = [src_dict[i] for i in sample["net_input"]["src_tokens"][0]]
    tgt_words = [tgt_dict[i] for i in sample["target"][0]]

    with capture_weights(model, args.sublayer) as captured, torch.no_grad():
        model(**sample["net_input"])
    layers, heads = len(captured), captured[0].size(0)
    keys = src_words if args.sublayer != "decoder-self" else ["<s>"] + tgt_words[:-1]
    queries = tgt_words if args.sublayer != "encoder-self" else src_words
    fig, axes = plt.subplots(layers, heads, figsize=(2.2 * heads + 1, 2.2 * layers + 1),
                             squeeze=False)
    for l, weights in enumerate(captured):
        for h in range(heads):
            ax = axes[l][h]
            ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0, vmax=1, aspect="auto")
            ax.set_title(f"layer {l + 1} head {h + 1}", fontsize=7)
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=5)
            ax.set_yticks(range(len(queries)), queries, fontsize=5)
    kind = type(getattr(getattr(model, SUBLAYERS[args.sublayer][0]).layers[0],
                        SUBLAYERS[args.sublayer][1])).__name__
    fig.suptitle(f"{args.sublayer} attention ({kind}), {args.subset} sentence {args.index}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"wrote {args.out}", file=sys.stderr)

    if args.gate_out:
        trace, tokens = gate_trace(model, task, {"net_input": sample["net_input"]})
        if trace is None:
            p.error("--gate-out needs a model with flexible attention")
        words = [tgt_dict[i] for i in tokens]
        fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(words)), 3))
        for l, values in enumerate(trace):
            ax.plot(range(len(values)), values, marker="o", label=f"layer {l + 1}")
        ax.set_xticks(range(len(words)), words, rotation=60, fontsize=7)
        ax.set_ylim(0, 1)
        ax.set_ylabel("g_t (mean over heads)")
        ax.set_title("flexible attention: penalty strength per decoding step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.gate_out, dpi=130)
        print(f"wrote {args.gate_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
