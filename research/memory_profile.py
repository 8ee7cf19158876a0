#!/usr/bin/env python
"""Peak memory of training and of decoding, per architecture.

Each (architecture, workload) runs in a fresh process, so that one's peak
cannot hide another's: the model is built (random weights, or a checkpoint),
then the workload runs and the process reports its peak resident memory
(ru_maxrss) and the growth over the memory it held once the model was built,
i.e. what the workload itself needed (activations, gradients, optimizer
state, decoding caches). On CUDA (--device cuda) torch's own peak allocation
is reported instead.

- train: --train-steps forward/backward/Adam steps on random batches of
  --batch-tokens target tokens (sources and targets of --length tokens);
- decode: beam search (--beam) of --num-sentences random sources of --length
  tokens, generating exactly --length tokens.

Example: research/memory_profile.py --arch transformer_soft_small --arch transformer_hard_dec_small
"""

import argparse
import json
import os
import resource
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")


def rss_mb():
    # ru_maxrss is in kilobytes on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args):
    """Run one workload in this process; print one JSON line."""
    import torch
    from hardattn_tools import fixtures, timing

    torch.set_num_threads(1)
    dictionary = fixtures.synthetic_dictionary(args.vocab)
    task = fixtures.DictionaryTask(dictionary)
    spec = fixtures.ModelSpec(name=args.arch, arch=args.arch)
    model = fixtures.load_models([spec], task, arch_overrides={
        "flexible_mean_source_length": float(args.length)})[args.arch]
    device = torch.device(args.device)
    model.to(device)
    cuda = device.type == "cuda"
    built = current_rss_mb()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        built = torch.cuda.memory_allocated() / 2**20
    if args.workload == "train":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        n = max(1, args.batch_tokens // args.length)
        batches = fixtures.training_batches(task, args.train_steps, n * args.length, dictionary)
        model.train()
        for batch in batches:
            batch = {"net_input": {k: v.to(device) for k, v in batch["net_input"].items()},
                     "target": batch["target"].to(device)}
            optimizer.zero_grad()
            logits, _ = model(**batch["net_input"])
            torch.nn.functional.cross_entropy(
                logits.view(-1, logits.size(-1)), batch["target"].view(-1)).backward()
            optimizer.step()
    else:
        batches = fixtures.random_batches(dictionary, args.num_sentences, args.length,
                                           args.num_sentences)
        model = fixtures.prepare_for_decoding(model, args.beam)
        generator = fixtures.make_generator(model, dictionary, args.beam, args.length)
        batches = [{**b, "net_input": {k: v.to(device) for k, v in b["net_input"].items()}}
                   for b in batches]
        timing.decode(generator, batches)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else rss_mb()
    print(json.dumps({"arch": args.arch, "workload": args.workload, "peak_mb": round(peak, 1),
                      "workload_mb": round(peak - built, 1),
                      "params": sum(p.numel() for p in model.parameters())}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", action="append", required=True)
    p.add_argument("--workload", choices=["train", "decode", "both"], default="both")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--num-sentences", type=int, default=64)
    p.add_argument("--length", type=int, default=30)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json")
    p.add_argument("--markdown")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.arch = args.arch[0]
        return child(args)

    workloads = ["train", "decode"] if args.workload == "both" else [args.workload]
    rows = []
    for arch in args.arch:
        for workload in workloads:
            print(f"[memory] {arch}: {workload}", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--child", "--arch", arch, "--workload", workload]
            for name in ("batch_tokens", "train_steps", "num_sentences", "length", "beam",
                         "vocab", "device"):
                cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"memory_profile: {arch} {workload} failed:\n{proc.stderr[-2000:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    lines = ["| arch | workload | peak MB | MB used by the workload |", "|---|---|---|---|"]
    lines += [f"| {r['arch']} | {r['workload']} | {r['peak_mb']:.0f} | {r['workload_mb']:.0f} |"
              for r in rows]
    from hardattn_tools.reporting import write_outputs

    write_outputs({"settings": vars(args), "results": rows}, "\n".join(lines), args.json,
                  args.markdown)


if __name__ == "__main__":
    main()
