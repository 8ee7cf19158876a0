"""Every registered architecture end to end through fairseq's own entry points
with ``--user-dir``: preprocess (the shared fixture), train a few updates with
``--eval-bleu`` (validation batches whose size does not divide by the beam),
save, ``fairseq-generate`` and ``fairseq-interactive`` with
``--print-alignment``, and the Python hub interface (``from_pretrained``,
``translate`` with other beam sizes before and after, ``sample``,
``generate(print_alignment=...)``)."""

import json
import re

import pytest
import torch
from fairseq.models.transformer import TransformerModel

import fairseq_hardattn

from conftest import MAX_LEN_B, TEST_SENTENCES, USER_DIR, generate, hypotheses, run_cli, train

ARCHS = fairseq_hardattn.registered_architectures()
BLEU_FLAGS = ["--eval-bleu", "--eval-bleu-args", json.dumps({"beam": 4, "max_len_b": MAX_LEN_B}),
              "--batch-size-valid", "7"]


def check_alignments(stdout, sources):
    """fairseq's hard alignment of every hypothesis: 'source-target' pairs, one
    per target token (P- has a score per token, EOS included; an untrained
    model may emit <s>, which the H- text leaves out)."""
    aligned = dict(re.findall(r"^A-(\d+)\t(.*)$", stdout, flags=re.M))
    scores = dict(re.findall(r"^P-(\d+)\t(.*)$", stdout, flags=re.M))
    assert sorted(aligned) == sorted(scores) and aligned
    for i, line in aligned.items():
        pairs = [tuple(map(int, pair.split("-"))) for pair in line.split()]
        assert [t for _, t in pairs] == list(range(len(scores[i].split()) - 1)), line
        assert all(0 <= s < len(sources[i].split()) for s, _ in pairs), line
    return aligned


@pytest.mark.parametrize("arch", ARCHS)
def test_every_entry_point(arch, reorder_data, tmp_path):
    log = train(reorder_data, tmp_path, arch, *BLEU_FLAGS)
    log = log.stdout + log.stderr
    assert re.search(r"valid on 'valid' subset .*\| bleu \d", log), log[-2000:]
    checkpoint = tmp_path / "checkpoint_last.pt"

    out = generate(reorder_data, checkpoint, "--print-alignment").stdout
    # every test sentence is translated (batch size 8 does not divide 20) and aligned
    assert sorted(map(int, hypotheses(out))) == list(range(TEST_SENTENCES))
    assert "BLEU4 =" in out
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", out, flags=re.M))
    assert len(check_alignments(out, sources)) == TEST_SENTENCES

    lines = ["s1 s2 s3", "s4 s5 s6 s7 s8", "s9"]
    proc = run_cli("fairseq-interactive", reorder_data, "--user-dir", USER_DIR, "--path",
                   checkpoint, "--cpu", "--beam", 4, "--max-len-b", MAX_LEN_B, "--source-lang", "src",
                   "--target-lang", "tgt", "--print-alignment", input="\n".join(lines) + "\n")
    assert sorted(check_alignments(proc.stdout, {str(i): line for i, line in enumerate(lines)})) == ["0", "1", "2"]

    hub = TransformerModel.from_pretrained(
        str(tmp_path), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(reorder_data),
        user_dir=USER_DIR, source_lang="src", target_lang="tgt", max_len_b=12).eval()
    sentences = ["s1 s2 s3", "s4 s5 s6 s7", "s7 s8", "s10 s11 s12 s3 s4"]
    greedy = hub.translate(sentences, beam=1)
    hub.translate("s1 s2", beam=4)
    assert hub.translate(sentences, beam=1) == greedy
    torch.manual_seed(3)
    sampled = hub.sample(sentences, beam=2, sampling=True)
    torch.manual_seed(3)
    assert hub.sample(sentences, beam=2, sampling=True) == sampled and len(sampled) == 4
    for sentence, hyps in zip(sentences, hub.generate([hub.encode(s) for s in sentences],
                                                      beam=4, print_alignment="hard")):
        best = hyps[0]
        target_tokens = int((best["tokens"] != hub.tgt_dict.eos()).sum())
        assert len(best["alignment"]) == target_tokens
        assert all(0 <= int(s) < len(sentence.split()) for s, _ in best["alignment"])
