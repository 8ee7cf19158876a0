"""Fine-tuning loss of flexible attention (Shu & Nakayama 2017, eq. 9):
label-smoothed cross-entropy minus β times the mean penalty strength g_t, so
that the model learns to penalise distant positions (and decoding can skip
them). Follows fairseq's ``adaptive_span`` auxiliary-loss pattern: the model
exposes the quantity (``mean_gate``), the criterion adds it to the loss and
logs it (``gate``).

fairseq sums the loss over tokens and divides by ``sample_size`` before the
update; subtracting β·mean(g)·sample_size therefore optimises
CE-per-token − β·mean(g), with mean(g) over layers, heads and target tokens.
"""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics

from ..errors import ConfigError


@dataclass
class LabelSmoothedCrossEntropyWithGateConfig(LabelSmoothedCrossEntropyCriterionConfig):
    gate_beta: float = field(
        default=0.1,
        metadata={"help": "β: weight of the mean flexible-attention penalty strength "
                          "g_t subtracted from the loss"},
    )


@register_criterion("label_smoothed_cross_entropy_with_gate",
                    dataclass=LabelSmoothedCrossEntropyWithGateConfig)
class LabelSmoothedCrossEntropyWithGateCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, gate_beta=0.1,
                 ignore_prefix_size=0, report_accuracy=False):
        super().__init__(task, sentence_avg, label_smoothing,
                         ignore_prefix_size=ignore_prefix_size, report_accuracy=report_accuracy)
        if gate_beta < 0:
            raise ConfigError(f"--gate-beta must be >= 0, got {gate_beta}")
        self.gate_beta = gate_beta

    def forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)
        mean_gate = getattr(model, "mean_gate", None)
        if mean_gate is None:
            raise ConfigError("--criterion label_smoothed_cross_entropy_with_gate needs a "
                              "model with flexible attention (e.g. --arch transformer_flexible)")
        gate = mean_gate(sample["target"].ne(self.padding_idx))
        loss = loss - self.gate_beta * gate * sample_size
        logging_output["loss"] = loss.data
        logging_output["gate"] = gate.data * sample_size  # summed for aggregation
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        gate = sum(log.get("gate", 0) for log in logging_outputs)
        if sample_size > 0:
            metrics.log_scalar("gate", gate / sample_size, sample_size, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
