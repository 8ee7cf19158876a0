"""Smoke tests of the tools in scripts/: each runs on tiny inputs, reports
progress, and writes outputs whose contents make sense."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TEST_SENTENCES, USER_DIR, ForkServer, module_at, run_cli, tiny_dim_flags, tool_env, train

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# the commands a user runs; the measurements behind a paragraph of the docs; the sweep's summary
SCRIPT_DIRS = (SCRIPTS, REPO / "research", REPO / "examples" / "sweep")
PYTHON_SCRIPTS = sorted(p.name for folder in SCRIPT_DIRS for p in folder.glob("*.py"))
SHELL_SCRIPTS = sorted(p.name for p in SCRIPTS.glob("*.sh"))
TINY_SMALL_ARCHS = ["soft=transformer_soft_small", "hard=transformer_hard_dec_small"]


def script(name, *args, check=True, timeout=600):
    """Run a script as a user does: a Python one in a child of the tests' fork
    server (torch and fairseq imported once), a shell one in bash."""
    path = next(folder / name for folder in SCRIPT_DIRS if (folder / name).exists())
    args = [str(a) for a in args]
    if name.endswith(".py"):
        proc = ForkServer.run(path, args, None, None, timeout, env={"MPLBACKEND": "Agg"})
    else:
        proc = subprocess.run(["bash", str(path), *args], env=tool_env(MPLBACKEND="Agg"),
                              capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def load_manifest():
    """examples/multi30k/experiments.py as a module."""
    return module_at("examples/multi30k/experiments.py")


def is_png(path):
    return Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", [n for n in PYTHON_SCRIPTS if n != "demo.py"] + ["demo.py"])
def test_every_python_script_has_help(name):
    proc = script(name, "--help")
    assert proc.stdout.startswith("usage:") and "--" in proc.stdout


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_every_shell_script_explains_its_usage_when_called_without_arguments(name):
    proc = script(name, check=False)
    assert proc.returncode != 0
    assert "usage" in proc.stderr.lower() and "Traceback" not in proc.stderr


def test_demo_end_to_end_on_given_data(reorder_data, tmp_path):
    """make demo's job on the tiny task: both models trained, scored and timed
    with fairseq's generator and the plugin's engine, and the table printed."""
    # (6 epochs: models that have learnt to end their sentences decode in seconds, where
    # a model of 1 epoch runs every hypothesis to the length limit)
    proc = script("demo.py", "--data", reorder_data.parent / "raw", "--work-dir", tmp_path / "demo",
                  "--epochs", 6, "--threads", 1, "--reps", 1)
    steps = re.findall(r"step (\d)/4", proc.stdout)
    assert sorted(set(steps)) == ["1", "2", "3", "4"]
    for arch in ("transformer_soft_prenorm_h8_small", "transformer_hard_dec_anneal_small"):
        row = next(line.split() for line in proc.stdout.splitlines() if line.startswith(arch))
        bleu, fairseq_rate, engine_rate, speedup = map(float, (*row[1:4], row[4].rstrip("x")))
        assert 0 <= bleu <= 100 and fairseq_rate > 0 and engine_rate > 0
        # the ratio of the unrounded rates: within what rounding them to 0.1 allows
        low, high = (engine_rate - 0.05) / (fairseq_rate + 0.05), (engine_rate + 0.05) / (fairseq_rate - 0.05)
        assert low - 0.005 <= speedup <= high + 0.005
    assert "What it means: hard retrieval" in proc.stdout


def test_benchmark_random_weights_side_by_side(tmp_path):
    out = tmp_path / "bench.json"
    proc = script("benchmark_decoding.py", *sum((["--arch", a] for a in TINY_SMALL_ARCHS), []),
                  "--vocab", 60, "--src-len", 7, "--num-sentences", 6, "--batch-size", 3,
                  "--fixed-output-len", 4, "--reps", 2, "--threads", 1, "--train-batches", 1,
                  "--sublayer-times", "--json", out, "--markdown", tmp_path / "bench.md")
    result = json.loads(out.read_text())
    soft, hard = (next(r for r in result["results"] if r["model"] == m) for m in ("soft", "hard"))
    assert result["baseline"] == "soft" and soft["decode_speedup"] == 1.0
    for r in (soft, hard):
        assert r["sentences_per_s_min"] <= r["sentences_per_s_median"] <= r["sentences_per_s_max"]
        assert r["generated_tokens"] == 6 * (4 + 1)  # the fixed length and EOS, every sentence
        assert r["train_target_tokens_per_s_median"] > 0
        assert r["pct_of_attention_free_limit"] > 0
        assert set(r["attention_share"]) >= {"decoder self-attention", "decoder cross-attention"}
        # the projections are part of the decoder's attention sublayers: the core-free
        # limit (sublayers less projections) lies between the speed and the attention-free one
        projections = r["attention_share"]["projections in decoder attention"]
        assert 0 < projections < (r["attention_share"]["decoder self-attention"]
                                  + r["attention_share"]["decoder cross-attention"])
        assert r["pct_of_attention_free_limit"] < r["pct_of_core_free_limit"]
    # the limits are the baseline's own speed less a share of it; another model, timed
    # apart, may come within noise of them or pass them (hard retrieval drops the core)
    assert soft["pct_of_core_free_limit"] < 100
    assert 0 < result["core_free_limit_sentences_per_s"] < result["attention_free_limit_sentences_per_s"]
    assert "AMX" in result["settings"]["device_name"]  # the CPU, and what int8 packs for
    assert soft["params"] == hard["params"]  # hard retrieval adds no parameters
    assert "| hard |" in (tmp_path / "bench.md").read_text()
    assert "[benchmark]" in proc.stderr  # progress


def test_benchmark_corpus_lowercases_the_lines_it_draws(tmp_path):
    """--lowercase: the same draw of lines, lowercased (the input of a model
    trained on lowercased text)."""
    bench = module_at("scripts/benchmark_corpus.py")
    text = tmp_path / "text.de"
    text.write_text("Ein Mann läuft.\n\nZwei Hunde im Schnee.\nÜber der Stadt.\n", encoding="utf-8")
    cased, lowered = tmp_path / "cased", tmp_path / "lowered"
    bench.make_corpus(str(text), 7, cased)
    bench.make_corpus(str(text), 7, lowered, lowercase=True)
    drawn = cased.read_text(encoding="utf-8").splitlines()
    assert len(drawn) == 7 and set(drawn) == {"Ein Mann läuft.", "Zwei Hunde im Schnee.", "Über der Stadt."}
    assert lowered.read_text(encoding="utf-8").splitlines() == [line.lower() for line in drawn]
    assert bench.parse_args(["--text", "t", "--data", "d", "--path", "p", "--bpe-codes", "c",
                             "--bpe-vocabulary", "v", "--source-lang", "de", "--target-lang", "en",
                             "--lowercase"]).lowercase


def test_benchmark_corpus_reads_the_growth_from_the_largest_samples(tmp_path):
    """The growth after 10,000 lines: the largest sample since over the largest
    of the buffer that reached 10,000, not over its first sample, which may
    fall where the workers hold least."""
    bench = module_at("scripts/benchmark_corpus.py")
    samples = [(0.0, 400.0, 5000), (2.0, 450.0, 10000), (4.0, 600.0, 10000), (6.0, 612.0, 15000),
               (8.0, 580.0, 20000)]
    assert bench.growth_after(samples) == pytest.approx(612 / 600 - 1)
    assert bench.growth_after(samples[:2]) is None


def test_benchmark_caps_output_length_as_fairseq_generate(tmp_path):
    """--max-len-a/--max-len-b bound every output as fairseq-generate's do
    (random weights rarely end early); with --fixed-output-len they are an error."""
    common = ("--arch", "soft=transformer_soft_small", "--vocab", 60, "--src-len", 7,
              "--num-sentences", 6, "--batch-size", 3, "--reps", 1, "--threads", 1)
    out = tmp_path / "bench.json"
    script("benchmark_decoding.py", *common, "--max-len-a", 0.5, "--max-len-b", 1, "--json", out)
    capped = json.loads(out.read_text())["results"][0]["generated_tokens"]
    assert 6 <= capped <= 6 * (int(0.5 * 7 + 1) + 1)  # the limit and EOS
    script("benchmark_decoding.py", *common, "--json", out)
    assert json.loads(out.read_text())["results"][0]["generated_tokens"] > capped
    proc = script("benchmark_decoding.py", *common, "--fixed-output-len", 4, "--max-len-b", 3, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "benchmark: error: --fixed-output-len sets the output length: drop --max-len-a/--max-len-b")


def test_attention_step_costs_side_by_side(tmp_path):
    out = tmp_path / "steps.json"
    tiny = ("--embed-dim", 32, "--heads", 4, "--batch", 3, "--beam", 2, "--steps", 4,
            "--reps", 1, "--threshold", 0.5)
    script("attention_step_costs.py", "--src-len", 12, 30, *tiny,
           "--json", out, "--markdown", tmp_path / "steps.md")
    rows = json.loads(out.read_text())["results"]
    assert [(r["src_len"], r["mechanism"]) for r in rows] == [
        (n, m) for n in (12, 30)
        for m in ("soft", "hard", "local", "flexible", "flexible_torch_ops", "flexible_small_gate")]
    for r in rows:
        assert r["step_us"] > 0 and r["first_step_us"] > 0
        if r["mechanism"] == "soft":
            assert r["ratio"] == 1.0
        if r["mechanism"] != "soft" and r["mechanism"] != "hard":  # the bands skip part of the source
            assert 0 < r["cps"] < r["global_cps"] == r["src_len"]
    flexible, torch_ops, small_gate = rows[-3:]
    assert flexible["cps"] == torch_ops["cps"]  # the C kernel and the PyTorch ops: same bands
    assert small_gate["cps"] != flexible["cps"]  # another gate network: other bands
    markdown = (tmp_path / "steps.md").read_text()
    assert "| 30 | flexible (σ 3, tau 0.50, gate 32) |" in markdown
    assert "| 30 | flexible_torch_ops (σ 3, tau 0.50, gate 32) |" in markdown
    assert "| 30 | flexible_small_gate (σ 3, tau 0.50, gate 8) |" in markdown
    # the same modules (same seed) with a smaller σ: narrower bands
    script("attention_step_costs.py", "--src-len", 30, *tiny, "--sigma", 1,
           "--mechanisms", "soft", "flexible", "--json", tmp_path / "narrow.json")
    narrow = json.loads((tmp_path / "narrow.json").read_text())["results"][-1]
    assert narrow["mechanism"] == "flexible" and 0 < narrow["cps"] < flexible["cps"]


def test_benchmark_trained_checkpoints_on_the_test_set(trained_checkpoints, reorder_data, tmp_path):
    out = tmp_path / "bench.json"
    script("benchmark_decoding.py", "--data", reorder_data,
           "--model", f"soft={trained_checkpoints['soft']}",
           "--model", f"hard={trained_checkpoints['hard']}",
           "--beam", 2, "--batch-size", 8, "--reps", 1, "--json", out)
    result = json.loads(out.read_text())
    assert [r["model"] for r in result["results"]] == ["soft", "hard"]
    assert all(r["sentences_per_s_median"] > 0 for r in result["results"])
    assert result["settings"]["sentences"] == TEST_SENTENCES


def test_speed_vs_length_plot(tmp_path):
    script("plot_speed_vs_length.py", *sum((["--arch", a] for a in TINY_SMALL_ARCHS), []),
           "--lengths", 4, 8, "--num-sentences", 2, "--batch-size", 2, "--reps", 1,
           "--output-len", 3, "--vocab", 60, "--out", tmp_path / "speed.png",
           "--json", tmp_path / "speed.json")
    assert is_png(tmp_path / "speed.png")
    rates = json.loads((tmp_path / "speed.json").read_text())["sentences_per_s"]
    assert set(rates) == {"soft", "hard"} and all(len(v) == 2 and min(v) > 0 for v in rates.values())


def test_op_costs_table(tmp_path):
    proc = script("op_costs.py", "--keys", 5, 9, "--batch", 2, "--heads", 2, "--head-dim", 4,
                  "--min-run-time", 0.01, "--json", tmp_path / "ops.json")
    rows = json.loads((tmp_path / "ops.json").read_text())["results"]
    assert [r["keys"] for r in rows] == [5, 9]
    for r in rows:
        assert all(r[op] > 0 for op in ("compare", "normalize", "argmax", "attend", "index"))
        assert r["total_soft"] > 0 and r["total_hard"] > 0
    assert "hard/soft" in proc.stdout


def test_linear_engines_table(tmp_path):
    proc = script("linear_engines.py", "--shapes", "8x16x32", "4x32x16", "--repeats", 1,
                  "--min-run-time", 0.01, "--json", tmp_path / "linear.json")
    result = json.loads((tmp_path / "linear.json").read_text())
    assert [(r["rows"], r["in"], r["out"]) for r in result["results"]] == [(8, 16, 32), (4, 32, 16)]
    for r in result["results"]:
        timed = {k: v for k, v in r.items() if k not in ("rows", "in", "out")}
        # float32 on MKL and on oneDNN, the plugin's int8 and at least one of PyTorch's int8 engines
        assert {"float32", "float32 onednn", "int8 plugin"} < set(timed) and len(timed) >= 4
        assert min(timed.values()) > 0
    assert result["settings"]["int8_engines"]
    assert "int8 plugin vs float32" in proc.stdout and "float32 onednn vs float32" in proc.stdout
    bad = script("linear_engines.py", "--shapes", "8x16", check=False)
    assert bad.returncode == 2 and "ROWSxINxOUT" in bad.stderr


def test_memory_profile(tmp_path):
    script("memory_profile.py", "--arch", "transformer_soft_small", "--arch", "transformer_aan_small",
           "--batch-tokens", 200, "--train-steps", 1, "--num-sentences", 4, "--length", 5,
           "--vocab", 60, "--json", tmp_path / "mem.json", "--markdown", tmp_path / "mem.md")
    rows = json.loads((tmp_path / "mem.json").read_text())["results"]
    assert {(r["arch"], r["workload"]) for r in rows} == {
        (a, w) for a in ("transformer_soft_small", "transformer_aan_small") for w in ("train", "decode")}
    assert all(r["peak_mb"] > 0 for r in rows)


def test_long_run_memory(trained_checkpoints, reorder_data):
    proc = script("long_run_memory.py", "--data", reorder_data, "--path", trained_checkpoints["soft"],
                  "--sentences", 1200, "--source-lang", "src", "--target-lang", "tgt")
    lines = proc.stdout.splitlines()
    # the memory after the first 1,000 sentences and 100 before the end, from both entry points
    for name in ("fairseq-interactive", "hub"):
        line = next(line for line in lines if line.startswith(f"{name}: 1200 sentences"))
        sizes = [float(mb) for mb in re.findall(r"(?:1000|1100): (\d+)", line)]
        assert len(sizes) == 2 and min(sizes) > 50, line
        assert "growth after the first 1,000" in line
    live = next(line for line in lines if line.startswith("hub: without the allocator's free pages"))
    assert re.search(r"1000: \d+, 1100: \d+; growth after the first 1,000: [+-]\d", live), live


def test_batch_split_equality(trained_checkpoints, reorder_data):
    proc = script("batch_split_equality.py", "--data", reorder_data, "--path", trained_checkpoints["hard"],
                  "--parts", 2, 3, "--source-lang", "src", "--target-lang", "tgt")
    found = re.findall(r"^fp32, each batch in (\d) parts: of (\d+) sentences, (\d+) with other n-best tokens, "
                       r"(\d+) with other scores", proc.stdout, flags=re.M)
    assert [(parts, sentences) for parts, sentences, *_ in found] == [("2", str(TEST_SENTENCES)),
                                                                      ("3", str(TEST_SENTENCES))]
    assert all(int(tokens) <= int(scores) <= TEST_SENTENCES for *_, tokens, scores in found)


def test_score_equality(trained_checkpoints, reorder_data):
    proc = script("score_equality.py", "--data", reorder_data, "--path", trained_checkpoints["hard"],
                  "--source-lang", "src", "--target-lang", "tgt", "--nbest", 2)
    found = re.findall(r"^engine, (1 thread vs fairseq's generator|2 threads vs 1 thread): of (\d+) sentences, "
                       r"(\d+) with other n-best tokens, (\d+) with scores that differ in any bit; largest "
                       r"difference: score (\S+), positional score (\S+)$", proc.stdout, flags=re.M)
    assert [(name, int(sentences)) for name, sentences, *_ in found] == [
        ("1 thread vs fairseq's generator", TEST_SENTENCES), ("2 threads vs 1 thread", TEST_SENTENCES)]
    for _, _, tokens, bits, score, positional in found:  # the contract, on this tiny model too
        assert int(tokens) == 0 and int(bits) <= TEST_SENTENCES
        assert float(score) <= 1e-4 and float(positional) <= 1e-4


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_attention_plot(trained_checkpoints, reorder_data, tmp_path, kind):
    script("plot_attention.py", "--data", reorder_data, "--checkpoint", trained_checkpoints[kind],
           "--index", 1, "--out", tmp_path / "attn.png")
    assert is_png(tmp_path / "attn.png")


@pytest.fixture(scope="module")
def flexible_checkpoint(reorder_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("flexible")
    train(reorder_data, root, "transformer_flexible_small", updates=2)
    return root / "checkpoint_last.pt"


def test_gate_plot_and_bleu_vs_cps_curve(flexible_checkpoint, reorder_data, tmp_path):
    script("plot_attention.py", "--data", reorder_data, "--checkpoint", flexible_checkpoint,
           "--out", tmp_path / "attn.png", "--gate-out", tmp_path / "gate.png")
    assert is_png(tmp_path / "attn.png") and is_png(tmp_path / "gate.png")
    proc = script("bleu_vs_cps.py", "--data", reorder_data, "--checkpoint", flexible_checkpoint,
                  "--checkpoint", f"narrow={flexible_checkpoint}",
                  "--tok-ref", reorder_data.parent / "raw" / "test.tgt",
                  "--thresholds", "0.5", "auto", "inf", "--threads", 1, "--batch-size", 8,
                  "--out", tmp_path / "curve.png", "--json", tmp_path / "curve.json")
    assert is_png(tmp_path / "curve.png")
    curves = json.loads((tmp_path / "curve.json").read_text())["curves"]
    assert [c["label"] for c in curves] == ["flexible", "narrow"]
    points = {p["threshold"]: p for p in curves[0]["points"]}
    assert set(points) == {"0.5", "auto", "inf"}
    # no skipping at tau = inf; a smaller threshold never scores more positions
    assert points["inf"]["cps"] == pytest.approx(points["inf"]["global_cps"])
    assert points["0.5"]["cps"] <= points["auto"]["cps"] <= points["inf"]["cps"]
    assert all(0 <= p["bleu"] <= 100 for p in points.values())
    assert curves[1]["points"] == curves[0]["points"]  # the same checkpoint decodes alike
    assert "[bleu_vs_cps] flexible, tau inf" in proc.stderr
    assert "[bleu_vs_cps] narrow, tau inf" in proc.stderr


def test_bleu_vs_cps_refuses_a_checkpoint_without_flexible_attention(trained_checkpoints,
                                                                     reorder_data, tmp_path):
    proc = script("bleu_vs_cps.py", "--data", reorder_data, "--checkpoint", trained_checkpoints["hard"],
                  "--tok-ref", reorder_data.parent / "raw" / "test.tgt", "--thresholds", "1",
                  "--out", tmp_path / "curve.png", check=False)
    assert proc.returncode != 0 and "has no flexible attention" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "curve.png").exists()


def test_bleu_vs_cps_names_a_missing_checkpoint(reorder_data, tmp_path):
    missing = tmp_path / "nowhere.pt"
    proc = script("bleu_vs_cps.py", "--data", reorder_data, "--checkpoint", f"mine={missing}",
                  "--tok-ref", reorder_data.parent / "raw" / "test.tgt", "--thresholds", "1",
                  "--out", tmp_path / "curve.png", check=False)
    assert proc.returncode != 0 and f"--checkpoint {missing}: no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_results_table_fills_the_readme_markers(tmp_path):
    work, results = tmp_path / "work", tmp_path / "results"
    (work / "results").mkdir(parents=True)
    results.mkdir()
    (work / "budget.json").write_text(json.dumps(
        {"epochs": 3, "warmup_updates": 100, "max_tokens": 512, "average_last": 2, "seed": 7, "beam": 4}))
    for name, bleu in (("soft", 30.5), ("hard", 29.25), ("flexible_auto", 30.0)):
        (work / "results" / f"{name}.json").write_text(json.dumps(
            {"sentences": 10, "bleu_tok_lc": bleu, "sacrebleu": bleu - 0.1,
             "sacrebleu_signature": "nrefs:1|case:lc"}))
    (work / "results" / "flexible_auto.gen.log").write_text("CPS 4.50 (global attention 15.00)\n")
    settings = {"sentences": 10, "fixed_output_len": 20, "beam": 4, "batch_size": 5, "threads": 1,
                "reps": 3, "train_batches": 2, "train_max_tokens": 512}
    (results / "speed_small.json").write_text(json.dumps({"settings": settings, "results": [
        {"model": "soft", "params": 2_000_000, "sentences_per_s_median": 50.0, "decode_speedup": 1.0,
         "pct_of_attention_free_limit": 70.0},
        {"model": "hard", "params": 2_000_000, "sentences_per_s_median": 60.0, "decode_speedup": 1.2,
         "pct_of_attention_free_limit": 84.0}]}))
    # a row speed_small did not measure comes from a later benchmark, marked; others do not
    (work / "results" / "soft_pre.json").write_text(json.dumps(
        {"sentences": 10, "bleu_tok_lc": 30.75, "sacrebleu": 30.7}))
    (results / "speed_small_parity.json").write_text(json.dumps({"settings": settings, "results": [
        {"model": "soft", "params": 2_000_000, "sentences_per_s_median": 40.0, "decode_speedup": 1.0},
        {"model": "soft_pre", "params": 2_100_000, "sentences_per_s_median": 41.0,
         "decode_speedup": 1.025}]}))
    # the Base-dims column likewise: from speed_base, else from a later benchmark, marked
    base_settings = dict(settings, sentences=128)
    (results / "speed_base.json").write_text(json.dumps({"settings": base_settings, "results": [
        {"model": "soft", "decode_speedup": 1.0}, {"model": "hard", "decode_speedup": 1.09}]}))
    (results / "speed_base_parity.json").write_text(json.dumps({"settings": base_settings, "results": [
        {"model": "soft", "decode_speedup": 1.0}, {"model": "hard", "decode_speedup": 1.5},
        {"model": "soft_pre", "decode_speedup": 1.05}]}))
    # the README's headline table: CPU speeds of the presets in fp32 and int8
    (results / "speed_headline.json").write_text(json.dumps({"settings": dict(settings, src_len=30), "results": [
        {"model": "transformer", "params": 5_000_000, "decode_speedup": 1.0},
        {"model": "transformer_soft_small", "params": 5_000_000, "decode_speedup": 1.85},
        {"model": "transformer_soft_small_int8", "params": 5_000_000, "decode_speedup": 2.25}]}))
    # the engine against CTranslate2 on real sentences: the soft row's column, and one sentence's row
    (results / "decoding_engine.json").write_text(json.dumps({
        "real_sentences_test_batch64": {"median": {
            "engine fp32": 300.0, "engine fp32, 1 thread": 150.0, "engine int8": 400.0, "engine int8, 1 thread": 200.0,
            "CT2 float32 inter 2 x intra 1": 250.0, "CT2 float32 intra 2": 200.0, "CT2 float32 1 thread": 100.0,
            "CT2 int8 inter 2 x intra 1": 200.0, "CT2 int8 1 thread": 160.0}},
        "one_sentence_trained_fp32": {"systems": {"the engine (hub translate)": {"median_ms": 8.0},
                                                  "CTranslate2 float32": {"median_ms": 6.0}}},
        "one_sentence_trained_int8": {"systems": {"the engine (hub translate)": {"median_ms": 3.0},
                                                  "CTranslate2 int8": {"median_ms": 3.6}}}}))
    # a page written beside its commands (not by results.sh) keeps its line in the file list
    (results / "corpus.md").write_text("# the corpus command\n")
    readme = tmp_path / "README.md"
    readme.write_text("# title\n<!-- results:start -->\nold\n<!-- results:end -->\nrest\n")
    script("results_table.py", work, results, "--readme", readme)
    assert "- [corpus.md](corpus.md) ([corpus_speed.json](corpus_speed.json)" in (results / "README.md").read_text()
    assert "[below_float32.md]" not in (results / "README.md").read_text()  # (no such page here)
    text = readme.read_text()
    assert "old" not in text and text.startswith("# title\n") and text.endswith("rest\n")
    assert "| `transformer_soft_small` | soft attention, the plugin's decoding engine | 30.50 | 1.85x | " \
           "2.25x | — | fp32 1.50x / 1.20x; int8 1.25x / 2.00x | 5.00 |" in text
    assert "| one sentence at a time | " in text and \
        "| — | 8.00 ms | 3.00 ms | — | fp32 0.75x (6.00 ms); int8 1.20x (3.60 ms) | — |" in text
    assert "| `transformer` | " in text and "10 random sources of 30 tokens decoded to exactly 20" in text
    text = (results / "README.md").read_text()  # every row: the results' own table
    assert "| `hard` |" in text and "29.25" in text and "1.20x" in text and "84%" in text
    assert "| 2.00 | 50.0 | 1.00x |" in text  # soft from speed_small
    assert "| 2.10 | 41.0‡ | 1.02x | — | 1.05x‡ |" in text and "‡: measured later" in text
    assert "| 1.20x | 84% | 1.09x | — |" in text  # hard: speed_base's, not the later one's
    assert "3 epochs of 512-token batches" in text
    assert "first 10 test sentences, exactly 20 output tokens each with beam 4, batch 5" in text
    assert "| 4.5 | 70% | 30.00 |" in text  # CPS, fewer score computations than global, BLEU
    assert "GPU column: not measured yet" in text  # no GPU benchmark in results/
    records = json.loads((results / "results.json").read_text())
    assert {r["name"] for r in records} == {"soft", "hard", "soft_pre"}
    # the scores are kept beside the tables, the CPS of a decoding log with its record
    kept = json.loads((results / "scores.json").read_text())
    assert (kept["flexible_auto"]["bleu_tok_lc"], kept["flexible_auto"]["cps"],
            kept["flexible_auto"]["cps_global"]) == (30.0, 4.5, 15.0)
    assert kept["budget"]["epochs"] == 3
    # so the tables outlive the work dir: a work dir of a few runs adds its rows
    # to the others, and a retrained run replaces its record
    shutil.rmtree(work)
    partial = tmp_path / "partial"
    (partial / "results").mkdir(parents=True)
    (partial / "budget.json").write_text(json.dumps(json.loads((results / "scores.json").read_text())["budget"]))
    for name, bleu in (("hard", 31.0), ("aan", 28.0)):
        (partial / "results" / f"{name}.json").write_text(json.dumps(
            {"sentences": 10, "bleu_tok_lc": bleu, "sacrebleu": bleu}))
    # the GPU column: one benchmark of the GPU matrix, ratios to fairseq's transformer
    gpu_settings = {"device_name": "NVIDIA H100", "src_len": 100, "fixed_output_len": 100,
                    "batch_size": 128, "beam": 4, "dtype": "fp16"}
    (results / "speed_gpu_100tok_batch128_fp16.json").write_text(json.dumps(
        {"settings": gpu_settings, "results": [{"model": "fairseq", "decode_speedup": 1.0},
                                               {"model": "hard", "decode_speedup": 1.625}]}))
    script("results_table.py", partial, results, "--readme", readme)
    text = (results / "README.md").read_text()
    assert "| 1.62x | " in text and "GPU column: NVIDIA H100, Transformer Base dims" in text
    assert "batch 128, beam 4, fp16" in text and "not measured yet" not in text
    assert "31.00" in text and "29.25" not in text and "| `aan` |" in text and "28.00" in text
    assert "30.50" in text and "| 4.5 | 70% | 30.00 |" in text  # soft and the CPS row stay
    assert {r["name"] for r in json.loads((results / "results.json").read_text())} == \
        {"soft", "hard", "soft_pre", "aan"}
    # a work dir of another budget (a longer one's pair) is not merged: results.sh prints it
    longer = tmp_path / "longer"
    (longer / "results").mkdir(parents=True)
    (longer / "budget.json").write_text(json.dumps(
        {"epochs": 60, "warmup_updates": 100, "max_tokens": 512, "average_last": 2, "seed": 7, "beam": 4}))
    (longer / "results" / "soft.json").write_text(json.dumps({"sentences": 10, "bleu_tok_lc": 35.0,
                                                              "sacrebleu": 35.0}))
    proc = script("results_table.py", longer, results, "--readme", readme, check=False)
    assert proc.returncode == 3 and "another budget" in proc.stderr  # results.sh's status
    assert "Traceback" not in proc.stderr
    assert (results / "README.md").read_text() == text
    assert json.loads((results / "scores.json").read_text())["soft"]["bleu_tok_lc"] == 30.5


def test_results_table_judges_each_parity_target_on_the_mean_of_its_seeds(tmp_path):
    """hard_parity.md opens with the parity targets: each one's mean gap over
    the seeds scored so far (each seed's in brackets), met or not on each set;
    a within-0.3 target needs a mean gap of at least -0.3, a drop at most its bound."""
    work, results = tmp_path / "work", tmp_path / "results"
    (work / "results").mkdir(parents=True)
    results.mkdir()
    experiments = load_manifest()
    within = next(t for t in experiments.PARITY_TARGETS if not t.drop)
    drop = next(t for t in experiments.PARITY_TARGETS if t.drop)
    # (pair, (valid gap, test2016 gap)) with the soft model at 38.5 on both sets
    scored = ((within.pairs[0], (-0.25, 0.5)), (within.pairs[1], (-0.5, -1.0)),
              (drop.pairs[0], (-1.5, -0.5)), (drop.pairs[1], (-0.5, -1.0)))
    for (run, soft), gaps in scored:
        for suffix, gap in zip((".valid", ""), gaps):
            for name, bleu in ((run, 38.5 + gap), (soft, 38.5)):
                (work / "results" / f"{name}{suffix}.json").write_text(json.dumps(
                    {"sentences": 10, "bleu_tok_lc": bleu, "sacrebleu": bleu}))
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    script("results_table.py", work, results, "--readme", readme)
    parity = (results / "hard_parity.md").read_text()
    assert parity.index("## Where the targets stand") < parity.index("| run (hard or cross+self) |")
    assert f"| {within.claim} | 2 of {len(within.pairs)} | -0.38 (-0.25, -0.50) | -0.25 (+0.50, -1.00) | no / yes |" in parity
    assert f"| {drop.claim} | 2 of {len(drop.pairs)} | -1.00 (-1.50, -0.50) | -0.75 (-0.50, -1.00) | yes / no |" \
        in parity
    assert len(re.findall(r"\| \d+ of \d+ \|", parity)) == 2  # targets without a scored pair: no row


def test_results_table_short_budget_column_and_parity_table(tmp_path):
    """--short-budget: a shorter budget's BLEU as a column, also for rows not
    yet trained with this budget; the parity table pairs hard with soft runs
    on validation and test2016."""
    work, results = tmp_path / "work", tmp_path / "results"
    (work / "results").mkdir(parents=True)
    results.mkdir()
    for name, valid, test in (("soft_pre", 40.0, 39.5), ("hard_pre", 39.0, 39.25)):
        for suffix, bleu in ((".valid", valid), ("", test)):
            (work / "results" / f"{name}{suffix}.json").write_text(json.dumps(
                {"sentences": 10, "bleu_tok_lc": bleu, "sacrebleu": bleu}))
    (work / "results" / "soft.json").write_text(json.dumps(
        {"sentences": 10, "bleu_tok_lc": 38.5, "sacrebleu": 38.4}))
    short = tmp_path / "short.json"
    short.write_text(json.dumps([{"name": "soft", "bleu_tok_lc": 25.6}, {"name": "aan", "bleu_tok_lc": 22.41}]))
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:start -->\n<!-- results:end -->\n")
    script("results_table.py", work, results, "--readme", readme, "--short-budget", short)
    text = (results / "README.md").read_text()  # the full table
    assert "short budget |" in text
    assert "| `soft` | soft baseline" in text and "| 38.50 | 38.40 | 25.60 |" in text
    assert "| `aan` |" in text and "| — | — | 22.41 |" in text  # not trained with this budget yet
    parity = (results / "hard_parity.md").read_text()
    assert "| 39.00 / 40.00 | -1.00 | 39.25 / 39.50 | -0.25 |" in parity
    assert "Beam search's settings" not in parity  # no pair decoded over the grid yet
    # a pair decoded over the search grid: each model's setting chosen on
    # validation, the test2016 gap at those choices, whatever test2016 prefers
    experiments = load_manifest()
    hard, soft = experiments.SEARCH_PAIRS[0]
    (hard_beam, hard_lenpen), (soft_beam, soft_lenpen) = experiments.SEARCH_GRID[-1], experiments.SEARCH_GRID[1]
    for run, best in ((hard, (hard_beam, hard_lenpen)), (soft, (soft_beam, soft_lenpen))):
        for beam, lenpen in experiments.SEARCH_GRID:
            chosen = (beam, lenpen) == best
            name = experiments.searched_with(run, beam, lenpen).name
            for suffix, bleu in ((".valid", 35.0 + chosen + (run == soft)), ("", 36.0 + 2 * (not chosen))):
                (work / "results" / f"{name}{suffix}.json").write_text(json.dumps(
                    {"sentences": 10, "bleu_tok_lc": bleu, "sacrebleu": bleu}))
    script("results_table.py", work, results, "--readme", readme)
    parity = (results / "hard_parity.md").read_text()
    assert "Beam search's settings, chosen on validation" in parity
    assert f"| `{hard}` / `{soft}` | chosen | on valid | 36.00 / 37.00 | -1.00 | 36.00 / 36.00 | +0.00 | |" \
        in parity
    assert "over 1 pair(s): -1.00 valid / +0.00 test2016" in parity
    assert f"| {hard_beam} | {hard_lenpen:g} | 36.00 / 36.00 | +0.00 | 36.00 / 38.00 | -2.00 | hard ✓ |" in parity
    assert parity.count("✓ |") == 2  # one setting per model
    missing = tmp_path / "nowhere.json"
    proc = script("results_table.py", work, results, "--readme", readme, "--short-budget", missing,
                  check=False)
    assert proc.returncode != 0 and "--short-budget" in proc.stderr and "Traceback" not in proc.stderr


def test_hydra_sweep_and_its_summary(reorder_data, tmp_path):
    """examples/sweep: two learning rates by fairseq-hydra-train's multirun."""
    sweep_dir = tmp_path / "sweep"
    dims = [f"+model.{flag[2:].split('=')[0].replace('-', '_')}={flag.split('=')[1]}"
            for flag in tiny_dim_flags("transformer_hard_dec_small")]
    run_cli("fairseq-hydra-train", "-m", "--config-dir", SCRIPTS.parent / "examples" / "sweep",
            "--config-name", "sweep", f"task.data={reorder_data}", f"common.user_dir={USER_DIR}",
            "model.share_all_embeddings=false",
            "optimization.lr=[0.002],[0.004]", "optimization.max_update=2",
            "lr_scheduler.warmup_updates=1", "dataset.max_tokens=300",
            f"hydra.sweep.dir={sweep_dir}", *dims,
            cwd=tmp_path)
    proc = script("sweep_summary.py", sweep_dir, "--json", tmp_path / "summary.json")
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(r["overrides"] for r in rows) == ["optimization.lr=[0.002]", "optimization.lr=[0.004]"]
    assert all(r["best_valid_loss"] and r["best_valid_loss"] > 0 for r in rows)
    assert "optimization.lr=[0.004]" in proc.stdout


def test_the_experiment_manifest_answers_the_scripts(tmp_path):
    """results.sh and run.sh read runs, fine-tunings, decodes and benchmarks
    from examples/multi30k/experiments.py: every name is unique, every decode
    and fine-tuning starts from a declared run, every benchmark model is one."""
    manifest = str(REPO / "examples" / "multi30k" / "experiments.py")

    def query(*args):
        proc = subprocess.run([sys.executable, manifest, *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return [line.split("\t") for line in proc.stdout.splitlines()]

    run_lines = query("runs")
    runs = {name for name, *_ in run_lines}
    finetunes = query("finetunes")
    decodes = query("decodes")
    names = list(runs) + [f[0] for f in finetunes] + [d[0] for d in decodes]
    assert len(names) == len(set(names))
    assert all(start in runs for _, start, *_ in finetunes)
    assert all(teacher == "-" or teacher in runs for *_, teacher, _, _ in finetunes)
    assert all(float(lr) > 0 for *_, lr, _, _, _ in finetunes)
    assert any(teacher != "-" for *_, teacher, _, _ in finetunes)
    # a distilled corpus is a trained run's translations: never its own run's
    corpora = [(line[0], line[2]) for line in run_lines] + [(f[0], f[-2]) for f in finetunes]
    assert all(corpus == "-" or (corpus in runs and corpus != name) for name, corpus in corpora)
    assert any(corpus != "-" for _, corpus in corpora)
    trained = runs | {f[0] for f in finetunes}
    assert all(run in trained for _, run, _, _ in decodes)
    assert all(isinstance(eval(overrides), dict) for _, _, overrides, _ in decodes)
    experiments = load_manifest()
    # runs of retired options keep their records (not trained from this commit)
    retired = {name for name, commit in query("retired")}
    assert retired and not retired & trained
    assert {name for pair in experiments.PARITY_PAIRS for name in pair} <= trained | retired
    assert {name for pair in experiments.SEARCH_PAIRS for name in pair} <= trained
    assert all(search == "-" or search.startswith("--") for *_, search in decodes)
    (tmp_path / "runs" / "soft").mkdir(parents=True)
    (tmp_path / "runs" / "soft" / "checkpoint_avg.pt").write_bytes(b"")
    for (benchmark,) in query("benchmarks"):
        args = [a for (a,) in query("benchmark", benchmark, tmp_path)]
        models = [a.split("=")[0] for a, prev in zip(args, [""] + args) if prev == "--model"]
        of_soft = {"soft"} | {name for name, run, *_ in decodes if run == "soft"}
        assert set(models) <= of_soft, benchmark  # only what is trained
        # random weights name their models; trained checkpoints: the first run through
        # fairseq's generator is the baseline
        assert "--baseline" in args or "--arch" in args or models[0].endswith("_fairseq_generator")


def results_sh_with_stand_ins(tmp_path, only, failing_run="-", failing_translation="-", parallel=3):
    """scripts/results.sh in a copy of the repo whose training, scoring and
    sequence-level distillation are stand-ins that record what they were asked
    in a journal (the real ones are exercised elsewhere); ``failing_run``: the
    run whose training fails, ``failing_translation``: the run whose translation
    of the training set fails. Returns the process and the journal's lines."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("results.sh", "results_table.py"):
        (repo / "scripts" / name).write_text((SCRIPTS / name).read_text())
    m30k = repo / "examples" / "multi30k"
    m30k.mkdir(parents=True)
    for name in ("common.sh", "experiments.py"):
        (m30k / name).write_text((REPO / "examples" / "multi30k" / name).read_text())
    shutil.copytree(REPO / "examples" / "multi30k" / "studies", m30k / "studies")
    (repo / "README.md").write_text("<!-- results:start -->\n<!-- results:end -->\n")
    # tables of another budget than this work dir's are kept, its scores printed
    (repo / "results").mkdir(parents=True)
    (repo / "results" / "results.json").write_text(json.dumps([{"name": "aan", "bleu_tok_lc": 22.5}]))
    (repo / "results" / "scores.json").write_text(json.dumps({"budget": {"epochs": 60}}))
    (m30k / "prepare.sh").write_text("true\n")
    journal = tmp_path / "journal"
    (m30k / "train.sh").write_text(
        f'echo "start $2 data=$DATA_BIN $*" >> {journal}; sleep 0.3\n'
        f'[ "$2" = {failing_run} ] && exit 1\n'
        'mkdir -p "$1/runs/$2" && touch "$1/runs/$2/checkpoint_avg.pt"\n'
        f'echo "end $2" >> {journal}\n')
    (m30k / "evaluate.sh").write_text(f'echo "score ${{SUBSET:-test}} $3 $4 $THREADS ${{*:5}}" >> {journal}\n')
    tools = tmp_path / "stand_in" / "hardattn_tools"
    tools.mkdir(parents=True)
    (tools / "__init__.py").write_text("")
    (tools / "distillation.py").write_text(
        "import os, sys, time\n"
        "data_bin, teacher, out = sys.argv[1:4]\n"
        "run = os.path.basename(os.path.dirname(teacher))\n"
        f"journal = open({str(journal)!r}, 'a')\n"
        "journal.write(f'distill {run} {data_bin} {out} {\" \".join(sys.argv[4:])}\\n'); journal.flush()\n"
        "time.sleep(0.3)\n"
        f"if run == {failing_translation!r}: sys.exit(2)\n"
        "os.makedirs(os.path.join(out, 'data-bin'))\n"
        "open(os.path.join(out, 'data-bin', '.done'), 'w').close()\n"
        "journal.write(f'distilled {run}\\n')\n")
    env = tool_env(ONLY=only, PARALLEL=str(parallel), SKIP_BENCH="1", PYTHONPATH=str(tools.parent))
    # a bare `python` fails: the recipe runs "$PYTHON" (python3), which GPU images have
    # where `python` may be another interpreter or missing
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "python").write_text("#!/bin/sh\necho 'results.sh called a bare python' >&2; exit 97\n")
    (bare / "python").chmod(0o755)
    env["PATH"] = f"{bare}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # (not from the repo's root, whose fairseq_hardattn python -m would import before the stand-in)
    proc = subprocess.run(["bash", str(repo / "scripts" / "results.sh"), tmp_path / "data",
                           tmp_path / "work"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, journal.read_text().splitlines()


def test_results_sh_starts_each_fine_tuning_once_its_start_run_is_trained(tmp_path):
    """scripts/results.sh schedules runs and fine-tunings PARALLEL at a time: a
    fine-tuning starts only after its start run (and teacher) has finished, one
    whose start run failed is skipped with a line saying so, and every trained
    run is scored on test and valid. Training and scoring are stand-ins that
    record what they were asked (the real ones are exercised elsewhere)."""
    only = ("soft flexible flexible_ft soft_ft soft_pre hard_pre_from_soft hard_pre_argmax_from_soft_kd "
            "soft_pre_drop01")
    # soft_pre fails: its fine-tunings must be skipped
    proc, events = results_sh_with_stand_ins(tmp_path, only, failing_run="soft_pre")
    started = [e.split()[1] for e in events if e.startswith("start ")]
    assert sorted(started) == sorted(["soft", "flexible", "soft_pre", "flexible_ft", "soft_ft", "soft_pre_drop01"])
    for finetune, start in (("flexible_ft", "flexible"), ("soft_ft", "soft")):
        begin = next(i for i, e in enumerate(events) if e.startswith(f"start {finetune} "))
        assert events.index(f"end {start}") < begin
        assert f"--finetune-from-model {tmp_path / 'work'}/runs/{start}/checkpoint_avg.pt" in events[begin]
        assert " --lr 0.001 " in f"{events[begin]} "  # the manifest's peak lr
    for skipped in ("hard_pre_from_soft", "hard_pre_argmax_from_soft_kd"):
        assert f"{skipped}: skipped (its start run, teacher or distilled corpus is not ready)" in proc.stderr
    assert "soft_pre: training failed" in proc.stderr
    scored = {tuple(e.split()[1:4]) for e in events if e.startswith("score ")}
    assert {e.split()[4] for e in events if e.startswith("score ")} == {"1"}  # one thread each
    for name in ("soft", "flexible", "flexible_ft", "soft_ft"):
        assert {("test", name, name), ("valid", name, name)} <= scored
    # decodes on both sets (settings are chosen on valid), with their search flags
    assert {("test", "soft", "fairseq"), ("valid", "soft", "fairseq"), ("test", "flexible", "flexible_auto"),
            ("valid", "flexible", "flexible_auto")} <= scored
    assert "score valid soft_pre_drop01 soft_pre_drop01_beam8_lenpen1p5 1 --model-overrides {} " \
        "--beam 8 --lenpen 1.5" in events
    assert not any(run == "soft_pre" for _, run, _ in scored)
    assert "tables not written" in proc.stderr and "another budget" in proc.stderr
    repo = tmp_path / "repo"
    assert (repo / "README.md").read_text() == "<!-- results:start -->\n<!-- results:end -->\n"
    assert json.loads((repo / "results" / "results.json").read_text())[0]["name"] == "aan"


@pytest.mark.parametrize("translation_fails", [False, True])
def test_results_sh_distils_a_corpus_once_and_trains_on_it_after(tmp_path, translation_fails):
    """Runs and fine-tunings on a distilled corpus (the manifest's ``corpus``)
    start only once its run is trained and has translated the training set,
    which it does once for all of them; they train on that corpus, scored on
    the real data like every run. A failed translation skips them."""
    only = "soft_pre soft hard_pre_argmax_seqkd soft_pre_seqkd hard_pre_argmax_from_soft_seqkd"
    proc, events = results_sh_with_stand_ins(
        tmp_path, only, failing_translation="soft_pre" if translation_fails else "-", parallel=2)
    work = tmp_path / "work"
    students = ("hard_pre_argmax_seqkd", "soft_pre_seqkd", "hard_pre_argmax_from_soft_seqkd")
    assert [e for e in events if e.startswith("distill ")] == [
        f"distill soft_pre {work}/data-bin {work}/distilled/soft_pre --beam 4 -- --cpu"]
    assert events.index("end soft_pre") < events.index(next(e for e in events if e.startswith("distill ")))
    assert f"start soft data={work}/data-bin " in "\n".join(events)
    if not translation_fails:
        translated = events.index("distilled soft_pre")
        for student in students:
            begin = next(i for i, e in enumerate(events) if e.startswith(f"start {student} "))
            assert translated < begin
            assert f" data={work}/distilled/soft_pre/data-bin " in events[begin]
        scored = {tuple(e.split()[1:4]) for e in events if e.startswith("score ")}
        assert all(("valid", name, name) in scored for name in students)
    else:
        assert "soft_pre: distillation failed" in proc.stderr
        assert not any(e.startswith(f"start {student} ") for e in events for student in students)
        for student in students:
            assert f"{student}: skipped (its start run, teacher or distilled corpus is not ready)" \
                in proc.stderr


def test_the_topk_preset_k_is_the_manifests():
    """The preset's k (the plugin) and the run the README's headline row reports
    (the manifest) name the same k."""
    from fairseq_hardattn.models.topk_retrieval_transformer import PRESET_K

    topk = load_manifest().topk
    assert topk.PRESET_K == PRESET_K
    assert topk.PRESET_RUN == topk.topk_run(PRESET_K).name


def test_corpus_resume_stops_the_corpus_command_and_counts_nothing_lost(trained_checkpoints, reorder_data, tmp_path):
    source = tmp_path / "in.txt"
    lines = (reorder_data.parent / "raw" / "test.src").read_text().splitlines()
    source.write_text("\n".join(lines[i % len(lines)] for i in range(300)) + "\n")
    proc = script("corpus_resume.py", "--kills", 2, "--max-delay", 4, "--work-dir", tmp_path / "work", "--",
                  reorder_data, "--path", trained_checkpoints["soft"], "--source-lang", "src", "--target-lang",
                  "tgt", "--max-len-b", 20, "--buffer-size", 20, "--input", source)
    assert "lines that differ, missing or extra: 0; byte for byte the same: True" in proc.stdout
    assert re.search(r"^wall time: uninterrupted [\d.]+ s, stopped \d+ times", proc.stdout, re.M)


def test_corpus_memory_gives_the_commands_own_process_and_its_workers_apart(trained_checkpoints, reorder_data,
                                                                            tmp_path):
    source = tmp_path / "in.txt"
    lines = (reorder_data.parent / "raw" / "test.src").read_text().splitlines()
    source.write_text("\n".join(lines[i % len(lines)] for i in range(400)) + "\n")
    proc = script("corpus_memory.py", "--after", 80, "--seconds", 0.1, "--", reorder_data, "--path",
                  trained_checkpoints["soft"], "--source-lang", "src", "--target-lang", "tgt", "--max-len-b", 20,
                  "--buffer-size", 40, "--input", source)
    rows = re.findall(r"^(\d+): (\d+) / \d+; (\d+) \+ (-?\d+)$", proc.stdout, re.M)
    assert rows and all(int(whole) > 0 and int(own) > 0 for _, whole, own, _ in rows), proc.stdout
    # the whole is the parts' sum (each rounded)
    assert all(abs(int(whole) - int(own) - int(workers)) <= 1 for _, whole, own, workers in rows)
    for part in ("the largest", "its command's own process", "its workers"):
        assert re.search(rf"^growth of {part} after the first 80 lines: [+-]\d+\.\d%$", proc.stdout, re.M), part


def test_decoding_modes_bleu_against_the_exact_engine(trained_checkpoints, reorder_data, tmp_path):
    table = tmp_path / "vmap.txt"
    subprocess.run([sys.executable, "-m", "fairseq_hardattn", "shortlist", str(reorder_data), "-o", str(table),
                    "--k", "4", "--frequent", "3"], env=tool_env(), check=True, capture_output=True)
    out = tmp_path / "modes.md"
    script("decoding_modes_bleu.py", "--data", reorder_data, "--path", f"hard={trained_checkpoints['hard']}",
           "--shortlist", table, "--ks", 3, "--no-bf16", "--bootstrap", 50, "--tok-ref",
           f"test={reorder_data.parent / 'raw' / 'test.tgt'}", "--markdown", out)
    text = out.read_text()
    assert re.search(r"^\| hard \| exact \| [\d.]+ \| \+0\.00 \|  \| 0 \| \d+ \|$", text, re.M), text
    for mode in ("int8", "shortlist k=3", "int8 + shortlist k=3"):
        row = re.search(rf"^\| hard \| {re.escape(mode)} \| [\d.]+ \| [+-][\d.]+ \| "
                        r"\[([+-][\d.]+), ([+-][\d.]+)\] \| (\d+) \| (\d+) \|$", text, re.M)
        assert row and float(row[1]) <= float(row[2]), (mode, text)
        assert int(row[3]) <= TEST_SENTENCES and int(row[4]) <= TEST_SENTENCES, (mode, text)
    assert re.search(r"^- hard, shortlist: (k = 3 chosen on test|no k within 0.2)", text, re.M)


def test_paired_bootstrap_brackets_the_difference_the_sentences_make(tmp_path):
    """tools.scoring.paired_bootstrap: the same decodes differ by exactly 0;
    a decode that gets every sentence right is better in every resampling,
    and the interval turns over with the systems' order."""
    from hardattn_tools.scoring import paired_bootstrap, tokenized_bleu

    refs = [f"a man number {i} rides a red bike down the street" for i in range(40)]
    (tmp_path / "ref.tok").write_text("\n".join(refs) + "\n")
    worse = [r if i % 2 else r.replace("red bike", "bike") for i, r in enumerate(refs)]
    assert paired_bootstrap(worse, worse, tmp_path / "ref.tok", samples=200) == (0.0, 0.0)
    low, high = paired_bootstrap(worse, refs, tmp_path / "ref.tok", samples=200)
    gain = tokenized_bleu(refs, tmp_path / "ref.tok") - tokenized_bleu(worse, tmp_path / "ref.tok")
    assert 0 < low <= gain <= high
    assert paired_bootstrap(refs, worse, tmp_path / "ref.tok", samples=200) == pytest.approx((-high, -low))


def test_real_data_peer_times_each_step_to_the_next_of_its_batch():
    """research/real_data_peer.py's timing by rows: a step is timed up to the
    next step of its batch (a batch's first step, marked None, and its last
    are not); steps of at least half the batch's rows set the cost of a row,
    and every timed row at that cost is the bound it prints."""
    module = module_at("research/real_data_peer.py")
    rows = [4, 16, 16, 2, 2, 4, 16, 8]
    began_at = [None, 0.0, 2.0, 4.0, 4.5, None, 10.0, 11.0]
    line = module.steps_by_rows(rows, began_at, 16)
    # timed: 16 rows 2 s, 16 rows 2 s, 2 rows 0.5 s, 16 rows 1 s; a row of a full step 5 s / 48
    assert "timed steps 5.50 s" in line and "fewer than 16 rows 0.50 s (1 steps, 2 rows)" in line
    assert "steps of at least 8 rows 5.00 s, 104166.7 us a row" in line
    assert line.endswith(f"every row at that cost: {5 / 48 * 50:.2f} s")
    assert module.steps_by_rows([4, 2, 2], [None, 0.0, 1.0], 16).endswith("none of at least 8 rows to set a row's cost")


def test_cycles_by_library_sums_perfs_samples_by_kind_of_code():
    """research/cycles_by_library.py's reading of ``perf report -n --sort dso,sym``:
    each sample row counted once, in the first category that holds (a GEMM
    symbol inside libtorch_cpu is a matrix product, not a PyTorch operator)."""
    report = "\n".join([
        "# Samples: 18K of event 'cpu-clock:ppp'",
        "    18.36%    1836  libtorch_cpu.so                [.] mkl_blas_def_sgemm_kernel_0_zen",
        "    16.10%    1610  [JIT] tid 3418                 [.] 0x00007f37af5eb23c",
        "    7.66%     766  _native-ad85aba9.cpython-311-x86_64-linux-gnu.so [.] attend_rows",
        "    3.33%     333  libc.so.6                      [.] __memmove_avx512_unaligned_erms",
        "    2.72%     272  libpython3.11.so.1.0           [.] _PyEval_EvalFrameDefault",
        "    2.05%     205  libtorch_cpu.so                [.] at::native::AVX2::direct_copy_kernel",
        "    1.00%     100  libctranslate2-a7a6.so.4.8.5   [.] ctranslate2::ops::TopK::compute",
        "    0.99%      99  libctranslate2-a7a6.so.4.8.5   [.] dnnl::impl::cpu::extended_sgemm",
        "    0.50%      50  [kernel.kallsyms]              [k] exc_page_fault",
        "    0.25%      25  _ctypes.cpython-311.so         [.] _ctypes_callproc",
        "",
    ])
    shares, samples = module_at("research/cycles_by_library.py").categorize(report)
    assert samples == 5296
    expected = {"matrix products: generated code (oneDNN's JIT)": 1610,
                "matrix products: library code (MKL, oneDNN)": 1836 + 99,
                "the plugin's native kernels": 766, "C library (copies, allocation, maths)": 333,
                "Python's interpreter": 272, "PyTorch's operators and dispatch": 205,
                "CTranslate2's operators": 100, "the operating system": 50, "other": 25}
    assert shares.keys() == expected.keys()
    assert all(abs(shares[name] - count / 5296) < 1e-12 for name, count in expected.items()), shares


@pytest.mark.skipif(shutil.which("perf") is None, reason="needs Linux perf")
def test_cycles_by_library_records_only_while_the_engine_decodes(trained_checkpoints, reorder_data, tmp_path):
    probe = subprocess.run(["perf", "record", "-o", str(tmp_path / "probe.perf"), "--", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"perf cannot record here: {probe.stderr.strip()[-200:]}")
    out = tmp_path / "cycles.json"
    proc = script("cycles_by_library.py", "--data", reorder_data, "--path", trained_checkpoints["soft"],
                  "--batch-size", 8, "--beam", 2, "--max-len", 20, "--rounds", 6, "--systems", "engine",
                  "--json", out)
    figures = json.loads(out.read_text())["engine"]
    # (rounds enough that a decode of a few milliseconds leaves samples in each kind of code)
    assert len(figures["seconds"]) == 6 and all(s > 0 for s in figures["seconds"])
    assert abs(sum(figures["shares"].values()) - 1) < 1e-9, figures["shares"]
    # recorded while it decodes only (999 samples a second), not while it loads the model
    assert 0 < figures["samples"] <= 999 * sum(figures["seconds"]) * 1.2 + 20, figures
    assert figures["shares"].get("Python's interpreter", 0) > 0
    assert re.search(r"^whole decode\s+[\d.]+$", proc.stdout, re.M), proc.stdout


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_a_scripts_scratch_folder_is_gone_when_its_process_ends(tmp_path, ending):
    """tools/scratch.py: the folder a benchmark converts and writes in is
    removed when its process ends, by an exception too; a --work-dir given
    (``keep``) stays."""
    kept = tmp_path / "kept"
    code = ("import sys\nfrom hardattn_tools.scratch import scratch_folder\n"
            "folder = scratch_folder('scratch-test-')\n(folder / 'model.bin').write_bytes(b'x' * 1000)\n"
            f"assert scratch_folder('unused-', keep={str(kept)!r}) == __import__('pathlib').Path({str(kept)!r})\n"
            "print(folder, flush=True)\n" + ("raise RuntimeError('a failed run')\n" if ending == "raises" else ""))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=tool_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == (1 if ending == "raises" else 0), proc.stderr[-2000:]
    folder = Path(proc.stdout.strip())
    assert folder.name.startswith("scratch-test-") and not folder.exists()
    assert kept.is_dir()


def write_tiny_shortlist_files(folder):
    """A dictionary of 40 words (dict.txt), 12 sentences of 5 of them (text) and
    a table (vmap) giving each word itself and the next, and two for every sentence."""
    words = [f"t{i}" for i in range(40)]
    (folder / "dict.txt").write_text("".join(f"{w} {100 - i}\n" for i, w in enumerate(words)))
    (folder / "text").write_text("".join(" ".join(words[(i * 7 + j) % 40] for j in range(5)) + "\n"
                                         for i in range(12)))
    (folder / "vmap").write_text("\tt0 t1\n" + "".join(f"{w}\t{w} t{(i + 1) % 40}\n" for i, w in enumerate(words)))


def test_shortlist_groups_times_each_list_of_candidates(tmp_path):
    """research/shortlist_groups.py on a tiny vocabulary: a group's candidates
    grow with the group, a batch's are the most of them, and every kind of
    step is timed in each round."""
    write_tiny_shortlist_files(tmp_path)
    out = tmp_path / "groups.json"
    for packed in ([], ["--packed-groups"]):
        script("shortlist_groups.py", "--vocab", 300, "--text", tmp_path / "text", "--dictionary",
               tmp_path / "dict.txt", "--target-dictionary", tmp_path / "dict.txt", "--shortlist", tmp_path / "vmap",
               "--sentences", 12, "--batch", 4, "--groups", 1, 2, "--len", 3, "--rounds", 2, "--json", out, *packed)
        figures = json.loads(out.read_text())
        columns = figures["columns"]
        (one, one_width), (two, two_width) = columns["groups of 1 (mean, padded width)"], \
            columns["groups of 2 (mean, padded width)"]
        assert one <= one_width <= two_width <= columns["batch's candidates"] < columns["whole vocabulary"] == 300
        assert one < two
        assert set(figures["runs"]) == {"whole vocabulary", "batch's candidates", "candidates of groups of 1",
                                        "candidates of groups of 2"}
        assert all(len(r) == 2 and min(r) > 0 for r in figures["runs"].values())
    refused = script("shortlist_groups.py", "--text", tmp_path / "text", "--dictionary", tmp_path / "dict.txt",
                     "--target-dictionary", tmp_path / "dict.txt", "--shortlist", tmp_path / "vmap",
                     "--batch", 4, "--groups", 3, check=False)
    assert refused.returncode == 2 and "--groups 3 must divide --batch 4" in refused.stderr


def test_shortlist_bound_measures_the_vocabularys_share_of_a_step(tmp_path):
    """research/shortlist_bound.py on a tiny random model: the time over the
    vocabulary is a part of each system's decoding time, the kept share is a
    batch's candidates, and the bound is the formula of both."""
    write_tiny_shortlist_files(tmp_path)
    out = tmp_path / "bound.json"
    script("shortlist_bound.py", "--vocab", 300, "--text", tmp_path / "text", "--dictionary", tmp_path / "dict.txt",
           "--shortlist", tmp_path / "vmap", "--sentences", 12, "--batch", 4, "--len", 4, "--rounds", 1,
           "--json", out)
    figures = json.loads(out.read_text())
    for seconds in figures["seconds"].values():
        assert 0 < seconds["vocabulary"] < seconds["total"]
    assert 0 < figures["kept"] < 0.2  # some 2 x 20 words and the specials of 300 tokens
    exact = figures["seconds"]["exact"]
    assert figures["vocabulary_share"] == pytest.approx(exact["vocabulary"] / exact["total"])
    assert figures["bound"] == pytest.approx(1 / (1 - figures["vocabulary_share"] * (1 - figures["kept"])))


def test_benchmark_generate_cores_names_a_missing_file_in_one_line(tmp_path):
    """A file option that names no file stops before any model is made."""
    for option in ("--text", "--dictionary", "--shortlist"):
        proc = script("benchmark_generate_cores.py", option, tmp_path / "missing.txt", check=False)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1] == (
            f"benchmark_generate_cores.py: error: {option} {tmp_path / 'missing.txt'}: no such file")
    proc = script("benchmark_generate_cores.py", "--data", tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        "--data and --path go together (a trained model's data and checkpoint)")


def test_one_sentence_latency_names_what_it_lacks_in_one_line(tmp_path):
    proc = script("one_sentence_latency.py", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        "give --data, --path and --bpe-text (a trained model), or --random-dims")
    proc = script("one_sentence_latency.py", "--random-dims", "small", "--path", tmp_path / "no.pt", check=False)
    assert proc.returncode == 2 and "--path" in proc.stderr and "not found" in proc.stderr
