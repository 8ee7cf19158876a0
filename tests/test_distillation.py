"""Word-level distillation from a trained teacher
(criterion label_smoothed_cross_entropy_with_distillation)."""

import copy

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from conftest import TinyTask, build_model, make_dictionary, random_batch, train
from fairseq_hardattn.criterions.label_smoothed_cross_entropy_with_distillation import (
    LabelSmoothedCrossEntropyWithDistillationCriterion as Distillation,
)
from fairseq_hardattn.errors import ConfigError


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
