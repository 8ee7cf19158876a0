"""Sampling and shards through fairseq's commands: fairseq-generate
``--sampling`` decodes with the plugin's search, each sentence's samples the
same in any batch, worker or shard and in fairseq-interactive (a sentence
draws from a generator seeded by ``--seed`` and its index); ``--num-shards``
/ ``--shard-id`` partition the set."""

import re

import pytest

from conftest import assert_same_output, generate, interactive, one_error_line, output_lines

SAMPLING = ("--sampling", "--sampling-topk", "5", "--seed", "3")


def lines_by_id(stdout, kinds="SHDP"):
    """{id: that sentence's S/H/D/P lines}."""
    found = {}
    for line in output_lines(stdout):
        kind, sentence = re.match(r"^([STHDPA])-(\d+)", line).groups()
        if kind in kinds:
            found.setdefault(int(sentence), []).append(line)
    return found


def test_sampling_decodes_with_the_plugins_search_the_same_in_any_batch_or_worker(trained_checkpoints,
                                                                                reorder_data):
    hard = trained_checkpoints["hard"]
    runs = {}
    for batch, workers in ((8, 1), (3, 2), (20, 1)):
        proc = generate(reorder_data, hard, *SAMPLING, "--beam", 2, "--nbest", 2, "--batch-size", batch,
                        "--model-overrides", f"{{'decoding_workers': {workers}}}")
        assert "fairseq's generator" not in proc.stderr
        runs[batch, workers] = lines_by_id(proc.stdout)
    first = runs[8, 1]
    assert len(first) == 20
    for found in runs.values():
        assert sorted(found) == sorted(first)
        for sentence, lines in found.items():
            assert_same_output("\n".join(lines), "\n".join(first[sentence]))
    # another seed, other samples
    other = lines_by_id(generate(reorder_data, hard, "--sampling", "--sampling-topk", "5", "--seed", "4",
                                 "--beam", 2, "--nbest", 2).stdout, "H")
    assert other != {k: [line for line in v if line.startswith("H")] for k, v in first.items()}


def test_interactive_samples_each_line_as_generate_samples_that_sentence(trained_checkpoints, reorder_data):
    """A line's index is its id: fairseq-interactive (any --buffer-size)
    draws for line i what fairseq-generate draws for sentence i of the
    same text."""
    soft = trained_checkpoints["soft"]
    sources = (reorder_data.parent / "raw" / "test.src").read_text().splitlines()
    generated = lines_by_id(generate(reorder_data, soft, *SAMPLING, "--beam", 1).stdout, "H")
    for buffer in (20, 7):
        proc = interactive(reorder_data, soft, sources, *SAMPLING, "--beam", 1, "--buffer-size", buffer,
                           "--batch-size", 4)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found = lines_by_id(proc.stdout, "H")
        assert sorted(found) == list(range(20))
        for sentence, lines in found.items():
            assert_same_output("\n".join(lines), "\n".join(generated[sentence]))


@pytest.mark.parametrize("sampling", [False, True])
def test_shards_partition_the_set_and_together_are_its_output(trained_checkpoints, reorder_data, sampling):
    soft = trained_checkpoints["soft"]
    extra = (*SAMPLING, "--beam", 2, "--nbest", 2) if sampling else ()
    whole = lines_by_id(generate(reorder_data, soft, *extra, "--batch-size", 3).stdout)
    shards = []
    for shard in range(3):
        proc = generate(reorder_data, soft, *extra, "--batch-size", 3, "--num-shards", 3, "--shard-id", shard)
        assert f"decoding shard {shard} of 3" in proc.stderr
        shards.append(lines_by_id(proc.stdout))
    ids = [set(found) for found in shards]
    assert all(ids) and sum(len(s) for s in ids) == 20 and set().union(*ids) == set(whole)
    for found in shards:
        for sentence, lines in found.items():
            assert_same_output("\n".join(lines), "\n".join(whole[sentence]))


def test_a_shard_id_out_of_range_is_one_line(trained_checkpoints, reorder_data):
    proc = generate(reorder_data, trained_checkpoints["soft"], "--num-shards", 2, "--shard-id", 2, check=False)
    one_error_line(proc, "--shard-id must be at least 0 and below --num-shards (2), got 2")


def test_fairseq_interactive_refuses_shards_it_would_ignore(trained_checkpoints, reorder_data):
    proc = interactive(reorder_data, trained_checkpoints["soft"], ["s1 s2"], "--num-shards", 2, "--shard-id", 1)
    one_error_line(proc, "fairseq-interactive translates its whole input: --num-shards and --shard-id shard")
