#!/usr/bin/env python
"""Time of decoder cross-attention alone, per decoding step, for each mechanism
side by side: fairseq's soft attention, hard retrieval, local and flexible.

Each mechanism is one attention module (random weights, eval mode) decoding
``--steps`` target positions from scratch, as beam search drives it: the
first step projects and caches the encoder states (reported apart, the same
for all), every later step projects the query, attends and projects the
output. Hypotheses of a sentence get nearby queries (a shared random state
plus ``--spread`` times noise), as beam hypotheses do. The mechanisms run
interleaved, ``--reps`` times; medians are reported, with flexible and local
attention's score computations per step (CPS, in a separate untimed pass).

Where the time goes: ``--profile flexible`` (or any mechanism) prints the
torch profiler's table of one decoding pass.

Example (Transformer Base dims, 100-token sources, beam 4):
  research/attention_step_costs.py --src-len 100 200 --threads 1
"""

import argparse
import math
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from fairseq.modules import MultiheadAttention  # noqa: E402

from fairseq_hardattn import ConfigError  # noqa: E402
from fairseq_hardattn.modules import (  # noqa: E402
    FlexibleAttention,
    HardRetrievalAttention,
    LocalAttention,
    decoding_step,
)
from hardattn_tools.fixtures import DTYPES, check_device  # noqa: E402
from hardattn_tools.reporting import write_outputs  # noqa: E402
from hardattn_tools.timing import synchronize  # noqa: E402

# flexible_torch_ops: flexible attention without its C kernel (as on GPU);
# flexible_small_gate: with a --small-gate-dim gate network (--flexible-gate-dim)
MECHANISMS = ("soft", "hard", "local", "flexible", "flexible_torch_ops", "flexible_small_gate")


def build(mechanism, args, threshold):
    kwargs = dict(kdim=args.embed_dim, vdim=args.embed_dim, dropout=0.0,
                  encoder_decoder_attention=True)
    if mechanism == "soft":
        module = MultiheadAttention(args.embed_dim, args.heads, **kwargs)
    elif mechanism == "hard":
        module = HardRetrievalAttention(args.embed_dim, args.heads, **kwargs)
    elif mechanism == "local":
        module = LocalAttention(args.embed_dim, args.heads, window=args.window, **kwargs)
    else:
        gate_dim = args.small_gate_dim if mechanism == "flexible_small_gate" else None
        module = FlexibleAttention(args.embed_dim, args.heads, sigma=args.sigma,
                                   threshold=threshold, gate_dim=gate_dim, **kwargs)
        module.use_kernel = mechanism != "flexible_torch_ops"
    module.set_beam_size(args.beam)  # fairseq's own attention takes the beam so
    return module.to(device=args.device, dtype=DTYPES[args.dtype]).eval()


def decoding_inputs(args, src_len, seed):
    g = torch.Generator().manual_seed(seed)
    hyps = args.batch * args.beam
    encoder = torch.randn(src_len, args.batch, args.embed_dim, generator=g)
    encoder = encoder.repeat_interleave(args.beam, dim=1)  # as the generator expands it
    queries = [
        torch.randn(1, args.batch, args.embed_dim, generator=g).repeat_interleave(args.beam, dim=1)
        + args.spread * torch.randn(1, hyps, args.embed_dim, generator=g)
        for _ in range(args.steps)
    ]
    dtype = DTYPES[args.dtype]
    return (encoder.to(args.device, dtype),
            [query.to(args.device, dtype) for query in queries])


def decode(module, encoder, queries, beam):
    """Seconds of the first step (encoder K/V projected) and of the others."""
    state = {}
    # ours read the hypotheses per sentence from the decoding call, as the decoder sets it
    decoding_step.set_hypotheses_per_sentence(state, beam)
    with torch.no_grad():
        synchronize()
        start = time.perf_counter()
        module(queries[0], encoder, encoder, incremental_state=state, static_kv=True)
        synchronize()
        first = time.perf_counter()
        for query in queries[1:]:
            module(query, None, None, incremental_state=state, static_kv=True)
        synchronize()
        end = time.perf_counter()
    return first - start, end - first


def score_computations(module, encoder, queries, beam):
    """CPS of one decoding pass and the global CPS (all source positions)."""
    if not hasattr(module, "cps"):
        return None
    module.cps.enabled = True
    module.cps.reset()
    decode(module, encoder, queries, beam)
    summary = module.cps.summary()
    module.cps.enabled = False
    return summary


def median(values):
    return sorted(values)[len(values) // 2]


def run(args, src_len):
    # the paper's rule, S̄ = src_len
    threshold = args.threshold if args.threshold is not None else math.log10(src_len)
    torch.manual_seed(args.seed)
    modules = {m: build(m, args, threshold) for m in args.mechanisms}
    if {"flexible", "flexible_torch_ops"} <= set(modules):  # the same weights, two implementations
        modules["flexible_torch_ops"].load_state_dict(modules["flexible"].state_dict())
    if {"flexible", "flexible_small_gate"} <= set(modules):  # the same weights but the gate
        shared = {k: v for k, v in modules["flexible"].state_dict().items()
                  if not k.startswith("gate_")}
        modules["flexible_small_gate"].load_state_dict(shared, strict=False)
    encoder, queries = decoding_inputs(args, src_len, args.seed)
    for module in modules.values():  # warm-up
        decode(module, encoder, queries, args.beam)
    first = {m: [] for m in modules}
    steps = {m: [] for m in modules}
    for _ in range(args.reps):
        for name, module in modules.items():
            a, b = decode(module, encoder, queries, args.beam)
            first[name].append(a)
            steps[name].append(b)
    base = median(steps[args.mechanisms[0]])
    rows = []
    for name, module in modules.items():
        cps = score_computations(module, encoder, queries, args.beam)
        rows.append({
            "mechanism": name, "src_len": src_len,
            "step_us": median(steps[name]) / (len(queries) - 1) * 1e6,
            "first_step_us": median(first[name]) * 1e6,
            "ratio": median(steps[name]) / base,
            "cps": None if cps is None else cps["cps"],
            "global_cps": None if cps is None else cps["global_cps"],
        })
    if args.profile:
        from torch.profiler import profile
        for name in args.profile:
            with profile() as prof:
                decode(modules[name], encoder, queries, args.beam)
            print(f"\n{name}, {src_len} source tokens: one decoding pass of {len(queries)} steps")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    return rows, threshold


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=MECHANISMS,
                   help="the first is the baseline of the ratios")
    p.add_argument("--src-len", type=int, nargs="+", default=[100])
    p.add_argument("--embed-dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="sentences")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--steps", type=int, default=20, help="target positions decoded")
    p.add_argument("--spread", type=float, default=0.1,
                   help="noise between a sentence's hypotheses' queries")
    p.add_argument("--threshold", type=float, default=None,
                   help="flexible attention's tau (default: the paper's rule, log10 of src-len)")
    p.add_argument("--sigma", type=float, default=3.0, help="flexible attention's σ")
    p.add_argument("--small-gate-dim", type=int, default=None,
                   help="flexible_small_gate's gate network size (default: embed dim / 4)")
    p.add_argument("--window", type=int, default=10, help="local attention's D")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu or cuda (timed with CUDA synchronisation)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", nargs="*", choices=MECHANISMS, default=[])
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step only caches the encoder states)")
    if args.embed_dim % args.heads:
        p.error(f"--embed-dim {args.embed_dim} is not divisible by --heads {args.heads}")
    if min(args.src_len) < 1:
        p.error("--src-len must be >= 1")
    if args.small_gate_dim is None:
        args.small_gate_dim = max(1, args.embed_dim // 4)
    if args.small_gate_dim < 1:
        p.error(f"--small-gate-dim must be >= 1, got {args.small_gate_dim}")
    if not args.sigma > 0:
        p.error(f"--sigma must be > 0, got {args.sigma}")
    try:
        check_device(args.device)
    except ConfigError as error:
        p.error(str(error))
    torch.set_num_threads(args.threads)
    results = []
    lines = [f"Decoder cross-attention, one decoding step: {args.batch} sentences x beam "
             f"{args.beam}, d={args.embed_dim}, {args.heads} heads, random weights, {args.device} "
             f"{args.dtype}, {args.threads} thread(s), median of {args.reps}; ratio vs {args.mechanisms[0]}\n",
             "| source tokens | mechanism | us/step | ratio | CPS (of global) | "
             "first step (caches K/V), us |", "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for src_len in args.src_len:
        rows, threshold = run(args, src_len)
        for r in rows:
            cps = "" if r["cps"] is None else f"{r['cps']:.1f} ({r['cps'] / r['global_cps']:.0%})"
            name = r["mechanism"]
            if name.startswith("flexible"):
                gate = args.small_gate_dim if name == "flexible_small_gate" else args.embed_dim
                name += f" (σ {args.sigma:g}, tau {threshold:.2f}, gate {gate})"
            lines.append(f"| {src_len} | {name} | {r['step_us']:.0f} | {r['ratio']:.2f} | {cps} | "
                         f"{r['first_step_us']:.0f} |")
            print(lines[-1], flush=True)
        results.extend(rows)
    write_outputs({"settings": dict(vars(args), torch=torch.__version__), "results": results},
                  "\n".join(lines), args.json, args.markdown, echo=False)


if __name__ == "__main__":
    sys.exit(main())
