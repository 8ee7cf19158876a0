#!/usr/bin/env python
"""Per-operation cost of one decoding step's attention, soft vs hard retrieval
(the hard-attention paper's Table 2): compare (q·Kᵀ), normalize (softmax) vs
argmax, attend (P·V) vs index (retrieval), on decoder-shaped tensors.

Shapes: hypotheses = batch x beam, heads x head_dim = the model dims (Base:
8 x 64), one query per step, keys = source length (cross-attention) or the
target prefix (self-attention). Timed with torch.utils.benchmark (warm-up,
adaptive repetitions; median). Runs on CPU, or on CUDA with --device cuda.

Example: research/op_costs.py --threads 1 --json results/op_costs.json
"""

import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils import benchmark  # noqa: E402

from fairseq_hardattn.modules.gather import retrieve  # noqa: E402
from hardattn_tools.fixtures import device_name  # noqa: E402
from hardattn_tools.reporting import write_outputs  # noqa: E402


def measure(stmt, min_run_time, **tensors):
    timer = benchmark.Timer(stmt=stmt, globals=dict(tensors, torch=torch, F=F, retrieve=retrieve))
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e6  # microseconds


def op_costs(hypotheses, heads, head_dim, keys, device, dtype, min_run_time):
    rows = hypotheses * heads
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(rows, 1, head_dim, generator=g).to(device, dtype)
    k = torch.randn(rows, keys, head_dim, generator=g).to(device, dtype)
    v = torch.randn(rows, keys, head_dim, generator=g).to(device, dtype)
    scores = torch.bmm(q, k.transpose(1, 2))
    probs = F.softmax(scores.float(), dim=-1).type_as(scores)
    indices = scores.argmax(-1)
    value_rows = torch.arange(rows, device=device)
    sync = "; torch.cuda.synchronize()" if device.startswith("cuda") else ""
    t = lambda stmt, **kw: measure(stmt + sync, min_run_time, **kw)
    costs = {
        "compare": t("torch.bmm(q, k.transpose(1, 2))", q=q, k=k),
        "normalize": t("F.softmax(scores.float(), dim=-1).type_as(scores)", scores=scores),
        "argmax": t("scores.argmax(-1)", scores=scores),
        "attend": t("torch.bmm(probs, v)", probs=probs, v=v),
        "index": t("retrieve(v, value_rows, indices)", v=v, value_rows=value_rows, indices=indices),
    }
    costs["total_soft"] = costs["compare"] + costs["normalize"] + costs["attend"]
    costs["total_hard"] = costs["compare"] + costs["argmax"] + costs["index"]
    return {k: round(x, 2) for k, x in costs.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64, help="sentences per batch")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--keys", type=int, nargs="+", default=[25, 50, 100],
                   help="key lengths (source length or target prefix)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--min-run-time", type=float, default=0.3, help="seconds per measurement")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    results = []
    for keys in args.keys:
        print(f"[op_costs] {args.batch}x{args.beam} hypotheses, {args.heads} heads of "
              f"{args.head_dim}, {keys} keys, {args.device}", file=sys.stderr, flush=True)
        costs = op_costs(args.batch * args.beam, args.heads, args.head_dim, keys,
                         args.device, dtype, args.min_run_time)
        results.append({"keys": keys, **costs})
    header = ("| keys | compare | normalize | argmax | attend | index | soft total | "
              "hard total | hard/soft |\n|---|---|---|---|---|---|---|---|---|")
    lines = [header] + [
        f"| {r['keys']} | {r['compare']:.1f} | {r['normalize']:.1f} | {r['argmax']:.1f} | "
        f"{r['attend']:.1f} | {r['index']:.1f} | {r['total_soft']:.1f} | {r['total_hard']:.1f} | "
        f"{r['total_hard'] / r['total_soft']:.2f} |" for r in results]
    table = "\n".join(lines)
    device = device_name(args.device)
    print(f"microseconds per call, median; {device}, {args.threads} thread(s), {args.dtype}\n")
    settings = dict(vars(args), torch=torch.__version__, device_name=device)
    write_outputs({"settings": settings, "results": results}, table, args.json, args.markdown)


if __name__ == "__main__":
    main()
