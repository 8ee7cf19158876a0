"""Word-level knowledge distillation (Kim & Rush 2016, eq. 4 and 5) from a
trained teacher, e.g. a soft-attention model teaching a hard-retrieval
student the same task: the loss per target token is

    (1 − α) · label-smoothed CE  +  α · T² · KL(p_teacher,T ‖ p_student,T)

where p_·,T are the output distributions at temperature T. The teacher is a
fairseq checkpoint over the same dictionary; it runs in eval mode without
gradients on the student's own batch (same source, same target prefix).

The teacher is kept outside the criterion's module tree: fairseq would
otherwise hand its parameters to the optimizer and save them in every
checkpoint. The criterion logs the KL per token (``distill``) beside the
usual losses.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

from ..errors import ConfigError


@dataclass
class LabelSmoothedCrossEntropyWithDistillationConfig(LabelSmoothedCrossEntropyCriterionConfig):
    distill_teacher: str = field(
        default="",
        metadata={"help": "the teacher: a fairseq checkpoint trained on the same dictionary "
                          "(e.g. a soft-attention model teaching hard retrieval)"},
    )
    distill_weight: float = field(
        default=0.5,
        metadata={"help": "α: weight of the distillation term; 1 − α weighs the "
                          "label-smoothed cross-entropy"},
    )
    distill_temperature: float = field(
        default=1.0,
        metadata={"help": "T: temperature of both output distributions in the distillation "
                          "term (scaled by T² so that its gradients keep their size)"},
    )


def load_teacher(path, task):
    """The teacher model of checkpoint ``path``, checked against ``task``'s dictionary."""
    if not path:
        raise ConfigError("--criterion label_smoothed_cross_entropy_with_distillation needs "
                          "--distill-teacher CHECKPOINT")
    if not Path(path).is_file():
        raise ConfigError(f"--distill-teacher: no checkpoint at {path}")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    trained = state["model"].get("decoder.embed_tokens.weight")
    if trained is not None and trained.size(0) != len(task.target_dictionary):
        raise ConfigError(f"--distill-teacher {path}: its target dictionary has "
                          f"{trained.size(0)} entries, the task's {len(task.target_dictionary)}: "
                          "the teacher must be trained on the same binarized data (dict.*.txt)")
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task, state=state)
    return models[0]


@register_criterion("label_smoothed_cross_entropy_with_distillation",
                    dataclass=LabelSmoothedCrossEntropyWithDistillationConfig)
class LabelSmoothedCrossEntropyWithDistillationCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, distill_teacher="",
                 distill_weight=0.5, distill_temperature=1.0, ignore_prefix_size=0,
                 report_accuracy=False, teacher=None):
        super().__init__(task, sentence_avg, label_smoothing,
                         ignore_prefix_size=ignore_prefix_size, report_accuracy=report_accuracy)
        if not 0.0 <= distill_weight <= 1.0:
            raise ConfigError(f"--distill-weight must be in [0, 1], got {distill_weight}")
        if distill_temperature <= 0:
            raise ConfigError(f"--distill-temperature must be > 0, got {distill_temperature}")
        self.distill_weight = distill_weight
        self.distill_temperature = distill_temperature
        teacher = teacher if teacher is not None else load_teacher(distill_teacher, task)
        teacher.eval()
        for parameter in teacher.parameters():
            parameter.requires_grad_(False)
        self._teacher = [teacher]  # a list: not a submodule (see the module docstring)

    @property
    def teacher(self):
        return self._teacher[0]

    def _teacher_on(self, reference):
        """The teacher on ``reference``'s device and in its dtype (moved once;
        it stays in eval mode: as no submodule, criterion.train() never reaches it)."""
        teacher = self.teacher
        parameter = next(teacher.parameters())
        if parameter.device != reference.device or parameter.dtype != reference.dtype:
            teacher.to(device=reference.device, dtype=reference.dtype)
        return teacher

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        with torch.no_grad():
            teacher = self._teacher_on(net_output[0])
            teacher_logits = teacher(**sample["net_input"])[0]
        kl = self.distillation(net_output[0], teacher_logits, sample, reduce=reduce)
        temperature = self.distill_temperature
        loss = (1.0 - self.distill_weight) * loss \
            + self.distill_weight * temperature ** 2 * kl
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "distill": kl.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = n_correct.item()
            logging_output["total"] = total.item()
        return loss, sample_size, logging_output

    def distillation(self, student_logits, teacher_logits, sample, reduce=True):
        """KL(p_teacher,T ‖ p_student,T) per target token, summed over the
        non-padding tokens (per token when not ``reduce``)."""
        temperature = self.distill_temperature
        start = self.ignore_prefix_size
        student = F.log_softmax(student_logits[:, start:].float() / temperature, dim=-1)
        teacher = F.log_softmax(teacher_logits[:, start:].float() / temperature, dim=-1)
        kl = (teacher.exp() * (teacher - student)).sum(dim=-1)
        kl = kl.masked_fill(sample["target"][:, start:].eq(self.padding_idx), 0.0)
        return kl.sum() if reduce else kl.view(-1)

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        distill = sum(log.get("distill", 0) for log in logging_outputs)
        if ntokens > 0:
            metrics.log_scalar("distill", distill / ntokens, ntokens, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
