#!/usr/bin/env python
"""The Linear layer on each CPU kernel at the shapes of a decoding step:
float32 as ``nn.Linear`` runs it (MKL) and packed for oneDNN
(``decoding/packed_linear.py``), the plugin's int8 Linear
(``decoding/int8.py``, ``kernels/int8_linear.c``) and PyTorch's dynamic int8
Linear packed for each quantized engine (its default, x86 / fbgemm, and
oneDNN) for comparison: the evidence behind which layers the search packs
in float32 (``MIN_PACKED_WEIGHT``) and what int8 decoding gains on this CPU.

Shapes are rows x in -> out: hypotheses (batch x beam) by the layer's
dimensions; the defaults are the small preset's (256 rows; d = 128, FFN 256,
a 10k vocabulary) and Transformer Base's (128 rows; d = 512, FFN 2048).
Timed with torch.utils.benchmark (median of interleaved measurements), one
thread by default, with glibc's heap thresholds as the search sets them.

Example: OMP_NUM_THREADS=1 research/linear_engines.py --json results/linear_engines.json
"""

import argparse
import os
import statistics
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils import benchmark  # noqa: E402

from fairseq_hardattn.decoding import packed_linear  # noqa: E402
from fairseq_hardattn.decoding.heap import keep_large_blocks_in_the_heap  # noqa: E402
from fairseq_hardattn.decoding.int8 import Int8Linear  # noqa: E402
from hardattn_tools.fixtures import device_name  # noqa: E402
from hardattn_tools.reporting import write_outputs  # noqa: E402

# the small preset's shapes, the smallest weight that packs (256 x 256), Base's
DEFAULT_SHAPES = ("256x128x128", "256x128x256", "256x256x128", "256x128x10000", "128x256x256",
                  "128x512x512", "128x512x2048", "128x2048x512", "128x512x10000")
FLOAT32, FLOAT32_ONEDNN, INT8 = "float32", "float32 onednn", "int8 plugin"


def pytorch_int8(layer: nn.Linear, engine: str) -> nn.Module:
    """PyTorch's dynamic int8 Linear of ``layer``, packed for ``engine``."""
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        return torch.ao.quantization.quantize_dynamic(nn.Sequential(layer), {nn.Linear}, dtype=torch.qint8)
    finally:
        torch.backends.quantized.engine = previous


@torch.no_grad()
def costs(rows: int, features_in: int, features_out: int, engines, repeats: int, min_run_time: float):
    """Microseconds per call (median of ``repeats`` interleaved measurements) per variant."""
    layer = nn.Linear(features_in, features_out)
    x = torch.randn(rows, features_in)
    # the two float32 kernels called alike (a module call would cost one of them
    # a few microseconds the other is spared); the int8 ones as modules, alike
    variants = {FLOAT32: lambda x: nn.functional.linear(x, layer.weight, layer.bias),
                INT8: Int8Linear(layer), **{e: pytorch_int8(layer, e) for e in engines}}
    if packed_linear.onednn_linear_available():
        variants[FLOAT32_ONEDNN] = packed_linear.packed_forward(layer)
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, module in variants.items():
            timer = benchmark.Timer("m(x)", globals={"m": module, "x": x})
            times[name].append(timer.blocked_autorange(min_run_time=min_run_time).median * 1e6)
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="ROWSxINxOUT")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args(argv)
    try:
        shapes = [tuple(int(n) for n in text.split("x")) for text in args.shapes]
        if any(len(shape) != 3 or min(shape) < 1 for shape in shapes):
            raise ValueError
    except ValueError:
        p.error("--shapes: give ROWSxINxOUT, e.g. 256x128x10000")
    torch.set_num_threads(args.threads)
    keep_large_blocks_in_the_heap()
    default = torch.backends.quantized.engine
    engines = [default] + [e for e in ("onednn",) if e in torch.backends.quantized.supported_engines
                           and e != default]
    results = []
    for rows, features_in, features_out in shapes:
        print(f"[linear_engines] {rows} rows, {features_in} -> {features_out}", file=sys.stderr, flush=True)
        results.append({"rows": rows, "in": features_in, "out": features_out,
                        **costs(rows, features_in, features_out, engines, args.repeats,
                                args.min_run_time)})
    float32 = [v for v in (FLOAT32, FLOAT32_ONEDNN) if v in results[0]]
    columns = float32 + [INT8] + engines
    ratios = [(v, FLOAT32) for v in float32[1:]] + [(INT8, FLOAT32)] + [(INT8, e) for e in engines]
    label = {c: c if c in float32 + [INT8] else f"int8 torch {c}" for c in columns}
    lines = ["| rows x in -> out | " + " | ".join(label[c] for c in columns) + " | "
             + " | ".join(f"{label[a]} vs {label[b]}" for a, b in ratios) + " |",
             "|" + "---|" * (1 + len(columns) + len(ratios))]
    for r in results:
        cells = [f"{r['rows']} x {r['in']} -> {r['out']}"] + [f"{r[c]:.1f}" for c in columns]
        cells += [f"{r[b] / r[a]:.2f}x" for a, b in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    cpu = device_name("cpu")
    print(f"microseconds per call, median; {cpu}, {args.threads} thread(s); "
          f"float32 packs weights of at least {packed_linear.MIN_PACKED_WEIGHT} elements for oneDNN\n")
    settings = dict(vars(args), torch=torch.__version__, device_name=cpu,
                    min_packed_weight=packed_linear.MIN_PACKED_WEIGHT, int8_engines=engines)
    write_outputs({"settings": settings, "results": results}, "\n".join(lines), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
