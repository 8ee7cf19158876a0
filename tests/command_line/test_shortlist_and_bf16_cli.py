"""The vocabulary shortlist and bfloat16 decoding through fairseq's commands,
the hub and the corpus command: ``python -m fairseq_hardattn shortlist``
builds the table from a binarized set; ``{'shortlist': FILE, 'shortlist_k':
K}`` decodes each batch over its candidates, in worker processes too;
``{'bf16_decoding': True}`` decodes where the CPU has AMX or AVX512-BF16 and
is one line elsewhere."""

import re

import pytest

import fairseq_hardattn
from conftest import ForkServer, generate, one_error_line, output_lines, preprocess
from fairseq_hardattn.decoding import bf16


@pytest.fixture(scope="module")
def vmap(reorder_data, tmp_path_factory):
    path = tmp_path_factory.mktemp("shortlist") / "vmap.txt"
    proc = ForkServer.run("-m fairseq_hardattn", ["shortlist", reorder_data, "-o", path, "--k", 3,
                                                  "--frequent", 2], None, None, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "IBM Model 1" in proc.stderr and "wrote" in proc.stderr
    return path


def candidates_of(vmap, sources):
    lines = vmap.read_text().splitlines()
    always = set(lines[0].split("\t")[1].split())
    table = dict(line.split("\t") for line in lines[1:])
    return always | {"</s>", "<unk>"} | {t for s in sources.split() for t in table.get(s, "").split()[:2]}


def test_the_table_is_ctranslate2s_vocabulary_map(vmap, reorder_data):
    lines = vmap.read_text().splitlines()
    assert lines[0].startswith("\t") and len(lines[0].split("\t")[1].split()) == 2
    assert all(len(line.split("\t")) == 2 and 1 <= len(line.split("\t")[1].split()) <= 3 for line in lines[1:])
    # a source token the target vocabulary also holds comes first in its own row (copied names, numbers)
    rows = dict(line.split("\t") for line in lines[1:])
    frequent = set(lines[0].split("\t")[1].split())
    target_tokens = {line.split()[0] for line in (reorder_data / "dict.tgt.txt").read_text().splitlines()}
    shared = [s for s in rows if s in target_tokens and s not in frequent]
    assert shared and all(rows[s].split()[0] == s for s in shared)


def test_a_table_whose_candidates_are_all_frequent_adds_only_each_token_itself(reorder_data, tmp_path):
    path = tmp_path / "vmap.txt"
    proc = ForkServer.run("-m fairseq_hardattn", ["shortlist", reorder_data, "-o", path, "--frequent", 1000],
                          None, None, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = path.read_text().splitlines()
    assert lines[0].startswith("\t") and len(lines[0].split()) > 10
    # beyond them, only the source tokens themselves (the joined vocabulary holds them)
    assert lines[1:] and all(line.split("\t")[0] == line.split("\t")[1] for line in lines[1:])


def test_a_source_token_beside_only_frequent_targets_still_lists_itself(tmp_path):
    """``q`` is only ever translated by the frequent ``F``: Model 1 leaves it
    no candidate beyond the frequent ones, yet the target vocabulary holds
    ``q`` (it translates ``z``), so its row lists ``q`` itself."""
    raw = tmp_path / "raw"
    raw.mkdir()
    pairs = [("q", "F"), ("q q", "F F"), ("z", "q"), ("a b", "a b"), ("b", "F b")] * 4
    for split in ("train", "valid", "test"):
        (raw / f"{split}.src").write_text("".join(f"{s}\n" for s, _ in pairs))
        (raw / f"{split}.tgt").write_text("".join(f"{t}\n" for _, t in pairs))
    data = preprocess(str(raw), str(tmp_path / "bin"))
    path = tmp_path / "vmap.txt"
    proc = ForkServer.run("-m fairseq_hardattn", ["shortlist", data, "-o", path, "--k", 2, "--frequent", 1],
                          None, None, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = path.read_text().splitlines()
    assert lines[0] == "\tF"
    rows = dict(line.split("\t") for line in lines[1:])
    assert rows["q"] == "q" and rows["a"].split()[0] == "a"


def test_generate_decodes_over_each_batchs_candidates_here_and_in_workers(trained_checkpoints, reorder_data, vmap):
    hard = trained_checkpoints["hard"]
    runs = {}
    for workers in (1, 2):
        overrides = f"{{'shortlist': '{vmap}', 'shortlist_k': 2, 'decoding_workers': {workers}}}"
        runs[workers] = generate(reorder_data, hard, "--batch-size", 1, "--model-overrides", overrides).stdout
    assert output_lines(runs[1]) == output_lines(runs[2])
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", runs[1], re.M))
    hypotheses = re.findall(r"^H-(\d+)\t\S+\t(.*)$", runs[1], re.M)
    assert len(hypotheses) == 20
    for sentence, text in hypotheses:  # one sentence a batch: its own candidates
        assert set(text.split()) <= candidates_of(vmap, sources[sentence]), (sources[sentence], text)


def test_the_hub_and_a_bad_table(trained_checkpoints, reorder_data, vmap, tmp_path):
    soft = trained_checkpoints["soft"]
    hub = fairseq_hardattn.from_pretrained(str(soft.parent), checkpoint_file=soft.name,
                                           data_name_or_path=str(reorder_data), shortlist=str(vmap),
                                           shortlist_k=1)
    source = "s1 s2 s3"
    translation = hub.translate(source, beam=2)
    assert set(translation.split()) <= candidates_of(vmap, source)
    (tmp_path / "bad.txt").write_text("no tab here\n")
    proc = generate(reorder_data, soft, "--model-overrides", f"{{'shortlist': '{tmp_path / 'bad.txt'}'}}",
                    check=False)
    one_error_line(proc, "line 1: no tab between the source token and its candidates")
    proc = generate(reorder_data, soft, "--model-overrides", f"{{'shortlist': '{vmap}'}}",
                    "--no-repeat-ngram-size", 2, check=False)
    one_error_line(proc, "a shortlist and --no-repeat-ngram-size exclude each other")


def test_bf16_decodes_where_the_cpu_has_it_and_is_one_line_elsewhere(trained_checkpoints, reorder_data):
    proc = generate(reorder_data, trained_checkpoints["soft"], "--model-overrides", "{'bf16_decoding': True}",
                    check=False)
    if bf16.cpu_bf16_feature():
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert len(re.findall(r"^H-", proc.stdout, re.M)) == 20
        assert "multiply in bfloat16 on this CPU's" in proc.stderr
    else:
        one_error_line(proc, "--bf16-decoding needs a CPU with AMX or AVX512-BF16")
