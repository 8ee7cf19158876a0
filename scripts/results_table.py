#!/usr/bin/env python
"""Assemble results/: one table of every architecture (what it changes, BLEU,
params, speed and ratio, % of the attention-free limit, peak memory) from the
evaluation and benchmark outputs, as Markdown and JSON; and the README's
headline table (the presets a user would pick: BLEU, CPU speed in fp32 and
int8, GPU speed, parameters) between its ``<!-- results:start -->`` and
``<!-- results:end -->`` markers.

The tables are built from RESULTS_DIR/scores.json, the committed score
records (NAME for test2016, NAME.valid for the validation set, and the
"budget" they were trained with): a work dir's checkpoints and logs stay on
the machine that trained them, its scores travel with the repository. Each call
first copies WORK_DIR's records into scores.json (a retrained run replaces its
record, which git shows), so a work dir of a few runs adds its rows to the
others; a work dir trained with another budget than the committed records' is
not merged (exit status 3: scripts/results.sh then prints its scores).

Usage: scripts/results_table.py WORK_DIR RESULTS_DIR [--reference OTHER_WORK_DIR]
[--short-budget RESULTS_JSON] (as scripts/results.sh calls it). --reference adds
the scores of another work dir (trained with another budget) as a second table;
--short-budget adds a column of test2016 BLEU from another table's records
(results.json of a shorter budget: for rows not yet trained with this one). ``WORK_DIR --print``
only prints the BLEU table of a work dir.
"""

import argparse
import importlib.util
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OTHER_BUDGET_STATUS = 3  # exit status: WORK has another budget than scores.json (results.sh prints it)
SCORES = "scores.json"  # RESULTS_DIR/scores.json: the committed score records


def _manifest():
    path = REPO / "examples" / "multi30k" / "experiments.py"
    spec = importlib.util.spec_from_file_location("experiments", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXPERIMENTS = _manifest()  # the runs, fine-tunings, decodes, benchmarks and table rows
# the benchmarks whose rows the table marks as measured later (‡)
LATER_SPEED_BENCHMARKS = (EXPERIMENTS.TABLE_SPEED_BENCHMARKS[1:]
                          + EXPERIMENTS.TABLE_BASE_SPEED_BENCHMARKS[1:])


def load(path):
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


class Scores:
    """Score records by name: NAME (test2016), NAME.valid (the validation
    set) and "budget" (how the runs were trained); those committed in one
    file (``committed``), or a work dir's (``of_work_dir``: evaluate.sh's
    results/NAME[.valid].json and its budget.json)."""

    def __init__(self, records, path=None):
        self.records, self.path = records, path

    @classmethod
    def committed(cls, path):
        return cls(load(path) or {}, Path(path))

    @classmethod
    def of_work_dir(cls, work):
        records = {path.name[:-len(".json")]: load(path) for path in sorted((work / "results").glob("*.json"))}
        records["budget"] = load(work / "budget.json")
        return cls(records)

    def record(self, name):
        record = self.records.get(name)
        return record if isinstance(record, (dict, list)) else None

    def save(self):
        self.path.write_text(json.dumps(self.records, indent=1, sort_keys=True) + "\n")


def arch_and_flags(arch, flags):
    return " ".join(filter(None, (arch, flags)))  # no stray space where there are no flags


def runs():
    """(name, arch and flags, what it changes) of every row of the main table."""
    described = {f.name: (arch_and_flags(f.arch, f.flags) + f" (from {f.start}"
                          + (f", teacher {f.teacher})" if f.teacher else ")"), f.what)
                 for f in EXPERIMENTS.FINETUNES}
    archs = {run.name: run.arch for run in EXPERIMENTS.TRAINED}
    for decode in EXPERIMENTS.DECODES:
        described[decode.name] = (f"{archs[decode.run]} {decode.overrides}", decode.what)
    rows = [(r.name, arch_and_flags(r.arch, r.flags), r.what) for r in EXPERIMENTS.RUNS]
    return rows + [(name, *described[name]) for name in EXPERIMENTS.TABLE_EXTRA_ROWS]


def counted_cps(gen_log):
    """(CPS, global attention's CPS) that a decoding log counted, or None."""
    if not gen_log.is_file():
        return None
    found = re.search(r"CPS ([\d.]+) \(global attention ([\d.]+)\)", gen_log.read_text())
    return (float(found.group(1)), float(found.group(2))) if found else None


def collect(work, scores):
    """Copy the score records of ``work`` (results/NAME[.valid].json of
    evaluate.sh, with the CPS of their decoding logs) into ``scores`` (and
    save it); False, copying nothing, when ``work`` was trained with another
    budget than the records there."""
    budget, committed = load(work / "budget.json"), scores.record("budget")
    if committed is not None and budget != committed:
        return False
    if committed is None and budget is not None:
        scores.records["budget"] = budget
    for path in sorted((work / "results").glob("*.json")):
        record = load(path)
        if not isinstance(record, dict) or "bleu_tok_lc" not in record:
            continue
        cps = counted_cps(path.with_suffix(".gen.log"))
        if cps:
            record.update(cps=cps[0], cps_global=cps[1])
        scores.records[path.name[:-len(".json")]] = record
    scores.save()
    return True


def by_model(benchmark):
    return {r["model"]: r for r in benchmark["results"]} if benchmark else {}


def speed_columns(results, names):
    """The benchmarks ``names`` feeding one speed column of the table: the first
    one, its rows by model, and the rows only a later one measured (marked ‡)."""
    benchmarks = [load(results / f"{name}.json") for name in names]
    later = {}
    for benchmark in reversed(benchmarks[1:]):
        later.update(by_model(benchmark))
    return benchmarks[0], by_model(benchmarks[0]), later


def speed_row(name, first, later):
    """``name``'s row of one speed column and whether it was measured later (‡):
    the first benchmark's row, else a later one's, else none."""
    if name in first:
        return first[name], False
    return later.get(name, {}), name in later


def fmt(value, spec, missing="—"):
    return missing if value is None else format(value, spec)


def budget_note(scores):
    """How the runs scored in ``scores`` were trained, from the budget.json results.sh writes."""
    budget = scores.record("budget")
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
    return note + (" (details: results/speed_*.md; the checkpoints each decoded: "
                   "results/speed_*.json).")


def gpu_note(gpu):
    """What the GPU column shows, from its benchmark's settings, or that it waits for a GPU."""
    if not gpu:
        return (f"GPU column: not measured yet "
                f"(`scripts/gpu_results.sh results` on one fills it from "
                f"results/{EXPERIMENTS.TABLE_GPU_BENCHMARK}.json).")
    s = gpu["settings"]
    return (f"GPU column: {s.get('device_name', 'GPU')}, Transformer Base dims, random weights, "
            f"{s.get('src_len', '?')}-token sources decoded to exactly {s.get('fixed_output_len', '?')} "
            f"tokens, batch {s.get('batch_size', '?')}, beam {s.get('beam', '?')}, {s.get('dtype', '?')}; "
            f"ratios to fairseq's own transformer on the same inputs "
            f"(results/{EXPERIMENTS.TABLE_GPU_BENCHMARK}.md).")


def cps_table(scores):
    rows, counted = [], False
    for name, what in EXPERIMENTS.CPS_ROWS:
        bleu = scores.record(name)
        if bleu is None:
            continue
        cps = (bleu["cps"], bleu["cps_global"]) if "cps" in bleu else None
        counted = counted or cps is not None
        rows.append(f"| {what} | {fmt(cps and cps[0], '.1f', 'all (global)')} | "
                    f"{fmt(cps and 100 * (1 - cps[0] / cps[1]), '.0f')}{'%' if cps else ''} | "
                    f"{bleu['bleu_tok_lc']:.2f} |")
    if not counted:
        return ""  # no flexible or local run scored yet: nothing to compare with global
    return ("\n### Flexible attention (the paper's Table 1)\n\n"
            "| model | CPS (scores per target step) | fewer than global | test2016 BLEU |\n"
            "|---|---|---|---|\n" + "\n".join(rows) + "\n")


def bleu_table(scores):
    """The BLEU of every row scored in ``scores`` (validation and test2016), or ''."""
    rows = []
    for name, _, what in runs():
        bleu = scores.record(name)
        if bleu:
            valid = scores.record(f"{name}.valid")
            rows.append(f"| `{name}` | {what} | {fmt(valid and valid['bleu_tok_lc'], '.2f')} | "
                        f"{bleu['bleu_tok_lc']:.2f} | {bleu['sacrebleu']:.2f} |")
    if not rows:
        return ""
    return ("| run | what it changes | valid BLEU | test2016 BLEU (tok, lc) | sacreBLEU (lc) |\n"
            "|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def gap_cells(hard, soft):
    """The cells 'hard / soft | gap' for validation, then test2016, of two
    (valid BLEU, test2016 BLEU) pairs."""
    return " | ".join(f"{h:.2f} / {s:.2f} | {h - s:+.2f}" for h, s in zip(hard, soft)) + " |"


def run_bleu(scores, name):
    """(valid, test2016) BLEU of the run or decode ``name``, or None unless
    it is scored on both sets."""
    records = [scores.record(f"{name}{suffix}") for suffix in (".valid", "")]
    return None if None in records else tuple(record["bleu_tok_lc"] for record in records)


def pair_bleu(scores, hard, soft):
    """(run_bleu of ``hard``, run_bleu of ``soft``), or None unless both are
    scored on both sets."""
    pair = run_bleu(scores, hard), run_bleu(scores, soft)
    return None if None in pair else pair


def parity_table(scores):
    """Hard retrieval against soft attention trained the same way:
    validation BLEU (where recipes are chosen) and test2016 (reported)."""
    runs = {r.name: r for r in EXPERIMENTS.TRAINED}
    rows = []
    for hard, soft in EXPERIMENTS.PARITY_PAIRS:
        bleu = pair_bleu(scores, hard, soft)
        if bleu:
            rows.append(f"| `{hard}` | {runs[hard].what} | `{soft}` | " + gap_cells(*bleu))
    if not rows:
        return ""
    return ("| run (hard or cross+self) | recipe | soft counterpart | valid BLEU hard / soft | gap | "
            "test2016 hard / soft | gap |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def targets_table(scores):
    """The parity targets (the manifest's PARITY_TARGETS): each one's gap in
    the mean of its scored seeds' pairs, on validation and test2016, each
    seed's in brackets, and whether the mean meets the target on each set."""
    rows = []
    for target in EXPERIMENTS.PARITY_TARGETS:
        gaps = [tuple(h - s for h, s in zip(*bleu))
                for bleu in (pair_bleu(scores, *pair) for pair in target.pairs) if bleu]
        if not gaps:
            continue
        means = [sum(gap) / len(gaps) for gap in zip(*gaps)]
        cells = [f"{mean:+.2f} ({', '.join(f'{gap:+.2f}' for gap in per_seed)})"
                 for mean, per_seed in zip(means, zip(*gaps))]
        met = " / ".join("yes" if target.met(round(mean, 2)) else "no" for mean in means)
        rows.append(f"| {target.claim} | {len(gaps)} of {len(target.pairs)} | {cells[0]} | {cells[1]} | {met} |")
    if not rows:
        return ""
    return ("## Where the targets stand\n\n"
            "Each target's gap (BLEU of the run minus its soft counterpart's, beam 4) in the mean of its "
            "seeds' pairs, each seed's in brackets; met: by that mean, on validation / test2016.\n\n"
            "| target | seeds scored | valid gap | test2016 gap | met |\n|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n\n")


def search_table(scores):
    """Beam search's settings for each (hard, soft) pair of the manifest's
    SEARCH_PAIRS: every setting's BLEU on both sets, then each model's setting
    chosen on validation (the first of the grid on a tie) and the test2016 gap
    those two choices give, with its mean over the pairs; '' before any pair is
    scored over the whole grid."""
    rows, chosen_gaps = [], []
    for hard, soft in EXPERIMENTS.SEARCH_PAIRS:
        grid = {}  # (beam, lenpen): {run: (valid, test)}, in the grid's order
        for beam, lenpen in EXPERIMENTS.SEARCH_GRID:
            grid[beam, lenpen] = {run: run_bleu(scores, EXPERIMENTS.searched_with(run, beam, lenpen).name)
                                  for run in (hard, soft)}
        if any(None in bleu.values() for bleu in grid.values()):
            continue
        best = {run: max(grid, key=lambda setting: grid[setting][run][0]) for run in (hard, soft)}
        for (beam, lenpen), bleu in grid.items():
            marks = [f"{kind} ✓" for kind, run in (("hard", hard), ("soft", soft))
                     if best[run] == (beam, lenpen)]
            rows.append(f"| `{hard}` / `{soft}` | {beam} | {lenpen:g} | "
                        + gap_cells(bleu[hard], bleu[soft]) + f" {', '.join(marks)} |")
        chosen = {run: grid[best[run]][run] for run in (hard, soft)}
        chosen_gaps.append(tuple(h - s for h, s in zip(chosen[hard], chosen[soft])))
        rows.append(f"| `{hard}` / `{soft}` | chosen | on valid | " + gap_cells(chosen[hard], chosen[soft]) + " |")
    if not rows:
        return ""
    mean_valid, mean_test = (sum(gap) / len(chosen_gaps) for gap in zip(*chosen_gaps))
    return ("\n## Beam search's settings, chosen on validation\n\n"
            "Each model decoded over beams and length penalties (the recipe's: beam 4, length penalty 1); "
            "✓: the setting with the model's best validation BLEU; \"chosen\": both models at their own "
            f"choice. Mean gap at the chosen settings over {len(chosen_gaps)} pair(s): "
            f"{mean_valid:+.2f} valid / {mean_test:+.2f} test2016.\n\n"
            "| hard / soft | beam | length penalty | valid BLEU hard / soft | gap | test2016 hard / soft | gap "
            "| best on valid |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def reference_table(reference):
    scores = Scores.of_work_dir(reference)
    table = bleu_table(scores)
    return (f"\n### Other budget\n\nThe same recipe with another budget ({budget_note(scores)}):"
            f"\n\n{table}") if table else ""


FILES_NOTE = (
    "Each is remade by `scripts/results.sh DATA_DIR WORK_DIR` (a file whose JSON is there is "
    "skipped: delete it to redo it); a benchmark alone by `scripts/benchmark_decoding.py $(python "
    "examples/multi30k/experiments.py benchmark NAME WORK_DIR)`, the `speed_gpu_*` set by "
    "`scripts/gpu_results.sh results` on a GPU. Beside each `.md` its `.json` holds every number "
    "and the settings. [hard_parity_record.md](hard_parity_record.md): the parity ablation's "
    "record, run by run (written, not generated). Superseded figures leave this folder; git keeps "
    "them.")


# pages whose figures are written beside the commands that remake them, not by
# scripts/results.sh: their line of the file list after the link
WRITTEN_BESIDE_COMMANDS = {
    "corpus": (' ([corpus_speed.json](corpus_speed.json), '
               '[corpus_speed_random_small.json](corpus_speed_random_small.json), '
               '[corpus_speed_random_base.json](corpus_speed_random_base.json), '
               '[real_data_peer_topk10.json](real_data_peer_topk10.json), '
               '[real_data_peer_beam4.json](real_data_peer_beam4.json), '
               '[real_data_peer_test_beam4.json](real_data_peer_test_beam4.json), '
               '[real_data_peer_test_topk10.json](real_data_peer_test_topk10.json), '
               '[cycles_by_library_test_topk10.json](cycles_by_library_test_topk10.json), '
               '[cycles_by_library_test_beam4.json](cycles_by_library_test_beam4.json), '
               '[cycles_by_library_test_topk10_sublayers.json](cycles_by_library_test_topk10_sublayers.json); '
               "the 20,000-line runs after each change: [corpus_speed_20k.json](corpus_speed_20k.json), each "
               "under the name its command wrote): the corpus command "
               'back-translating 100,000 lines against fairseq-interactive and CTranslate2, its memory'
               " and a kill's cost (written beside its commands)"),
    "below_float32": (' ([decoding_modes_bleu.json](decoding_modes_bleu.json); the shortlist\'s runs: '
                      "[shortlist.json](shortlist.json), each under the name its command wrote): a vocabulary "
                      "shortlist, bf16 and int8 against the exact engine, BLEU and speed, beside CTranslate2's "
                      "int8 and vocabulary map (written beside its commands)"),
    "decoding_engine": (": the engine against CTranslate2 on real sentences (one at a time, batches, one thread "
                        "and the cores, float32 and int8) and on random weights, each figure beside its "
                        "command"),
    "tried": ": what was measured on the way, or tried and not kept, a line each with the commit that holds it",
    "gpu_check": (" ([gpu_check/](gpu_check/)): the prepared GPU check's record, its GPU tests and speed "
                  "cells: the plugin's search on CUDA against fairseq's generator (written beside its "
                  "command)"),
}


def files_section(results):
    rows = [f"- [{path.name}]({path.name}): {what}" for stem, what in EXPERIMENTS.OUTPUTS.items()
            for path in sorted(results.glob(stem + ".*")) if path.suffix in (".md", ".png")]
    rows += [f"- [{stem}.md]({stem}.md){line}" for stem, line in WRITTEN_BESIDE_COMMANDS.items()
             if (results / f"{stem}.md").exists()]
    return "\n## Files\n\n" + FILES_NOTE + "\n\n" + "\n".join(rows) + "\n" if rows else ""


def ratio(row):
    return f"{row['decode_speedup']:.2f}x" if row and "decode_speedup" in row else "—"


def gpu_search_note(results):
    """The plugin's search on CUDA in the GPU column's cell (scripts/gpu_check.sh's record)."""
    # (scripts/gpu_check.sh names its cells speed_gpu_engine_*, the GPU matrix's speed_gpu_*)
    name = EXPERIMENTS.TABLE_GPU_BENCHMARK.replace("speed_gpu_", "speed_gpu_engine_", 1)
    cell = by_model((load(results / "gpu_check" / "speed.json") or {}).get(name))  # (its cells by name)
    if not cell.get("soft_search"):
        return "; the plugin's search on a GPU is unmeasured"
    return (f"; the plugin's search, CUDA's default since its GPU check passed, in the same cell: soft "
            f"{ratio(cell['soft_search'])}, hard {ratio(cell.get('hard_search'))} (results/gpu_check.md)")


# the headline row that the real-sentence figures belong to: fairseq's transformer through the engine
ENGINE_PRESET = "transformer_soft_small"


def real_sentences_cell(engine) -> str:
    """fp32 and int8 ratios to CTranslate2 on the trained model's test2016
    (batch 64), one thread / the cores (results/decoding_engine.json)."""
    lines = (engine.get("real_sentences_test_batch64") or {}).get("median")
    if not lines:
        return "—"

    def best(prefix, threads):
        found = [v for k, v in lines.items() if k.startswith(prefix) and ("1 thread" in k) == (threads == 1)]
        return max(found) if found else None

    cells = []
    for name, peer in (("fp32", "CT2 float32"), ("int8", "CT2 int8")):
        ratios = [lines.get(f"engine {name}{suffix}", 0) / (best(peer, threads) or float("inf"))
                  for suffix, threads in ((", 1 thread", 1), ("", 2))]
        cells.append(f"{name} {ratios[0]:.2f}x / {ratios[1]:.2f}x")
    return "; ".join(cells)


def one_sentence_row(engine) -> str:
    """The headline's row of one sentence at a time (the hub, one thread):
    the median latency, float32 and int8, beside CTranslate2's."""
    fp32, int8 = engine.get("one_sentence_trained_fp32"), engine.get("one_sentence_trained_int8")
    if not fp32 or not int8:
        return ""

    def ms(record):
        systems = record["systems"]
        ours = next(v for k, v in systems.items() if k.startswith("the engine"))["median_ms"]
        peer = next(v for k, v in systems.items() if k.startswith("CTranslate2"))["median_ms"]
        return ours, peer

    (a, b), (c, d) = ms(fp32), ms(int8)
    return (f"| one sentence at a time | the hub's `translate(line)`, one thread, the trained de→en "
            f"`transformer` (median ms) | — | {a:.2f} ms | {c:.2f} ms | — | fp32 {b / a:.2f}x ({b:.2f} ms); "
            f"int8 {d / c:.2f}x ({d:.2f} ms) | — |")


def headline_table(results, scores):
    """The README's table: the presets a user would pick (the manifest's
    HEADLINES), their test2016 BLEU, their CPU decoding speed in fp32 and
    int8 beside fairseq's transformer (HEADLINE_SPEED), the GPU column and
    their parameters; then how to read it."""
    benchmark = load(results / f"{EXPERIMENTS.HEADLINE_SPEED.name}.json")
    cpu = by_model(benchmark)
    gpu = by_model(load(results / f"{EXPERIMENTS.TABLE_GPU_BENCHMARK}.json"))
    engine = load(results / "decoding_engine.json") or {}
    lines = ["| preset (`--arch`) | what it changes | test2016 BLEU | CPU speed vs fairseq, fp32 | "
             "CPU, int8 | GPU speed vs fairseq | real sentences vs CTranslate2, 1 thread / 2 cores | "
             "params (M) |", "|---|---|---|---|---|---|---|---|"]
    for row in EXPERIMENTS.HEADLINES:
        bleu = scores.record(row.run) if row.run else None
        fp32 = cpu.get(row.preset)
        params = fp32 and fp32.get("params")
        # (the trained de->en model of results/decoding_engine.md is fairseq's transformer at these dims)
        real = real_sentences_cell(engine) if row.preset == ENGINE_PRESET else "—"
        lines.append(f"| `{row.preset}` | {row.what} | {fmt(bleu and bleu['bleu_tok_lc'], '.2f')} | "
                     f"{ratio(fp32)} | {ratio(cpu.get(row.preset + '_int8'))} | "
                     f"{ratio(gpu.get(row.gpu_model)) if row.gpu_model else '—'} | {real} | "
                     f"{fmt(params and params / 1e6, '.2f')} |")
    latency = one_sentence_row(engine)
    if latency:
        lines.append(latency)
    s = benchmark["settings"] if benchmark else {}
    note = (f"\nBLEU: Multi30k en-de test2016, tokenized and lowercased, each model trained with one "
            f"budget ({budget_note(scores)}; the curriculum preset at dropout 0.1, the others at 0.3). "
            "CPU: the plugin's decoding engine (its beam search, `--decoding-engine auto`) against "
            "fairseq's `transformer` with fairseq's generator, and CTranslate2 on the same weights, side "
            "by side in one process: "
            + (f"{s.get('sentences')} random sources of {s.get('src_len')} tokens decoded to exactly "
               f"{s.get('fixed_output_len')} tokens, beam {s.get('beam')}, batch {s.get('batch_size')}, "
               f"{s.get('threads')} thread, the small preset's dims, random weights, median of "
               f"{s.get('reps')}, {s.get('device_name', 'CPU')} "
               f"(results/{EXPERIMENTS.HEADLINE_SPEED.name}.md)" if s else "not measured yet")
            + "; int8: `--int8-decoding`. GPU: NVIDIA H200, Transformer Base dims, batch 128, 100 tokens, "
            "fp16, the earlier engine (fairseq's generator around the captured step)"
            + gpu_search_note(results) + ". Real sentences: a trained de→en fairseq `transformer` at "
            "the small preset's dims decoding test2016 (beam 4, each sentence to its own end) through "
            "fairseq-generate (batch 64) or the hub, against CTranslate2's best configuration for the cores "
            "on the same weights, each in its own process (results/decoding_engine.md). Every row, the "
            "peers' included, is in "
            "[results/README.md](results/README.md).\n")
    return "\n".join(lines) + "\n" + note


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path, help="the work dir of scripts/results.sh")
    parser.add_argument("results", type=Path, nargs="?", help="where to write the tables (results/)")
    parser.add_argument("--print", action="store_true",
                        help="only print the BLEU of every scored run of WORK (no files written)")
    parser.add_argument("--reference", type=Path, help="another work dir whose scores to add")
    parser.add_argument("--short-budget", type=Path, metavar="RESULTS_JSON",
                        help="records of a shorter budget's table: their BLEU as a column")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md",
                        help="README whose results markers receive the table")
    args = parser.parse_args(argv)
    work, results = args.work, args.results
    if args.print:
        print(bleu_table(Scores.of_work_dir(work)) or f"no scored runs in {work}")
        return
    if results is None:
        parser.error("give RESULTS_DIR (or --print)")
    if args.short_budget and not args.short_budget.is_file():
        parser.error(f"--short-budget {args.short_budget}: no such file")
    if not args.readme.is_file():
        parser.error(f"--readme {args.readme}: no such file")
    scores = Scores.committed(results / SCORES)
    if not collect(work, scores):
        # its own status, so that results.sh tells this refusal from a failure
        parser.exit(OTHER_BUDGET_STATUS,
                    f"{parser.prog}: error: {work} was trained with another budget than the records "
                    f"in {scores.path} (its budget): not merging its scores into the tables (--print "
                    "shows them; --reference adds them as a second table)\n")
    small_benchmark, small, small_later = speed_columns(results, EXPERIMENTS.TABLE_SPEED_BENCHMARKS)
    base_benchmark, base, base_later = speed_columns(results, EXPERIMENTS.TABLE_BASE_SPEED_BENCHMARKS)
    gpu_benchmark = load(results / f"{EXPERIMENTS.TABLE_GPU_BENCHMARK}.json")
    gpu = by_model(gpu_benchmark)
    memory = {}
    for r in (load(results / "memory.json") or {}).get("results", []):
        memory.setdefault(r["arch"], {})[r["workload"]] = r["peak_mb"]
    short = {r["name"]: r.get("bleu_tok_lc") for r in load(args.short_budget) or []} \
        if args.short_budget else None
    table, records, any_measured_later = [], [], False
    for name, arch, what in runs():
        bleu = scores.record(name)
        if bleu is None and name not in small and not (short and short.get(name)):
            continue
        speed, measured_later = speed_row(name, small, small_later)
        base_arch, base_measured_later = speed_row(name, base, base_later)
        any_measured_later = any_measured_later or measured_later or base_measured_later
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
            "gpu_speed_vs_fairseq": gpu.get(name, {}).get("decode_speedup"),
            "train_speed_vs_soft": speed.get("train_speed_ratio"),
            "peak_mb_train": mem.get("train"), "peak_mb_decode": mem.get("decode"),
        }
        records.append(record)
        table.append(
            f"| `{name}` | {what} | {fmt(record['bleu_tok_lc'], '.2f')} | "
            f"{fmt(record['sacrebleu'], '.2f')} | "
            + (f"{fmt(short.get(name), '.2f')} | " if short is not None else "") +
            f"{fmt(record['params'] and record['params'] / 1e6, '.2f')} | "
            f"{fmt(record['sentences_per_s'], '.1f')}{'‡' * measured_later} | {fmt(record['speed_vs_soft'], '.2f')}{'x' if record['speed_vs_soft'] else ''} | "
            f"{fmt(record['pct_of_attention_free_limit'], '.0f')}{'%' if record['pct_of_attention_free_limit'] else ''} | "
            f"{fmt(record['base_speed_vs_soft'], '.2f')}{'x' if record['base_speed_vs_soft'] else ''}{'‡' * base_measured_later} | "
            f"{fmt(record['gpu_speed_vs_fairseq'], '.2f')}{'x' if record['gpu_speed_vs_fairseq'] else ''} | "
            f"{fmt(record['train_speed_vs_soft'], '.2f')}{'x' if record['train_speed_vs_soft'] else ''} | "
            f"{fmt(record['peak_mb_train'], '.0f')} / {fmt(record['peak_mb_decode'], '.0f')} |")
    short_column = " test2016 BLEU, short budget |" if short is not None else ""
    header = (
        "| run | what it changes | test2016 BLEU (tok, lc) | sacreBLEU (lc) |" + short_column
        + " params (M) | sent/s (small, CPU) | speed vs soft | % of attention-free limit | "
        "speed vs soft, Base dims | speed vs fairseq, GPU | train speed vs soft | peak MB train / decode |\n"
        "|---|---|---|---|" + "---|" * bool(short_column) + "---|---|---|---|---|---|---|---|")
    markdown = header + "\n" + "\n".join(table)
    signature = next((r["sacrebleu_signature"] for r in scores.records.values()
                      if isinstance(r, dict) and r.get("sacrebleu_signature")), None)
    notes = ("\nMulti30k en-de test2016 (1000 sentences), small preset (4+4 layers, d=128, FFN 256, "
             f"4 heads), {budget_note(scores)}. {speed_note(small_benchmark, base_benchmark)} "
             f"{gpu_note(gpu_benchmark)} "
             + (f"‡: measured later with the same settings ({', '.join(LATER_SPEED_BENCHMARKS)}"
                "; its ratios are to the soft baseline of that run). " if any_measured_later else "")
             + (f"sacreBLEU signature: `{signature}`." if signature else "")
             + (f" \"Short budget\": test2016 BLEU of the same recipe with a shorter budget "
                f"({args.short_budget.name}), for the rows not yet trained with this one."
                if short is not None else "")
             + "\n" + cps_table(scores) + (reference_table(args.reference) if args.reference else ""))
    parity = parity_table(scores)
    if parity:
        (results / "hard_parity.md").write_text(
            "# Hard retrieval attention toward parity with soft attention\n\n"
            f"Multi30k en-de, small preset, {budget_note(scores)}; tokenized lowercased BLEU.\n\n"
            + targets_table(scores) + parity + search_table(scores))
    (results / "README.md").write_text("# Results\n\n" + markdown + "\n" + notes + "\n"
                                       + files_section(results))
    (results / "results.json").write_text(json.dumps(records, indent=2))
    readme = args.readme
    text = readme.read_text()
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        readme.write_text(before + start + "\n" + headline_table(results, scores) + end + after)
    print(markdown)


if __name__ == "__main__":
    main()
