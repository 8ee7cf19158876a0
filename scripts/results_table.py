#!/usr/bin/env python
"""Assemble results/: one table of every architecture (what it changes, BLEU,
params, speed and ratio, % of the attention-free limit, peak memory) from the
evaluation and benchmark outputs, as Markdown and JSON; and put the table at
the top of README.md, between its ``<!-- results:start -->`` and
``<!-- results:end -->`` markers.

Usage: scripts/results_table.py WORK_DIR RESULTS_DIR [--reference OTHER_WORK_DIR]
(as scripts/results.sh calls it). --reference adds the test2016 scores of
another work dir (e.g. the soft/hard pair trained with a longer budget) as a
second table.
"""

import argparse
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS_TSV = REPO / "examples" / "multi30k" / "runs.tsv"
EXTRA_ROWS = [  # evaluation-only rows: (name, arch, what it changes)
    ("soft_decoded_hard", "transformer_soft_small → hard", "trained soft, decoded with hard retrieval (Table 4)"),
    ("hard_decoded_soft", "transformer_hard_dec_small → soft", "trained hard, decoded soft (Table 4)"),
    ("fairseq_cross_self", "transformer --cross-self-attention --no-cross-attention",
     "fairseq's own cross+self attention (the peer; same trained weights as cross_self)"),
    ("flexible_ft", "transformer_flexible_small + gate loss", "flexible, fine-tuned 1 epoch with CE − 0.1·mean(g)"),
    ("flexible_band_ft", "transformer_flexible_small + gate loss, --flexible-train-threshold",
     "flexible, fine-tuned as flexible_ft, attending only within the bands of τ = log₁₀ S̄"),
    ("flexible_gate32_band_ft", "transformer_flexible_small --flexible-gate-dim 32 + gate loss, "
     "--flexible-train-threshold", "flexible_gate32, fine-tuned as flexible_band_ft"),
    ("soft_ft", "transformer_soft_small, 1 more epoch", "soft, 1 more epoch as flexible_ft's (the control of its gain)"),
]


def load(path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def runs():
    rows = []
    for line in RUNS_TSV.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, arch, flags, what = (line.split("\t") + ["", "", "", ""])[:4]
        rows.append((name, f"{arch} {flags}".strip(), what))
    return rows + EXTRA_ROWS


def cps_of(work, name):
    log = Path(work) / "results" / f"{name}.gen.log"
    if not log.is_file():
        return None
    found = re.search(r"CPS ([\d.]+) \(global attention ([\d.]+)\)", log.read_text())
    return (float(found.group(1)), float(found.group(2))) if found else None


def by_model(benchmark):
    return {r["model"]: r for r in benchmark["results"]} if benchmark else {}


def fmt(value, spec, missing="—"):
    return missing if value is None else format(value, spec)


def budget_note(work):
    """How the runs of ``work`` were trained, from the budget.json results.sh writes."""
    budget = load(Path(work) / "budget.json")
    if not budget:
        return "identical training budget (examples/multi30k/common.sh)"
    return (f"identical training budget: {budget['epochs']} epochs of {budget['max_tokens']}-token "
            f"batches, {budget['warmup_updates']} warmup updates, seed {budget['seed']}, last "
            f"{budget['average_last']} epoch checkpoints averaged, beam {budget['beam']}")


def speed_note(small, base):
    """How the speeds were measured, from the benchmarks' own settings."""
    if not small:
        return "Speeds: not measured yet (scripts/results.sh without SKIP_BENCH)."
    s = small["settings"]
    length = (f", exactly {s['fixed_output_len']} output tokens each" if s.get("fixed_output_len")
              else "")
    note = (f"Speeds: decoding the first {s.get('sentences', '?')} test sentences{length} with beam "
            f"{s['beam']}, batch {s['batch_size']}, {s['threads']} CPU thread(s), median of "
            f"{s['reps']} interleaved repetitions in one process; training speed on "
            f"{s['train_batches']} batches of {s['train_max_tokens']} tokens")
    if base:
        b = base["settings"]
        note += (f"; Base dims: random weights, {b.get('sentences', '?')} test sources, exactly "
                 f"{b['fixed_output_len']} output tokens each")
    return note + " (details: results/speed_*.md)."


CPS_ROWS = [  # the flexible-attention paper's Table 1: (result name, what)
    ("soft", "global attention (soft baseline)"),
    ("local_cps", "local attention (Luong local-p, D=10)"),
    ("flexible_inf", "flexible attention, τ = ∞ (no skipping)"),
    ("flexible_auto", "flexible attention, τ = log₁₀ S̄ (the paper's rule)"),
    ("flexible_ft_inf", "+ fine-tuning with the gate loss, τ = ∞"),
    ("flexible_ft_auto", "+ fine-tuning with the gate loss, τ = log₁₀ S̄"),
    ("flexible_ft_tau075", "+ fine-tuning with the gate loss, τ = 0.75"),
    ("flexible_band_ft_inf", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = ∞"),
    ("flexible_band_ft_auto", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = log₁₀ S̄"),
    ("flexible_band_ft_tau075", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = 0.75"),
    ("flexible_gate32_inf", "flexible attention with a 32-unit gate network (d/4), τ = ∞"),
    ("flexible_gate32_auto", "flexible attention with a 32-unit gate network, τ = log₁₀ S̄"),
    ("flexible_gate32_band_ft_inf", "+ fine-tuning within the bands, decoded with τ = ∞"),
    ("flexible_gate32_band_ft_auto", "+ fine-tuning within the bands, decoded with τ = log₁₀ S̄"),
    ("flexible_gate32_band_ft_tau075", "+ fine-tuning within the bands, decoded with τ = 0.75"),
    ("soft_ft", "global attention, 1 more epoch as the fine-tuning's (its control)"),
]


def cps_table(work):
    rows = []
    for name, what in CPS_ROWS:
        bleu, cps = load(Path(work) / "results" / f"{name}.json"), cps_of(work, name)
        if bleu is None:
            continue
        rows.append(f"| {what} | {fmt(cps and cps[0], '.1f', 'all (global)')} | "
                    f"{fmt(cps and 100 * (1 - cps[0] / cps[1]), '.0f')}{'%' if cps else ''} | "
                    f"{bleu['bleu_tok_lc']:.2f} |")
    if not rows:
        return ""
    return ("\n### Flexible attention (the paper's Table 1)\n\n"
            "| model | CPS (scores per target step) | fewer than global | test2016 BLEU |\n"
            "|---|---|---|---|\n" + "\n".join(rows) + "\n")


def reference_table(reference):
    rows = []
    for name, _, what in runs():
        bleu = load(Path(reference) / "results" / f"{name}.json")
        if bleu:
            rows.append(f"| `{name}` | {what} | {bleu['bleu_tok_lc']:.2f} | {bleu['sacrebleu']:.2f} |")
    if not rows:
        return ""
    return (f"\n### Longer budget\n\nThe same recipe with a longer budget ({budget_note(reference)}):\n\n"
            "| run | what it changes | test2016 BLEU (tok, lc) | sacreBLEU (lc) |\n|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


FILES = {  # what each output of scripts/results.sh shows
    "speed_small": "decoding and training speed, small preset, the trained checkpoints",
    "speed_base": "decoding speed at Transformer Base dims (random weights)",
    "speed_small_flexible": "the flexible family at the small preset, Multi30k test, the trained checkpoints (the band-trained ones also at τ = 0.75)",
    "speed_small_long_sources": "small preset, the trained checkpoints, 100-token sources",
    "speed_base_long_sources": "Base dims, 100-token sources: where skipping source positions pays",
    "speed_base_200_token_sources": "Base dims, 200-token sources, 40 output tokens",
    "speed_base_200_token_sources_160_outputs": "Base dims, 200-token sources, 160 output tokens",
    "speed_base_400_token_sources": "Base dims, 400-token sources, 100 output tokens",
    "attention_step_costs": "one decoding step of cross-attention alone, per mechanism, Base dims (flexible_small_gate: a d/4 gate network)",
    "attention_step_costs_small": "the same at the small preset's dims (d = 128, 4 heads)",
    "speed_base_long_outputs": "Base dims, 60 output tokens: where a constant-cost decoder step pays",
    "op_costs_cpu": "per-operation costs of one decoding step (the hard-attention paper's Table 2)",
    "memory": "peak memory of training and decoding",
    "speed_vs_length": "decoding speed against source length",
    "bleu_vs_cps": "flexible attention: BLEU against score computations per step over τ",
    "bleu_vs_cps_gate32": "the same for flexible_gate32_band_ft (a d/4 gate network) at τ = 0.75 to 1.25",
    "attention_soft": "cross-attention heatmaps, soft baseline (25-epoch model)",
    "attention_hard": "chosen source positions of hard retrieval attention (25-epoch model)",
    "attention_flexible_ft": "cross-attention of flexible attention after fine-tuning",
    "flexible_gate": "flexible attention's gate g_t over the decoding steps of one sentence",
    "issue2_speed_small": "soft vs hard, the 25-epoch checkpoints, end to end (1000 test sentences)",
    "issue2_speed_small_fixed25": "soft vs hard, the 25-epoch checkpoints, 25 output tokens each",
}


def files_section(results):
    rows = [f"- [{path.name}]({path.name}): {what}" for stem, what in FILES.items()
            for path in sorted(results.glob(stem + ".*")) if path.suffix in (".md", ".png")]
    return "\n## Files\n\n" + "\n".join(rows) + "\n" if rows else ""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path, help="the work dir of scripts/results.sh")
    parser.add_argument("results", type=Path, help="where to write the tables (results/)")
    parser.add_argument("--reference", type=Path, help="another work dir whose scores to add")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="README whose results markers receive the table")
    args = parser.parse_args(argv)
    work, results = args.work, args.results
    if not args.readme.is_file():
        parser.error(f"--readme {args.readme}: no such file")
    small_benchmark, base_benchmark = load(results / "speed_small.json"), load(results / "speed_base.json")
    small, base = by_model(small_benchmark), by_model(base_benchmark)
    memory = {}
    for r in (load(results / "memory.json") or {}).get("results", []):
        memory.setdefault(r["arch"], {})[r["workload"]] = r["peak_mb"]
    table, records = [], []
    for name, arch, what in runs():
        bleu = load(work / "results" / f"{name}.json")
        if bleu is None and name not in small:
            continue
        speed = small.get(name, {})
        base_arch = base.get(name, {})
        arch_name = arch.split()[0]
        # profiled per preset: rows with extra flags or switches are other models
        mem = memory.get(arch_name, {}) if arch == arch_name else {}
        record = {
            "name": name, "arch": arch, "changes": what,
            "bleu_tok_lc": bleu and bleu.get("bleu_tok_lc"),
            "sacrebleu": bleu and bleu.get("sacrebleu"),
            "params": speed.get("params"),
            "sentences_per_s": speed.get("sentences_per_s_median"),
            "speed_vs_soft": speed.get("decode_speedup"),
            "pct_of_attention_free_limit": speed.get("pct_of_attention_free_limit"),
            "base_speed_vs_soft": base_arch.get("decode_speedup"),
            "train_speed_vs_soft": speed.get("train_speed_ratio"),
            "peak_mb_train": mem.get("train"), "peak_mb_decode": mem.get("decode"),
        }
        records.append(record)
        table.append(
            f"| `{name}` | {what} | {fmt(record['bleu_tok_lc'], '.2f')} | "
            f"{fmt(record['sacrebleu'], '.2f')} | "
            f"{fmt(record['params'] and record['params'] / 1e6, '.2f')} | "
            f"{fmt(record['sentences_per_s'], '.1f')} | {fmt(record['speed_vs_soft'], '.2f')}{'x' if record['speed_vs_soft'] else ''} | "
            f"{fmt(record['pct_of_attention_free_limit'], '.0f')}{'%' if record['pct_of_attention_free_limit'] else ''} | "
            f"{fmt(record['base_speed_vs_soft'], '.2f')}{'x' if record['base_speed_vs_soft'] else ''} | "
            f"{fmt(record['train_speed_vs_soft'], '.2f')}{'x' if record['train_speed_vs_soft'] else ''} | "
            f"{fmt(record['peak_mb_train'], '.0f')} / {fmt(record['peak_mb_decode'], '.0f')} |")
    header = (
        "| run | what it changes | test2016 BLEU (tok, lc) | sacreBLEU (lc) | params (M) | "
        "sent/s (small, CPU) | speed vs soft | % of attention-free limit | speed vs soft, Base dims | "
        "train speed vs soft | peak MB train / decode |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|")
    markdown = header + "\n" + "\n".join(table)
    signature = next((load(p).get("sacrebleu_signature") for p in sorted((work / "results").glob("*.json"))
                      if load(p) and load(p).get("sacrebleu_signature")), None)
    notes = ("\nMulti30k en-de test2016 (1000 sentences), small preset (4+4 layers, d=128, FFN 256, "
             f"4 heads), {budget_note(work)}. {speed_note(small_benchmark, base_benchmark)} "
             + (f"sacreBLEU signature: `{signature}`." if signature else "")
             + "\n" + cps_table(work) + (reference_table(args.reference) if args.reference else ""))
    (results / "README.md").write_text("# Results\n\n" + markdown + "\n" + notes + "\n"
                                       + files_section(results))
    (results / "results.json").write_text(json.dumps(records, indent=2))
    readme = args.readme
    text = readme.read_text()
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        readme.write_text(before + start + "\n" + markdown + "\n" + notes + "\n" + end + after)
    print(markdown)


if __name__ == "__main__":
    main()
