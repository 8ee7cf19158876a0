"""Distillation from a trained teacher: word-level (criterion
label_smoothed_cross_entropy_with_distillation) and sequence-level (the
teacher's translations as the training targets: tools/distillation.py)."""

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss
from fairseq.data import Dictionary, data_utils

from conftest import MAX_LEN_B, TinyTask, build_model, make_dictionary, random_batch, tool_env, train
from fairseq_hardattn.criterions.label_smoothed_cross_entropy_with_distillation import (
    LabelSmoothedCrossEntropyWithDistillationCriterion as Distillation,
)
from fairseq_hardattn.errors import ConfigError
from hardattn_tools.distillation import distilled_pairs


def sample_of(d):
    src, src_lengths, prev = random_batch(d, [5, 3], tgt_len=4)
    target = torch.cat([prev[:, 1:], torch.full((2, 1), d.eos())], dim=1)
    target[1, -1] = d.pad()
    return {"net_input": {"src_tokens": src, "src_lengths": src_lengths,
                          "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(d.pad()).sum())}


@pytest.mark.parametrize("weight,temperature", [(0.5, 1.0), (0.8, 2.0)])
def test_loss_is_weighted_ce_plus_scaled_kl_to_the_teacher(weight, temperature):
    torch.manual_seed(0)
    d = make_dictionary()
    student = build_model("transformer_hard_dec", d).float().train()
    teacher = build_model("transformer_soft", d).float()
    sample = sample_of(d)
    criterion = Distillation(TinyTask(d), False, 0.1, distill_weight=weight,
                             distill_temperature=temperature, teacher=teacher)
    torch.manual_seed(1)
    loss, sample_size, logging = criterion(student, sample)

    torch.manual_seed(1)  # the same forward again, by hand
    logits = student(**sample["net_input"])[0]
    lprobs = torch.log_softmax(logits, -1)
    ce, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1),
                                    0.1, ignore_index=d.pad())
    with torch.no_grad():
        p_teacher = torch.softmax(teacher.eval()(**sample["net_input"])[0] / temperature, -1)
    log_student = torch.log_softmax(logits / temperature, -1)
    kl = (p_teacher * (p_teacher.log() - log_student)).sum(-1)
    kl = kl[sample["target"].ne(d.pad())].sum()
    assert sample_size == 7
    torch.testing.assert_close(loss, (1 - weight) * ce + weight * temperature ** 2 * kl)
    assert logging["distill"] == pytest.approx(kl.item(), rel=1e-5)
    assert kl.item() > 0


def test_a_student_equal_to_its_teacher_has_no_distillation_loss():
    d = make_dictionary()
    teacher = build_model("transformer_soft", d).float()
    student = copy.deepcopy(teacher).eval()
    criterion = Distillation(TinyTask(d), False, 0.1, distill_weight=0.3, teacher=teacher)
    loss, _, logging = criterion(student, sample_of(d))
    assert logging["distill"] == pytest.approx(0.0, abs=1e-5)
    plain, _ = criterion.compute_loss(student, student(**sample_of(d)["net_input"]), sample_of(d))
    torch.testing.assert_close(loss, 0.7 * plain)


def test_the_teacher_is_frozen_and_not_part_of_the_criterion():
    """fairseq hands a criterion's parameters to the optimizer and saves them
    in every checkpoint: the teacher must not be among them, nor train."""
    d = make_dictionary()
    teacher = build_model("transformer_soft", d).float()
    before = copy.deepcopy(teacher.state_dict())
    student = build_model("transformer_hard_dec", d).float().train()
    criterion = Distillation(TinyTask(d), False, 0.1, teacher=teacher).train()
    assert list(criterion.parameters()) == []
    loss, _, _ = criterion(student, sample_of(d))
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert not teacher.training
    for name, value in teacher.state_dict().items():
        torch.testing.assert_close(value, before[name])


@pytest.mark.parametrize("kwargs,message", [
    (dict(distill_weight=1.5), "--distill-weight must be in [0, 1], got 1.5"),
    (dict(distill_temperature=0.0), "--distill-temperature must be > 0, got 0.0"),
    (dict(distill_teacher=""), "needs --distill-teacher CHECKPOINT"),
    (dict(distill_teacher="/nonexistent/teacher.pt"), "--distill-teacher: no checkpoint at"),
])
def test_bad_settings_are_config_errors(kwargs, message):
    d = make_dictionary()
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Distillation(TinyTask(d), False, 0.1, **kwargs)


def test_fairseq_train_distills_a_hard_student_from_a_soft_checkpoint(
        trained_checkpoints, reorder_data, tmp_path):
    """Through fairseq-train: the KL is logged, the checkpoint holds the
    student alone, and the student differs from a run without the teacher."""
    flags = ["--criterion", "label_smoothed_cross_entropy_with_distillation",
             "--distill-teacher", trained_checkpoints["soft"], "--distill-weight", "0.5"]
    proc = train(reorder_data, tmp_path / "kd", "transformer_hard_dec", *flags, updates=2)
    assert "distill" in proc.stderr + proc.stdout
    state = torch.load(tmp_path / "kd" / "checkpoint_last.pt", map_location="cpu",
                       weights_only=False)
    assert state["criterion"] is None
    assert all(not key.startswith("teacher") for key in state["model"])
    train(reorder_data, tmp_path / "plain", "transformer_hard_dec", updates=2)
    plain = torch.load(tmp_path / "plain" / "checkpoint_last.pt", map_location="cpu",
                       weights_only=False)
    key = "decoder.layers.0.fc1.weight"
    assert not torch.equal(state["model"][key], plain["model"][key])


# --- sequence-level distillation (hardattn_tools/distillation.py) ---------

def distill_cli(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "hardattn_tools.distillation",
                           *map(str, args)], env=tool_env(), capture_output=True, text=True,
                          timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def read_split(data_bin, split, lang):
    """The token lists of one binarized side of a data-bin, and its dictionary."""
    dictionary = Dictionary.load(str(Path(data_bin) / f"dict.{lang}.txt"))
    dataset = data_utils.load_indexed_dataset(str(Path(data_bin) / f"{split}.src-tgt.{lang}"),
                                              dictionary)
    return [dataset[i].tolist() for i in range(len(dataset))], dictionary


def test_generate_lines_come_in_data_set_order_best_hypothesis_first():
    output = ("S-1\tB b\nH-1\t-0.1\tsecond\nS-0\tA a\nH-0\t-0.2\tfirst\n"
              "H-0\t-0.9\tfirst, worse (nbest)\n")
    assert distilled_pairs(output) == (["A a", "B b"], ["first", "second"])
    with pytest.raises(ValueError, match=r"lacks sentences \[1\]"):
        distilled_pairs("S-0\ta\nH-0\t-1\tb\nS-2\tc\nH-2\t-1\td\n")
    with pytest.raises(ValueError, match="2 sources but 1 hypotheses"):
        distilled_pairs("S-0\ta\nH-0\t-1\tb\nS-1\tc\n")


def test_the_distilled_corpus_pairs_each_training_source_with_the_teachers_translation(
        trained_checkpoints, reorder_data, tmp_path):
    out = tmp_path / "kd"
    proc = distill_cli(reorder_data, trained_checkpoints["soft"], out, "--", "--cpu",
                       "--max-len-b", MAX_LEN_B)
    assert "translating the training set" in proc.stderr
    distilled = out / "data-bin"
    sources, _ = read_split(reorder_data, "train", "src")
    references, _ = read_split(reorder_data, "train", "tgt")
    kd_sources, _ = read_split(distilled, "train", "src")
    kd_targets, dictionary = read_split(distilled, "train", "tgt")
    assert kd_sources == sources  # every training source, in the training set's order
    # each target is the teacher's best hypothesis for that source
    hypotheses = {int(i): text for i, text in
                  re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", (out / "train.gen").read_text(), flags=re.M)}
    assert [dictionary.string(t) for t in kd_targets] == [hypotheses[i] for i in range(len(sources))]
    assert kd_targets != references
    # the other subsets are the real ones: models are chosen and scored on references
    for name in ("valid.src-tgt.tgt.bin", "test.src-tgt.src.idx", "test.src-tgt.tgt.bin"):
        assert (distilled / name).read_bytes() == (reorder_data / name).read_bytes()
    # fairseq trains on it as on the original data (one dictionary for shared embeddings)
    train(distilled, tmp_path / "student", "transformer_hard_dec", "--share-all-embeddings",
          updates=1)
    assert (tmp_path / "student" / "checkpoint_last.pt").is_file()
    # a finished corpus is kept
    before = (out / "train.gen").stat().st_mtime_ns
    proc = distill_cli(reorder_data, trained_checkpoints["soft"], out)
    assert "distilled data ready" in proc.stderr and "translating" not in proc.stderr
    assert (out / "train.gen").stat().st_mtime_ns == before


@pytest.mark.parametrize("problem", ["teacher", "data"])
def test_sequence_distillation_names_what_is_missing_in_one_line(problem, reorder_data,
                                                                 trained_checkpoints, tmp_path):
    data = tmp_path if problem == "data" else reorder_data
    teacher = tmp_path / "none.pt" if problem == "teacher" else trained_checkpoints["soft"]
    proc = distill_cli(data, teacher, tmp_path / "kd", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    expected = f"no teacher checkpoint at {teacher}" if problem == "teacher" else \
        f"{tmp_path}: no binarized training set"
    assert f"error: {expected}" in proc.stderr.splitlines()[-1]
