"""The corpus command (``python -m fairseq_hardattn translate``): one output
line per input line, fairseq-interactive's translations; empty, too long and
invalid UTF-8 lines kept aligned; killed at any moment and run again, the
output of an uninterrupted run; two torchrun ranks, one process's output;
mistakes in one line."""

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import BIN_DIR, ForkServer, interactive, one_error_line, tool_env

LINE = re.compile(r"^D-(\d+)\t[^\t]*\t(.*)$", re.M)


@pytest.fixture(scope="module")
def sources(reorder_data):
    return (reorder_data.parent / "raw" / "test.src").read_text().splitlines()


def arguments(data, checkpoint, source, output, *extra):
    return ["translate", str(data), "--path", str(checkpoint), "--source-lang", "src", "--target-lang", "tgt",
            "--beam", "4", "--max-len-b", "20", "--input", str(source), "--output", str(output),
            *[str(a) for a in extra]]


def translate(data, checkpoint, source, output, *extra, env=None, check=True, timeout=300):
    """``python -m fairseq_hardattn translate ...`` (in a child of the tests'
    fork server, with the variables ``env`` set too)."""
    proc = ForkServer.run("-m fairseq_hardattn", arguments(data, checkpoint, source, output, *extra),
                          None, None, timeout, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def committed(parts):
    return len(list(parts.glob("chunk-*"))) if parts.exists() else 0


def test_one_output_line_per_input_line_as_fairseq_interactive_translates_it(trained_checkpoints, reorder_data,
                                                                           sources, tmp_path):
    hard = trained_checkpoints["hard"]
    long_line = " ".join(["s1"] * 1100)  # more than the model's 1024 source positions
    lines = [sources[0], "", "   ", sources[1], long_line, *sources[2:12]]
    source = tmp_path / "in.txt"
    source.write_bytes("\n".join(lines).encode() + b"\n" + sources[12].encode() + b" \xff\xfe s2")  # no final newline
    proc = translate(reorder_data, hard, source, tmp_path / "out.txt", "--buffer-size", 4, "--batch-size", 3)
    out = (tmp_path / "out.txt").read_text().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines) + 1
    expected = dict((int(i), text) for i, text in LINE.findall(
        interactive(reorder_data, hard, [line for line in lines if line.strip() and line != long_line]).stdout))
    kept = [i for i, line in enumerate(lines) if line.strip() and line != long_line]
    assert [out[i] for i in kept] == [expected[n] for n in range(len(kept))]
    assert out[1] == out[2] == out[4] == "" and out[len(lines)]
    assert "line 5 has 1101 tokens" in proc.stderr
    assert f"line {len(lines) + 1} is not valid UTF-8 (byte 0xff" in proc.stderr
    assert not (tmp_path / "out.txt.parts").exists()
    assert "Traceback" not in proc.stderr


def test_cased_lines_for_a_model_without_capitals_are_warned_about_once(trained_checkpoints, reorder_data,
                                                                        sources, tmp_path):
    """The tiny task's dictionary has no capital letters: mostly cased input
    (a model trained on lowercased text given raw text) is named in one
    warning, by the corpus command and by fairseq-interactive, and translated
    all the same; lowercase input is not."""
    cased, lowered = tmp_path / "cased.txt", tmp_path / "lowered.txt"
    cased.write_text("\n".join(line.upper() for line in sources[:9]) + "\n")
    lowered.write_text("\n".join(sources[:9]) + "\n")
    proc = translate(reorder_data, trained_checkpoints["hard"], cased, tmp_path / "cased.out", "--buffer-size", 4)
    assert proc.stderr.count("warning: the model's source dictionary has no capital letters") == 1
    assert f"4 of 4 lines from line 1 of {cased} have some" in proc.stderr
    assert len((tmp_path / "cased.out").read_text().splitlines()) == 9
    proc = translate(reorder_data, trained_checkpoints["hard"], lowered, tmp_path / "lowered.out")
    assert "capital letters" not in proc.stderr
    # fairseq-interactive with the plugin, its lines one at a time (--buffer-size 1)
    proc = interactive(reorder_data, trained_checkpoints["hard"], ["", *(line.upper() for line in sources[:3])])
    assert proc.returncode == 0 and len(LINE.findall(proc.stdout)) == 4  # (the empty line too)
    assert proc.stderr.count("warning: the model's source dictionary has no capital letters, but 1 of 1 "
                             "lines from line 2 of the standard input have some") == 1
    assert "capital letters" not in interactive(reorder_data, trained_checkpoints["hard"], sources[:3]).stderr


def test_killed_at_random_moments_and_run_again_the_output_of_a_run_never_stopped(trained_checkpoints,
                                                                                 reorder_data, sources, tmp_path):
    """SIGKILL twice and SIGTERM once at random moments (loading,
    decoding, committing), each time the same command again, then to the
    end: byte for byte the output of a run that was never stopped; sampling
    with two workers, so that the samples' seeds and the workers' read-ahead
    are in play."""
    soft = trained_checkpoints["soft"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources[i % len(sources)] for i in range(1200)) + "\n")
    options = ("--buffer-size", 60, "--batch-size", 16, "--sampling", "--sampling-topk", 5, "--seed", 11,
               "--model-overrides", "{'decoding_workers': 2}")
    translate(reorder_data, soft, source, tmp_path / "whole.txt", *options)
    output = tmp_path / "resumed.txt"
    moments = random.Random(5)
    parts = tmp_path / "resumed.txt.parts"
    stops = []
    for how, after_chunks in ((signal.SIGKILL, 0), (signal.SIGTERM, 6), (signal.SIGKILL, 13)):
        pid, files, tmp = ForkServer.start("-m fairseq_hardattn", arguments(reorder_data, soft, source, output,
                                                                             *options))
        before = committed(parts)
        # a random moment once this run has committed `after_chunks` (0: while it loads)
        deadline = time.monotonic() + 120
        while committed(parts) < after_chunks and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(moments.uniform(0.0, 0.3) if after_chunks else moments.uniform(0.1, 1.5))
        os.kill(pid, how)
        proc = ForkServer.finish(pid, files, tmp, ["translate"], timeout=60)
        after = committed(parts)
        stops.append((how, proc.returncode, before, after))
        if how == signal.SIGTERM and proc.returncode != 0:
            assert "stopped by SIGTERM" in proc.stderr and "Traceback" not in proc.stderr
    assert any(after > before for _, _, before, after in stops), stops  # some were stopped mid-way
    translate(reorder_data, soft, source, output, *options)
    assert output.read_bytes() == (tmp_path / "whole.txt").read_bytes()
    assert not (tmp_path / "resumed.txt.parts").exists()
    # no temporary file left; each output's record of the command that made it
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [
        ".resumed.txt.command.json", ".whole.txt.command.json"]


def test_two_torchrun_ranks_give_one_processs_output(trained_checkpoints, reorder_data, sources, tmp_path):
    soft = trained_checkpoints["soft"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources[i % len(sources)] for i in range(250)) + "\n")
    translate(reorder_data, soft, source, tmp_path / "one.txt", "--buffer-size", 30)
    proc = subprocess.run(
        [str(BIN_DIR / "torchrun"), "--nproc-per-node", "2", "--master-port", "0", "-m", "fairseq_hardattn",
         "translate", str(reorder_data), "--path", str(soft), "--source-lang", "src", "--target-lang", "tgt",
         "--beam", "4", "--max-len-b", "20", "--input", str(source), "--output", str(tmp_path / "two.txt"),
         "--buffer-size", "30"], env=tool_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "two.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()
    assert "rank 1 of 2" in proc.stderr + proc.stdout or "wrote" in proc.stderr


def test_a_rank_that_died_resumes_its_part_and_merge_assembles(trained_checkpoints, reorder_data, sources,
                                                              tmp_path):
    """SLURM's variables: rank 0 of 2 alone leaves the output to the other;
    --merge names what is missing; rank 1 then writes its part and, last,
    the output."""
    soft = trained_checkpoints["soft"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources[i % len(sources)] for i in range(90)) + "\n")
    translate(reorder_data, soft, source, tmp_path / "one.txt", "--buffer-size", 20)
    output = tmp_path / "ranks.txt"
    rank0 = translate(reorder_data, soft, source, output, "--buffer-size", 20,
                      env=tool_env(SLURM_PROCID="0", SLURM_NTASKS="2"))
    assert "is assembled when the others are done" in rank0.stderr and not output.exists()
    merge = translate(reorder_data, soft, source, output, "--buffer-size", 20, "--merge", check=False)
    one_error_line(merge, "--merge: 2 of 5 chunks are not done yet (the first: lines 21-40)")
    translate(reorder_data, soft, source, output, "--buffer-size", 20, env=tool_env(SLURM_PROCID="1", SLURM_NTASKS="2"))
    assert output.read_bytes() == (tmp_path / "one.txt").read_bytes()


def test_shards_of_a_job_array_give_one_processs_output(trained_checkpoints, reorder_data, sources, tmp_path):
    """--num-shards 2: shard 1 alone leaves the output to the other; shard 0,
    quiet and last, writes it; a shard under a launcher's ranks is refused."""
    soft = trained_checkpoints["soft"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources[i % len(sources)] for i in range(90)) + "\n")
    translate(reorder_data, soft, source, tmp_path / "one.txt", "--buffer-size", 20)
    output = tmp_path / "shards.txt"
    both = translate(reorder_data, soft, source, output, "--buffer-size", 20, "--num-shards", 2, "--shard-id", 0,
                     env=tool_env(SLURM_PROCID="1", SLURM_NTASKS="2"), check=False)
    one_error_line(both, "--num-shards and a launcher's 2 ranks both split the input")
    shard1 = translate(reorder_data, soft, source, output, "--buffer-size", 20, "--num-shards", 2, "--shard-id", 1,
                       "--progress-seconds", 0)
    assert "translate, shard 1 of 2: done" in shard1.stderr and not output.exists()
    assert "translate, shard 1 of 2: 20 of 40 lines (" in shard1.stderr
    assert committed(tmp_path / "shards.txt.parts") == 2
    shard0 = translate(reorder_data, soft, source, output, "--buffer-size", 20, "--num-shards", 2, "--shard-id", 0,
                       "--progress-seconds", 0, "--quiet")
    assert "lines (" not in shard0.stderr  # (no progress lines)
    assert output.read_bytes() == (tmp_path / "one.txt").read_bytes()


def test_another_commands_output_is_refused_unless_overwrite(trained_checkpoints, reorder_data, sources, tmp_path):
    soft, hard = trained_checkpoints["soft"], trained_checkpoints["hard"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources) + "\n")
    output = tmp_path / "out.txt"
    translate(reorder_data, soft, source, output, "--buffer-size", 5)
    one_error_line(translate(reorder_data, soft, source, output, "--max-len-b", 3, check=False),
                   f"{output} exists, made by another command or by none (--overwrite")
    output.unlink()
    (tmp_path / "out.txt.parts").mkdir()
    translate(reorder_data, soft, source, output, "--buffer-size", 5, "--max-len-b", 3, "--overwrite")
    output.unlink()
    parts = tmp_path / "out.txt.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text("{}")
    refused = translate(reorder_data, hard, source, output, "--buffer-size", 5, check=False)
    one_error_line(refused, "holds the parts of another command (it differs in")
    translate(reorder_data, hard, source, output, "--buffer-size", 5, "--overwrite")
    assert len(output.read_text().splitlines()) == len(sources)


def test_a_finished_run_ends_with_its_exit_functions_and_streams_done(trained_checkpoints, reorder_data, sources,
                                                                       tmp_path):
    """A run that has done its work skips the interpreter's teardown (freeing
    every module fairseq and PyTorch loaded) but nothing an exit owes: the
    process's exit functions run and what its streams hold is written."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marker = tmp_path / "exit-functions-ran"
    (hooks / "sitecustomize.py").write_text(  # (a line without its end stays in stdout's buffer)
        "import atexit, sys\n"
        f"atexit.register(lambda: (open({str(marker)!r}, 'w').close(), sys.stdout.write('at exit')))\n")
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources[:3]) + "\n")
    proc = subprocess.run([sys.executable, "-m", "fairseq_hardattn",
                           *arguments(reorder_data, trained_checkpoints["soft"], source, tmp_path / "out.txt")],
                          env=tool_env(PYTHONPATH=str(hooks)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists() and proc.stdout == "at exit"
    assert proc.stderr.splitlines()[-1].endswith("(3 lines)")
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 3


@pytest.mark.parametrize("arguments, expected", [
    (["--input", "missing.txt", "--output", "out.txt"], "--input missing.txt: no such readable file"),
    (["--input", "in.txt", "--output", "no/such/folder/out.txt"], "the folder"),
    (["--input", "in.txt"], "--output FILE is required"),
    (["--input", "in.txt", "--output", "out.txt", "--max-tokens", "1"], "--max-tokens 1 fits no line"),
    (["--input", "in.txt", "--output", "out.txt", "--nbest", "2"], "does not take --nbest above 1"),
    (["--input", "in.txt", "--output", "out.txt", "--print-alignment"], "does not take --print-alignment"),
    (["--input", "in.txt", "--output", "out.txt", "--results-path", "r"], "does not read --results-path (the "),
    (["--input", "in.txt", "--output", "out.txt", "--distributed-world-size=2"],
     "does not read --distributed-world-size (the ranks come from torchrun"),
    (["--input", "in.txt", "--output", "out.txt", "--num-shards", "2", "--shard-id", "2"],
     "--shard-id must be at least 0 and below --num-shards (2), got 2"),
])
def test_mistakes_are_one_line(trained_checkpoints, reorder_data, tmp_path, arguments, expected):
    (tmp_path / "in.txt").write_text("s1 s2\n")
    proc = ForkServer.run("-m fairseq_hardattn", ["translate", reorder_data, "--path", trained_checkpoints["soft"],
                                                  *arguments], tmp_path, None, 120)
    one_error_line(proc, expected)


def test_help_names_the_corpus_options():
    proc = subprocess.run([sys.executable, "-m", "fairseq_hardattn", "translate", "--help"], env=tool_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--output FILE" in proc.stdout and "--overwrite" in proc.stdout
    assert "--sampling-topk" in proc.stdout  # fairseq-interactive's own options
    assert "--num-shards" in proc.stdout and "--results-path" not in proc.stdout and "--save-dir" not in proc.stdout
    assert "use - for stdin" not in proc.stdout and "standard input is not read" in proc.stdout


def test_a_refused_command_writes_nothing_and_its_correction_runs(trained_checkpoints, reorder_data, sources,
                                                                 tmp_path):
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(sources[:4]) + "\n")
    no_dictionaries = tmp_path / "empty-bin"
    no_dictionaries.mkdir()
    for data, extra in ((reorder_data, ["--beam", "0"]), (no_dictionaries, [])):
        proc = translate(data, trained_checkpoints["soft"], source, output, *extra, check=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-bin", "in.txt"]
    translate(reorder_data, trained_checkpoints["soft"], source, output)
    assert len(output.read_text().splitlines()) == 4


def test_without_path_one_line(reorder_data, tmp_path):
    (tmp_path / "in.txt").write_text("s1 s2\n")
    proc = ForkServer.run("-m fairseq_hardattn", ["translate", reorder_data, "--input", "in.txt", "--output",
                                                  "out.txt"], tmp_path, None, 120)
    one_error_line(proc, "--path CHECKPOINT is required")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_finished_job_run_again_is_complete(trained_checkpoints, reorder_data, sources, tmp_path):
    """A scheduler's rerun of a job done: exit 0, the output untouched."""
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(sources[:6]) + "\n")
    translate(reorder_data, trained_checkpoints["soft"], source, output, "--buffer-size", 4)
    made, when = output.read_bytes(), output.stat().st_mtime_ns
    again = translate(reorder_data, trained_checkpoints["soft"], source, output, "--buffer-size", 4,
                      "--quiet")
    assert f"{output} is complete (this command made it): nothing to do" in again.stderr
    assert output.read_bytes() == made and output.stat().st_mtime_ns == when
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.txt.command.json", "in.txt", "out.txt"]
    translate(reorder_data, trained_checkpoints["soft"], source, output, "--buffer-size", 4, "--max-len-b", 3,
              "--overwrite")
    assert output.read_bytes() != made or len(made.splitlines()) == 6


def test_fairseqs_lines_about_each_buffer_stay_out_of_the_progress(trained_checkpoints, reorder_data, sources,
                                                                  tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(sources[:9]) + "\n")
    proc = translate(reorder_data, trained_checkpoints["soft"], source, tmp_path / "out.txt", "--buffer-size", 3,
                     "--progress-seconds", 0)
    assert "can_reuse_epoch_itr" not in proc.stderr and "EpochBatchIterator" not in proc.stderr
    assert "translate: 9 of 9 lines (" in proc.stderr
