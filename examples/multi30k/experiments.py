#!/usr/bin/env python
"""The Multi30k experiments, declared once: the runs trained from scratch,
the fine-tunings that continue them, the decoding variants of trained runs,
the benchmarks and which models they compare, and the rows and labels of
the results tables. ``scripts/results.sh`` and ``examples/multi30k/run.sh``
read it through this command line; ``scripts/results_table.py`` imports it.

Usage: experiments.py runs | finetunes | decodes      (tab-separated lines; - for none)
       experiments.py benchmarks | gpu-benchmarks      (their names)
       experiments.py benchmark NAME WORK_DIR          (its arguments, one per line)
"""

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Tuple

SOFT_KINDS = {"dec_self_attn_kind": "soft", "dec_cross_attn_kind": "soft"}
HARD_KINDS = {"dec_self_attn_kind": "hard", "dec_cross_attn_kind": "hard"}
GATE_LOSS = "--criterion label_smoothed_cross_entropy_with_gate --gate-beta 0.1"


def distillation(weight: float) -> str:
    """The criterion options of word-level distillation with the teacher's term weighted ``weight``."""
    return f"--criterion label_smoothed_cross_entropy_with_distillation --distill-weight {weight:g}"


# word-level distillation's weight α (of the teacher's term) in every distilled
# run but the teacher-only ones (TEACHER_ONLY_WEIGHT)
DISTILL_WEIGHT = 0.5
DISTILLATION = distillation(DISTILL_WEIGHT)
# the soft-to-hard conversions' schedule (and their controls'): 5 epochs, 20 % of
# the 25-epoch budget, 100 warmup updates, the last 2 epochs averaged
CONVERSION_SCHEDULE = {"epochs": 5, "average": 2, "warmup": 100}
# the entropy penalty's one measured weight (issue 18: it did not help)
ENTROPY_WEIGHT = 0.003
ENTROPY_PENALTY = f"--hard-entropy-penalty {ENTROPY_WEIGHT:g}"


@dataclass(frozen=True)
class Run:
    """Trained from scratch with the recipe of common.sh; ``corpus``: a trained
    run whose translations of the training sources replace the references
    (sequence-level distillation: fairseq_hardattn/tools/distillation.py)."""
    name: str
    arch: str
    flags: str
    what: str
    corpus: str = ""


@dataclass(frozen=True)
class FineTune:
    """Continues ``start``'s averaged checkpoint (``--finetune-from-model``,
    which builds from these options: repeat the start's own, e.g. a gate size)
    for ``epochs`` at a peak ``lr``, averaging the last ``average`` epoch
    checkpoints; ``warmup`` 0: a fixed lr, else inverse-sqrt after that many
    warmup updates; ``teacher``: a trained run distilled from
    (``--distill-teacher`` its averaged checkpoint; give the criterion in ``flags``);
    ``corpus``: as a Run's."""
    name: str
    start: str
    arch: str
    flags: str
    what: str
    epochs: int = 1
    average: int = 1
    warmup: int = 0
    teacher: str = ""
    lr: float = 1e-3
    corpus: str = ""


@dataclass(frozen=True)
class Decode:
    """A trained run decoded with other options (``--model-overrides``) or
    other search settings (``search``: fairseq-generate flags after the
    recipe's, e.g. a beam and length penalty); ``cps``: count the score
    computations per step too."""
    name: str
    run: str
    overrides: Dict = field(default_factory=dict)
    what: str = ""
    cps: bool = False
    search: str = ""

    def model_overrides(self):
        return dict(self.overrides, print_cps=True) if self.cps else self.overrides


def reseeded(entry, seed: int):
    """``entry`` (a Run or FineTune) trained with another seed (``name_sN``):
    the noise of its result."""
    return replace(entry, name=f"{entry.name}_s{seed}", flags=f"{entry.flags} --seed {seed}".strip(),
                   what=f"{entry.what} (seed {seed})")


# the parity recipe's presets (issue 18): pre-norm layers, hard and its soft counterpart
SOFT_PRE = Run("soft_pre", "transformer_soft_prenorm_small", "", "soft baseline with pre-norm layers")
HARD_PRE_ARGMAX = Run("hard_pre_argmax", "transformer_hard_dec_prenorm_small", "",
                      "hard retrieval attention (decoder self- and cross-), the parity recipe: "
                      "pre-norm layers, straight-through argmax in training")

# the parity recipe at dropout 0.1: at 0.2 (HARD_PRE_ARGMAX_DROP02) hard retrieval
# gained more than soft on both seeds
HARD_PRE_ARGMAX_DROP01 = replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_drop01", flags="--dropout 0.1",
                                 what="the parity recipe with dropout 0.1 (the recipe: 0.3)")
SOFT_PRE_DROP01 = replace(SOFT_PRE, name="soft_pre_drop01", flags="--dropout 0.1",
                          what="soft_pre with dropout 0.1 (hard_pre_argmax_drop01's soft counterpart)")
# heads with the best recipe: 8 decoder heads retrieve twice the tokens per
# layer (at Base dims, 8 heads of 64, hard's validation loss matched soft's)
EIGHT_DECODER_HEADS = "--decoder-attention-heads 8"
HARD_PRE_ARGMAX_DROP01_H8 = replace(HARD_PRE_ARGMAX_DROP01, name="hard_pre_argmax_drop01_h8",
                                    flags=f"{HARD_PRE_ARGMAX_DROP01.flags} {EIGHT_DECODER_HEADS}",
                                    what="the parity recipe with dropout 0.1 and 8 decoder heads (of 16 dims)")
# the soft counterpart's preset: transformer_soft_prenorm_small with 8 decoder
# heads (the same model: tests/test_models.py)
SOFT_PRE_DROP01_H8 = Run("soft_pre_drop01_h8", "transformer_soft_prenorm_h8_small", SOFT_PRE_DROP01.flags,
                         "soft_pre with dropout 0.1 and 8 decoder heads (the soft counterpart of "
                         "hard_pre_argmax_drop01_h8 and of the curriculum)")
HARD_PRE_ARGMAX_DROP01_H8_S2 = reseeded(HARD_PRE_ARGMAX_DROP01_H8, 2)
SOFT_PRE_DROP01_H8_S2 = reseeded(SOFT_PRE_DROP01_H8, 2)
# the soft-to-hard curriculum, the from-scratch change that helped most at
# dropout 0.3 (hard_pre_anneal over hard_pre: +0.28 valid / +0.57 test2016), on
# the recipe closest to parity; the soft counterparts are the 8-head runs. Its
# preset is hard_pre_argmax_drop01_h8's with the curriculum over the first
# 1500 updates (the same model: tests/test_models.py)
CURRICULUM_UPDATES = 1500
CURRICULUM = f"--hard-anneal-updates {CURRICULUM_UPDATES}"
HARD_PRE_ARGMAX_DROP01_H8_ANNEAL = Run(
    "hard_pre_argmax_drop01_h8_anneal", "transformer_hard_dec_anneal_small", HARD_PRE_ARGMAX_DROP01.flags,
    "the parity recipe with dropout 0.1, 8 decoder heads and the soft-to-hard curriculum "
    f"over the first {CURRICULUM_UPDATES} updates (~half): the nearest to soft")
HARD_PRE_ARGMAX_DROP01_H8_ANNEAL_S2 = reseeded(HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, 2)
# the seeds trained only for the curriculum's pair, each (hard, soft): seed 3,
# as two seeds met the parity target only in their mean, and seed 4, the last,
# as three left the validation gap at -0.32, by the seeds' spread (0.4)
# undecided against the 0.3 bound
CURRICULUM_RESEEDS = tuple((reseeded(HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, seed), reseeded(SOFT_PRE_DROP01_H8, seed))
                           for seed in (3, 4))
# the curriculum's seeds, each with the soft run of its seed, by name
CURRICULUM_PAIRS = tuple((hard.name, soft.name) for hard, soft in (
    (HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, SOFT_PRE_DROP01_H8),
    (HARD_PRE_ARGMAX_DROP01_H8_ANNEAL_S2, SOFT_PRE_DROP01_H8_S2),
    *CURRICULUM_RESEEDS))

RUNS = (
    Run("soft", "transformer_soft_small", "", "soft baseline: fairseq's Transformer, small preset"),
    Run("hard", "transformer_hard_dec_small", "",
        "hard retrieval attention in decoder self- and cross-attention"),
    SOFT_PRE,
    HARD_PRE_ARGMAX,
    SOFT_PRE_DROP01_H8,
    HARD_PRE_ARGMAX_DROP01_H8_ANNEAL,
    Run("cross_self", "transformer_cross_self_small", "",
        "cross+self attention over [final encoder; decoder] states"),
    Run("cross_self_layerwise", "transformer_cross_self_layerwise_small", "",
        "cross+self, decoder layer i attends to encoder layer i"),
    Run("cross_self_share_attn", "transformer_cross_self_small", "--enc-dec-sharing attention",
        "cross+self, encoder/decoder layers share attention"),
    Run("cross_self_share_ffn", "transformer_cross_self_small", "--enc-dec-sharing attention+ffn",
        "cross+self, sharing attention + feed-forward"),
    Run("cross_self_share_all", "transformer_cross_self_small",
        "--enc-dec-sharing attention+ffn+norm",
        "cross+self, sharing attention + feed-forward + layer norms"),
    Run("hard_cross_self", "transformer_hard_cross_self_small", "",
        "hard retrieval cross+self attention"),
    Run("aan", "transformer_aan_small", "", "average attention network replaces decoder self-attention"),
    Run("aan_no_ffn", "transformer_aan_small", "--aan-ffn-dim 0",
        "average attention network without its FFN (average + gate)"),
    Run("local", "transformer_local_small", "", "Luong local-p cross-attention (window D=10)"),
    Run("flexible", "transformer_flexible_small", "",
        "flexible cross-attention (tracked centre, gated penalty)"),
    Run("flexible_gate32", "transformer_flexible_small", "--flexible-gate-dim 32",
        "flexible cross-attention with a 32-unit gate network (d/4: a quarter of its per-step product)"),
    Run("hard_cross", "transformer_hard_cross_small", "",
        "ablation: hard retrieval in decoder cross-attention only"),
    Run("hard_all", "transformer_hard_all_small", "", "ablation: hard retrieval in encoder self-attention too"),
)

# soft-to-hard conversion: the pre-norm soft model, 5 epochs (20 % of its
# updates) with hard retrieval; its control continues soft the same way
HARD_PRE_FROM_SOFT = FineTune(
    "hard_pre_from_soft", "soft_pre", "transformer_hard_dec_prenorm_small", "--hard-train-retrieval sample",
    "soft_pre converted to hard retrieval (keys sampled): 5 epochs of hard fine-tuning (20 % of its updates)",
    **CONVERSION_SCHEDULE)
HARD_PRE_ARGMAX_FROM_SOFT = FineTune(
    "hard_pre_argmax_from_soft", "soft_pre", "transformer_hard_dec_prenorm_small", "",
    "soft_pre converted to the parity recipe (straight-through argmax): 5 epochs of hard fine-tuning "
    "(20 % of its updates)",
    **CONVERSION_SCHEDULE)
SOFT_PRE_MORE = FineTune(
    "soft_pre_more", "soft_pre", "transformer_soft_prenorm_small", "",
    "soft_pre, 5 more soft epochs as hard_pre_from_soft's (the control)", **CONVERSION_SCHEDULE)
# the first half of a conversion (310 of its 620 updates): where its curriculum
# or its cooling runs, as hard_pre_anneal's and hard_pre_cool's over ~half of
# their training
CONVERSION_HALF_UPDATES = 310
CONVERSION_CURRICULUM = f"--hard-anneal-updates {CONVERSION_HALF_UPDATES}"
# the curriculum inside the recipe's conversion; trained with seeds 3 and 4 only
CURRICULUM_CONVERSION = FineTune(
    "hard_pre_argmax_from_soft_anneal", "soft_pre", "transformer_hard_dec_prenorm_small",
    CONVERSION_CURRICULUM,
    "hard_pre_argmax_from_soft with the soft-to-hard curriculum over its first "
    f"{CONVERSION_HALF_UPDATES} updates",
    **CONVERSION_SCHEDULE)
# sampling cooled into the argmax inside the conversion: the temperature falls
# from 1 to 0 over its first half
COOLED_CONVERSION = FineTune(
    "hard_pre_argmax_from_soft_cool", "soft_pre", "transformer_hard_dec_prenorm_small",
    f"--hard-cooling-updates {CONVERSION_HALF_UPDATES}",
    f"hard_pre_argmax_from_soft with sampling cooled into the argmax over its first {CONVERSION_HALF_UPDATES} updates",
    **CONVERSION_SCHEDULE)
# the conversion taught by the soft model it starts from (word-level
# distillation): no more training budget than the conversion
DISTILLED_CONVERSION = FineTune(
    "hard_pre_argmax_from_soft_kd", "soft_pre", "transformer_hard_dec_prenorm_small", DISTILLATION,
    f"hard_pre_argmax_from_soft with word-level distillation from soft_pre (α = {DISTILL_WEIGHT:g})",
    **CONVERSION_SCHEDULE, teacher="soft_pre")
# where the gap comes from: the conversion with hard retrieval in one decoder
# attention only, the other kept soft
SELF_ONLY_CONVERSION = FineTune(
    "hard_pre_self_from_soft", "soft_pre", "transformer_hard_dec_prenorm_small", "--dec-cross-attn-kind soft",
    "hard_pre_argmax_from_soft with hard retrieval in decoder self-attention only (cross-attention soft)",
    **CONVERSION_SCHEDULE)
CROSS_ONLY_CONVERSION = FineTune(
    "hard_pre_cross_from_soft", "soft_pre", "transformer_hard_dec_prenorm_small", "--dec-self-attn-kind soft",
    "hard_pre_argmax_from_soft with hard retrieval in decoder cross-attention only (self-attention soft)",
    **CONVERSION_SCHEDULE)
# a gentler conversion schedule: a peak lr of 3e-4 (a quarter of where a
# 60-epoch training ends), and its control continued soft the same way
GENTLE_CONVERSION = replace(
    HARD_PRE_ARGMAX_FROM_SOFT, name="hard_pre_argmax_from_soft_lr3e4", lr=3e-4,
    what="hard_pre_argmax_from_soft at a peak lr of 3e-4")
GENTLE_CONTROL = replace(SOFT_PRE_MORE, name="soft_pre_more_lr3e4", lr=3e-4,
                         what="soft_pre_more at a peak lr of 3e-4 (hard_pre_argmax_from_soft_lr3e4's control)")

def hard_epochs_at_dropout01(name: str, start: Run, what: str, penalised: bool = False,
                             preset_options: str = "") -> FineTune:
    """5 hard epochs (the conversion's schedule) from a dropout-0.1 run with its
    own options, plus ``preset_options``: those its preset sets and the hard
    preset does not (its heads); with the entropy penalty (ENTROPY_WEIGHT) or without it."""
    options = " ".join(filter(None, (start.flags, preset_options, ENTROPY_PENALTY if penalised else "")))
    return replace(HARD_PRE_ARGMAX_FROM_SOFT, name=name, start=start.name, flags=options,
                   what=what + (f", with the entropy penalty {ENTROPY_WEIGHT:g}" if penalised else ""))


def soft_epochs_from(name: str, start: Run, what: str) -> FineTune:
    """The control of a conversion of ``start``: the same 5 epochs, soft, with its own preset and options."""
    return replace(SOFT_PRE_MORE, name=name, start=start.name, arch=start.arch, flags=start.flags, what=what)


# the conversion of the dropout-0.1 soft model, plain and with the entropy
# penalty that sharpens the converted heads
DROP01_CONVERSIONS = (
    hard_epochs_at_dropout01("hard_pre_argmax_from_soft_drop01", SOFT_PRE_DROP01,
                             "soft_pre_drop01 converted as hard_pre_argmax_from_soft"),
    hard_epochs_at_dropout01("hard_pre_argmax_from_soft_drop01_entropy0003", SOFT_PRE_DROP01,
                             "soft_pre_drop01 converted as hard_pre_argmax_from_soft", penalised=True),
    soft_epochs_from("soft_pre_drop01_more", SOFT_PRE_DROP01,
                     "soft_pre_drop01, 5 more soft epochs (the control of its conversions)"),
)
# the same conversion of the 8-head soft model (whose hard twin loses least
# when decoded soft), with its own control
H8_CONVERSION = hard_epochs_at_dropout01("hard_pre_argmax_from_soft_drop01_h8", SOFT_PRE_DROP01_H8,
                                         "soft_pre_drop01_h8 converted as hard_pre_argmax_from_soft",
                                         preset_options=EIGHT_DECODER_HEADS)
H8_CONTROL = soft_epochs_from("soft_pre_drop01_h8_more", SOFT_PRE_DROP01_H8,
                              "soft_pre_drop01_h8, 5 more soft epochs (the control of its conversion)")
# the conversion with the curriculum preset's whole recipe (dropout 0.1, 8
# heads, the curriculum over the first half of its updates) from the
# curriculum's last soft seed, with its control: the preset a user converting
# would pick. Fine-tuned with three seeds (the first the parent's own; the
# third declared the last before it trained)
CURRICULUM_LAST_HARD, CURRICULUM_SOFT_PARENT = CURRICULUM_RESEEDS[-1]


# how the preset conversions go from soft to hard: (options, description)
ANNEAL_IN_CONVERSION = (CONVERSION_CURRICULUM, f"its curriculum over the first {CONVERSION_HALF_UPDATES} updates")


def sharpening_in_conversion(updates: int) -> Tuple[str, str]:
    """The sharpening curriculum over the first ``updates`` in place of the preset's anneal."""
    return (f"--hard-anneal-updates 0 --hard-sharpening-updates {updates}",
            f"the sharpening curriculum in place of its anneal, over the first {updates} updates")


def preset_conversion(parent: Run, seed: int, conversion_name: str, control_name: str,
                      curriculum: Tuple[str, str]) -> Tuple[FineTune, FineTune]:
    """``parent`` (a curriculum soft seed) converted with the curriculum preset
    going hard by ``curriculum``, fine-tuned with ``seed``, and its control:
    the same 5 epochs soft."""
    flags = f"{SOFT_PRE_DROP01_H8.flags} --seed {seed}"
    curriculum_options, curriculum_what = curriculum
    conversion = FineTune(
        conversion_name, parent.name,
        "transformer_hard_dec_anneal_small", f"{flags} {curriculum_options}",
        f"{parent.name} converted with the curriculum preset "
        f"(transformer_hard_dec_anneal_small), {curriculum_what} (seed {seed})",
        **CONVERSION_SCHEDULE)
    control = replace(soft_epochs_from(
        control_name, parent,
        f"{parent.name}, 5 more soft epochs (the control of its conversion; seed {seed})"),
        flags=flags)
    return conversion, control


PRESET_CONVERSION_SEEDS = (4, 5, 6)
PRESET_CONVERSIONS = tuple(
    preset_conversion(CURRICULUM_SOFT_PARENT, seed, f"hard_pre_argmax_from_soft_drop01_h8_anneal_s{seed}",
                      f"soft_pre_drop01_h8_more_s{seed}", ANNEAL_IN_CONVERSION)
    for seed in PRESET_CONVERSION_SEEDS)
# the same conversion from the curriculum's other soft seeds, each fine-tuned
# with its parent's seed beside its control: the three above share one
# parent, so their spread is the fine-tuning's, not the parent's (is that
# parent's gap typical?). Declared before they trained; seed 3 first
PARENT_SEEDS = (3, 2)
PARENT_CONVERSIONS = tuple(
    preset_conversion(reseeded(SOFT_PRE_DROP01_H8, seed), seed,
                      f"hard_pre_argmax_from_soft_drop01_h8_s{seed}_anneal", f"soft_pre_drop01_h8_s{seed}_more",
                      ANNEAL_IN_CONVERSION)
    for seed in PARENT_SEEDS)
# the seed-3 parent (retrained for its conversion), its conversion and control
RETRAINED_PARENT_SEED = PARENT_SEEDS[0]
RETRAINED_PARENT = reseeded(SOFT_PRE_DROP01_H8, RETRAINED_PARENT_SEED)
RETRAINED_CONVERSION, RETRAINED_CONTROL = PARENT_CONVERSIONS[0]
# that conversion and control with the seed-4 parent's other fine-tuning seeds
# (5, then 6): its one pair trailed further than that parent's (−1.20 / −1.53
# against −0.79 / −0.23 with the parent's own seed); is that the parent or the
# fine-tuning's spread? Each declared before it trained. Over three seeds
# −1.07 / −1.53 against that parent's −0.76 / −0.51 (HARD_PARITY.md)
PARENT_RESEEDED_CONVERSIONS = tuple(
    preset_conversion(RETRAINED_PARENT, seed, f"{RETRAINED_CONVERSION.name}_s{seed}",
                      f"{RETRAINED_CONTROL.name}_s{seed}", ANNEAL_IN_CONVERSION)
    for seed in PRESET_CONVERSION_SEEDS[1:])
# the preset conversion going hard by sharpening instead (--hard-sharpening-updates:
# every training row attends softly at a softmax temperature falling to the
# argmax, so the forward pass itself approaches retrieval where the anneal mixes
# soft and hard rows), over the first half of its updates or all of them (chosen
# on validation); from the seed-3 parent with its seed, against its control (the
# anneal's conversion there: −1.20 / −1.53). Declared before they trained. Both
# did worse than the anneal: −2.30 / −1.59 and −2.57 / −2.26 (HARD_PARITY.md)
SHARPENING_SPANS = (CONVERSION_HALF_UPDATES, 2 * CONVERSION_HALF_UPDATES)
SHARPENED_CONVERSIONS = tuple(
    preset_conversion(RETRAINED_PARENT, RETRAINED_PARENT_SEED,
                      f"hard_pre_argmax_from_soft_drop01_h8_s{RETRAINED_PARENT_SEED}_sharpen{updates}",
                      RETRAINED_CONTROL.name, sharpening_in_conversion(updates))[0]
    for updates in SHARPENING_SPANS)
# the preset conversion at the peak lr where its parent's training ended
# (0.004 · √(800 / 3,100) ≈ 2e-3) rather than half of it: its hard validation
# NLL still falls at its last epoch while its control's rises, and the 60-epoch
# conversion at 3e-4 trailed further than at 1e-3. Each with its control at the
# same lr; the same three seeds, declared before they trained. It did worse
# than at 1e-3, and its controls worse still (HARD_PARITY.md)
BRISK_LR = 2e-3
BRISK_LR_TAG = f"lr{BRISK_LR:.0e}".replace("e-0", "e")  # in the runs' names: lr2e3


def tagged(run: FineTune, seed: int, tag: str) -> str:
    """The name of ``run`` (fine-tuned with ``seed``, its name's suffix) with ``tag`` before its seed."""
    return f"{run.name.removesuffix(f'_s{seed}')}_{tag}_s{seed}"


BRISK_PRESET_CONVERSIONS = tuple(
    tuple(replace(run, name=tagged(run, seed, BRISK_LR_TAG), lr=BRISK_LR,
                  what=f"{run.name} at a peak lr of {BRISK_LR:g}")
          for run in pair)
    for seed, pair in zip(PRESET_CONVERSION_SEEDS, PRESET_CONVERSIONS))
DISTILL_TAG = "kd"  # in the distilled conversions' names


def distilled_preset_conversions(tag: str, weight: float, temperature, change: str,
                                 varies: str = "") -> Tuple[FineTune, ...]:
    """PRESET_CONVERSIONS' hard runs taught by CURRICULUM_SOFT_PARENT (word-level distillation, the
    teacher's term weighted ``weight``, at ``temperature``: None leaves the criterion's default),
    named with ``tag``, described as the same seed's run of the family tagged ``varies`` (none: the
    plain conversion) with ``change``."""
    temperature_option = "" if temperature is None else f" --distill-temperature {temperature:g}"
    return tuple(
        replace(conversion, name=tagged(conversion, seed, tag),
                flags=f"{conversion.flags} {distillation(weight)}{temperature_option}",
                teacher=CURRICULUM_SOFT_PARENT.name,
                what=f"{tagged(conversion, seed, varies) if varies else conversion.name} {change}")
        for seed, (conversion, _) in zip(PRESET_CONVERSION_SEEDS, PRESET_CONVERSIONS))


# the preset conversion taught by the soft parent it starts from (word-level
# distillation as DISTILLED_CONVERSION's): the parent's output distributions
# carry what the hard model loses when its attention changes under it, at no
# more training updates. Scored against the same seeds' controls (trained for
# PRESET_CONVERSIONS); the same three seeds, declared before they trained. Its
# NLL fell to the parent's, its BLEU rose only 0.13 / 0.04: outside 0.3 (HARD_PARITY.md)
DISTILLED_PRESET_CONVERSIONS = distilled_preset_conversions(
    DISTILL_TAG, DISTILL_WEIGHT, None,
    f"with word-level distillation from {CURRICULUM_SOFT_PARENT.name} (α = {DISTILL_WEIGHT:g})")
# the same at a distillation temperature of 2: at T = 1 the parent's peaked
# distributions may teach little beyond the references; softened, they rank
# the alternatives the parent weighs. The same three seeds and controls,
# declared before they trained. NLL lower still, BLEU −0.48 / −0.57 from the
# controls: no better than at T = 1 (HARD_PARITY.md)
WARM_DISTILL_TEMPERATURE = 2.0
WARM_DISTILL_TAG = f"kdt{WARM_DISTILL_TEMPERATURE:g}"  # in the runs' names: kdt2
WARM_DISTILLED_PRESET_CONVERSIONS = distilled_preset_conversions(
    WARM_DISTILL_TAG, DISTILL_WEIGHT, WARM_DISTILL_TEMPERATURE,
    f"at a distillation temperature of {WARM_DISTILL_TEMPERATURE:g}", varies=DISTILL_TAG)
# the same taught by the parent alone (α = 1: no reference term): the
# references may pull the hard model toward what its argmax attention finds easy,
# the parent toward what the soft model it must match predicts. At T = 2
# (nearest on validation); the same three seeds and controls, declared before
# they trained. NLL lower still, BLEU −1.00 / −0.39 from the controls:
# worse on validation than α = 0.5 (HARD_PARITY.md)
TEACHER_ONLY_WEIGHT = 1.0
TEACHER_ONLY_TAG = f"{WARM_DISTILL_TAG}w{TEACHER_ONLY_WEIGHT:g}"  # in the runs' names: kdt2w1
TEACHER_ONLY_PRESET_CONVERSIONS = distilled_preset_conversions(
    TEACHER_ONLY_TAG, TEACHER_ONLY_WEIGHT, WARM_DISTILL_TEMPERATURE,
    f"with the parent's term alone (α = {TEACHER_ONLY_WEIGHT:g})", varies=WARM_DISTILL_TAG)
# and the curriculum's own hard seed given the same 5 epochs hard (its
# curriculum done: the restarted update count would run it again): does the
# parity at 25 epochs hold where soft gains from 5 more?
CURRICULUM_HARD_MORE = hard_epochs_at_dropout01(
    "hard_pre_argmax_drop01_h8_anneal_more_s4", CURRICULUM_LAST_HARD,
    f"{CURRICULUM_LAST_HARD.name}, 5 more hard epochs", preset_options=EIGHT_DECODER_HEADS)
# the penalty on a trained hard model: its heads sharpened late, not from the
# start; against the same 5 epochs without it
HARD_DROP01_MORE = tuple(
    hard_epochs_at_dropout01(f"hard_pre_argmax_drop01_{suffix}", HARD_PRE_ARGMAX_DROP01,
                             "hard_pre_argmax_drop01, 5 more hard epochs", penalised)
    for suffix, penalised in (("more", False), ("sharpened", True)))

# bigger models than the small preset (trained on a GPU): is the hard-decoding
# cost a property of 4 heads of 32 dims? d = 256 keeps 4 heads, now of 64 dims;
# Base dims (6+6 layers, d = 512, 8 heads of 64: the paper's) take a peak lr
# for their size, and save no optimizer state (4x smaller epoch checkpoints)
WIDE_HEADS = ("--encoder-embed-dim 256 --decoder-embed-dim 256 "
              "--encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024")
BASE_RUN_FLAGS = "--lr 0.001 --no-save-optimizer-state"
HARD_PRE_ARGMAX_D256 = replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_d256", flags=WIDE_HEADS,
                               what="the parity recipe at d = 256 (4 heads of 64 dims, FFN 1024)")
SOFT_PRE_D256 = replace(SOFT_PRE, name="soft_pre_d256", flags=WIDE_HEADS,
                        what="soft_pre at d = 256 (hard_pre_argmax_d256's soft counterpart)")
HARD_PRE_ARGMAX_BASE = Run("hard_pre_argmax_base", "transformer_hard_dec_prenorm", BASE_RUN_FLAGS,
                           "the parity recipe at Transformer Base dims (6+6 layers, d = 512, "
                           "8 heads of 64), peak lr 0.001")
SOFT_PRE_BASE = Run("soft_pre_base", "transformer_soft_prenorm", BASE_RUN_FLAGS,
                    "soft_pre at Base dims (hard_pre_argmax_base's soft counterpart)")
# the recipe's conversion at those sizes, each beside its control (5 more
# soft epochs): does converting cost less where heads are wider (the paper's
# parity is at Base dims)? On a GPU, after their soft parents; declared before
# they trained
BIGGER_CONVERSIONS = tuple(
    (replace(HARD_PRE_ARGMAX_FROM_SOFT, name=f"{HARD_PRE_ARGMAX_FROM_SOFT.name}_{size}", start=soft.name,
             arch=hard.arch, flags=soft.flags,
             what=f"{soft.name} converted as hard_pre_argmax_from_soft ({hard.arch})"),
     soft_epochs_from(f"{SOFT_PRE_MORE.name}_{size}", soft,
                      f"{soft.name}, 5 more soft epochs (the control of its conversion)"))
    for size, hard, soft in (("d256", HARD_PRE_ARGMAX_D256, SOFT_PRE_D256),
                             ("base", HARD_PRE_ARGMAX_BASE, SOFT_PRE_BASE)))

FINETUNES = (
    FineTune("flexible_ft", "flexible", "transformer_flexible_small", GATE_LOSS,
             "flexible, fine-tuned 1 epoch with CE − 0.1·mean(g)"),
    # where decoding will look: attending only within the bands of τ (the paper's rule)
    FineTune("flexible_band_ft", "flexible", "transformer_flexible_small",
             GATE_LOSS + " --flexible-train-threshold",
             "flexible, fine-tuned as flexible_ft, attending only within the bands of τ = log₁₀ S̄"),
    FineTune("flexible_gate32_band_ft", "flexible_gate32", "transformer_flexible_small",
             "--flexible-gate-dim 32 " + GATE_LOSS + " --flexible-train-threshold",
             "flexible_gate32, fine-tuned as flexible_band_ft"),
    # the control of the fine-tunings' gain: the same epoch, plain loss
    FineTune("soft_ft", "soft", "transformer_soft_small", "",
             "soft, 1 more epoch as flexible_ft's (the control of its gain)"),
    # the same control on flexible itself: what the gate loss adds to the epoch
    FineTune("flexible_ce_ft", "flexible", "transformer_flexible_small", "",
             "flexible, 1 more epoch as flexible_ft's with the plain loss (the control of the gate loss)"),
    # the band fine-tuning with the conversions' schedule: 5 epochs, 2 averaged
    FineTune("flexible_band_5ep_ft", "flexible", "transformer_flexible_small",
             GATE_LOSS + " --flexible-train-threshold",
             "flexible_band_ft for 5 epochs (warmup 100, the last 2 averaged)",
             **CONVERSION_SCHEDULE),
    HARD_PRE_FROM_SOFT,
    HARD_PRE_ARGMAX_FROM_SOFT,
    # the conversions and their control with another fine-tuning seed (dropout,
    # batch order): the noise
    reseeded(HARD_PRE_ARGMAX_FROM_SOFT, 2),
    reseeded(SOFT_PRE_MORE, 2),
    SOFT_PRE_MORE,
    # a third seed of the recipe's conversion with its own control, both from the
    # retrained soft_pre (the seed-2 control continued the lost one)
    reseeded(HARD_PRE_ARGMAX_FROM_SOFT, 3),
    reseeded(SOFT_PRE_MORE, 3),
    reseeded(HARD_PRE_FROM_SOFT, 3),
    reseeded(CURRICULUM_CONVERSION, 3),
    reseeded(CURRICULUM_CONVERSION, 4),
    reseeded(SOFT_PRE_MORE, 4),
    DISTILLED_CONVERSION,
    reseeded(DISTILLED_CONVERSION, 2),
    COOLED_CONVERSION,
    reseeded(COOLED_CONVERSION, 2),
    SELF_ONLY_CONVERSION,
    reseeded(SELF_ONLY_CONVERSION, 2),
    CROSS_ONLY_CONVERSION,
    reseeded(CROSS_ONLY_CONVERSION, 2),
    GENTLE_CONVERSION,
    GENTLE_CONTROL,
    *DROP01_CONVERSIONS,
    *HARD_DROP01_MORE,
    H8_CONVERSION,
    H8_CONTROL,
    *(run for pair in PRESET_CONVERSIONS for run in pair),
    *(run for pair in PARENT_CONVERSIONS for run in pair),
    *(run for pair in PARENT_RESEEDED_CONVERSIONS for run in pair),
    *SHARPENED_CONVERSIONS,
    *(run for pair in BIGGER_CONVERSIONS for run in pair),
    CURRICULUM_HARD_MORE,
    *(run for pair in BRISK_PRESET_CONVERSIONS for run in pair),
    *DISTILLED_PRESET_CONVERSIONS,
    *WARM_DISTILLED_PRESET_CONVERSIONS,
    *TEACHER_ONLY_PRESET_CONVERSIONS,
    # the conversion and its control on soft_pre's own translations (sequence-level distillation)
    replace(HARD_PRE_ARGMAX_FROM_SOFT, name="hard_pre_argmax_from_soft_seqkd", corpus="soft_pre",
            what="hard_pre_argmax_from_soft on soft_pre's translations of the training set"),
    replace(SOFT_PRE_MORE, name="soft_pre_more_seqkd", corpus="soft_pre",
            what="soft_pre_more on soft_pre's translations of the training set "
                 "(hard_pre_argmax_from_soft_seqkd's control)"),
)

def decoded_with(run: str, kind: str) -> Decode:
    """``run`` decoded with ``kind`` attention in decoder self- and cross-attention."""
    return Decode(f"{run}_decoded_{kind}", run, {"soft": SOFT_KINDS, "hard": HARD_KINDS}[kind],
                  f"the `{run}` checkpoint decoded with {kind} decoder attention (Table 4)")


# top-k retrieval attention (issue 61): each decoder head attends softly to its
# k best keys; k = 1 is hard retrieval with an argmax
TOPK_DECODE_KS = (1, 2, 4, 8)
TOPK_TRAIN_KS = (2, 4)


def decoded_with_topk(run: str, k: int) -> Decode:
    """``run`` decoded with top-k retrieval (``k`` keys per head) in decoder self- and cross-attention."""
    return Decode(f"{run}_decoded_top{k}", run,
                  {"dec_self_attn_kind": "topk", "dec_cross_attn_kind": "topk", "retrieval_k": k},
                  f"the `{run}` checkpoint decoded with top-{k} retrieval in decoder attention")


def topk_run(k: int) -> Run:
    """The parity recipe's settings (pre-norm) with top-k retrieval in decoder self- and cross-attention."""
    return Run(f"topk{k}_pre", "transformer_topk_dec_small", f"--retrieval-k {k}",
               f"top-{k} retrieval attention in decoder self- and cross-attention, pre-norm layers "
               "(soft_pre's and hard_pre_argmax's recipe)")


# trained as soft_pre / hard_pre_argmax and their seed-2 runs, beside them
TOPK_RUNS = tuple(run for k in TOPK_TRAIN_KS for run in (topk_run(k), reseeded(topk_run(k), 2)))


def searched_with(run: str, beam: int, lenpen: float) -> Decode:
    """``run`` decoded with beam ``beam`` and length penalty ``lenpen``."""
    return Decode(f"{run}_beam{beam}_lenpen{lenpen:g}".replace(".", "p"), run,
                  what=f"the `{run}` checkpoint decoded with beam {beam}, length penalty {lenpen:g}",
                  search=f"--beam {beam} --lenpen {lenpen:g}")


# beam search's settings chosen on validation for hard and soft alike (issue
# 18): each (hard, soft) pair decoded over the grid, the recipe's own setting
# (beam 4, fairseq's length penalty 1) first. The seed-3 parent's preset
# conversion with its control too: its outputs are 2-3 % shorter than the
# control's (declared after its beam-4 scores, before these decodes). Chosen
# on validation: −1.06 / −0.70, not within 0.3 (HARD_PARITY.md); then its
# other two fine-tuning seeds' pairs, declared before they decoded
SEARCH_PAIRS = (("hard_pre_argmax_drop01", "soft_pre_drop01"), ("hard_pre_argmax_drop01_s2", "soft_pre_drop01_s2"),
                ("hard_pre_argmax_drop01_h8", "soft_pre_drop01_h8"),
                (HARD_PRE_ARGMAX_DROP01_H8_S2.name, SOFT_PRE_DROP01_H8_S2.name),
                *CURRICULUM_PAIRS, ("hard_pre_argmax_drop02_h8_anneal", "soft_pre_drop02_h8"),
                (RETRAINED_CONVERSION.name, RETRAINED_CONTROL.name),
                *((conversion.name, control.name) for conversion, control in PARENT_RESEEDED_CONVERSIONS))
SEARCH_GRID = tuple((beam, lenpen) for beam in (4, 8) for lenpen in (1.0, 0.6, 1.5, 2.0))
# each run searched once, though a soft run may pair with several hard ones
SEARCHES = tuple(searched_with(run, beam, lenpen)
                 for run in dict.fromkeys(run for pair in SEARCH_PAIRS for run in pair)
                 for beam, lenpen in SEARCH_GRID)

_FLEXIBLE = ("flexible", "flexible_ft", "flexible_band_ft", "flexible_gate32", "flexible_gate32_band_ft",
             "flexible_ce_ft", "flexible_band_5ep_ft")
DECODES = (
    # what users have today: the soft checkpoint decoded by fairseq's own Transformer
    Decode("fairseq", "soft", {"_name": "transformer"},
           "the soft checkpoint decoded by fairseq's own transformer (the peer)"),
    # and the curriculum's soft counterpart decoded by it (the peer of its speed benchmark)
    Decode("fairseq_h8", SOFT_PRE_DROP01_H8.name, {"_name": "transformer"},
           f"the {SOFT_PRE_DROP01_H8.name} checkpoint decoded by fairseq's own transformer (the peer)"),
    # the paper's Table 4: a model decoded with the other attention kind
    *(decoded_with(run, "hard") for run in ("soft", "soft_pre", "soft_pre_drop01", "soft_pre_drop01_s2",
                                            *(soft for _, soft in CURRICULUM_PAIRS), "soft_pre_drop02_h8")),
    *(decoded_with(run, "soft") for run in ("hard", "hard_pre", "hard_pre_argmax", "hard_pre_argmax_drop01",
                                            "hard_pre_argmax_drop01_s2", "hard_pre_argmax_drop01_h8",
                                            HARD_PRE_ARGMAX_DROP01_H8_S2.name, H8_CONVERSION.name,
                                            *(hard for hard, _ in CURRICULUM_PAIRS),
                                            "hard_pre_argmax_drop02_h8_anneal",
                                            "hard_pre_argmax_from_soft_drop01",
                                            "hard_pre_argmax_from_soft_drop01_entropy0003",
                                            "hard_pre_argmax_drop02_entropy0003")),
    # which of the two hard attentions costs the hard-trained model its BLEU
    *(Decode(f"hard_pre_argmax_drop01_hard_{hard}_only", "hard_pre_argmax_drop01", {f"dec_{soft}_attn_kind": "soft"},
             f"hard_pre_argmax_drop01 decoded with hard {hard}-attention, soft {soft}-attention")
      for hard, soft in (("self", "cross"), ("cross", "self"))),
    # fairseq's own cross+self decodes the cross_self checkpoint (identical training)
    Decode("fairseq_cross_self", "cross_self", {"_name": "transformer"},
           "fairseq's own cross+self attention (the peer; same trained weights as cross_self)"),
    *(Decode(f"{run}_inf", run, {"flexible_threshold": "inf"}, cps=True) for run in _FLEXIBLE),
    *(Decode(f"{run}_auto", run, cps=True) for run in _FLEXIBLE),
    *(Decode(f"{run}_tau075", run, {"flexible_threshold": 0.75}, cps=True)
      for run in _FLEXIBLE if run.endswith("_ft")),
    Decode("local_cps", "local", cps=True),
    *SEARCHES,
    # decoding-time k on models trained soft and hard (Table 4, one step further)
    *(decoded_with_topk(run, k) for run in ("soft_pre", "hard_pre_argmax") for k in TOPK_DECODE_KS),
)

# the ablation toward hard/soft parity (issue 18): trained with the same
# budget as every run; hard and soft variants side by side. The _prenorm
# presets are the plain ones with --encoder-normalize-before
# --decoder-normalize-before (the same models: tests/test_models.py)
HARD_PRE_COOL = Run("hard_pre_cool", "transformer_hard_dec_prenorm_small", "--hard-cooling-updates 1500",
                    "hard, pre-norm, sampling cooled into the argmax over the first 1500 updates (~half)")
HARD_PRE_ARGMAX_DROP02 = replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_drop02", flags="--dropout 0.2",
                                 what="the parity recipe with dropout 0.2 (the recipe: 0.3)")
SOFT_PRE_DROP02 = replace(SOFT_PRE, name="soft_pre_drop02", flags="--dropout 0.2",
                          what="soft_pre with dropout 0.2 (hard_pre_argmax_drop02's soft counterpart)")
# the curriculum with 8 heads at dropout 0.2, the dropout at which soft is best
# on validation: does the curriculum's gain carry to the soft recipe one would choose?
HARD_PRE_ARGMAX_DROP02_H8_ANNEAL = replace(
    HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, name="hard_pre_argmax_drop02_h8_anneal", flags=HARD_PRE_ARGMAX_DROP02.flags,
    what="the parity recipe with dropout 0.2, 8 decoder heads and the soft-to-hard curriculum "
         f"over the first {CURRICULUM_UPDATES} updates (~half)")
SOFT_PRE_DROP02_H8 = replace(SOFT_PRE_DROP01_H8, name="soft_pre_drop02_h8", flags=SOFT_PRE_DROP02.flags,
                             what="soft_pre with dropout 0.2 and 8 decoder heads "
                                  "(hard_pre_argmax_drop02_h8_anneal's soft counterpart)")
# cross+self with the parity recipe's pre-norm layers (target: within 0.3 of soft_pre)
CROSS_SELF_PRE = Run("cross_self_pre", "transformer_cross_self_small",
                     "--encoder-normalize-before --decoder-normalize-before",
                     "cross+self attention with pre-norm layers (soft counterpart: soft_pre)")
# and at dropout 0.1, where hard retrieval narrowed its gap: does cross+self?
CROSS_SELF_PRE_DROP01 = replace(CROSS_SELF_PRE, name="cross_self_pre_drop01",
                                flags=f"{CROSS_SELF_PRE.flags} {SOFT_PRE_DROP01.flags}",
                                what="cross+self attention with pre-norm layers and dropout 0.1 "
                                     "(soft counterpart: soft_pre_drop01)")
CROSS_SELF_PRE_DROP01_S2 = reseeded(CROSS_SELF_PRE_DROP01, 2)
# a third seed of each: two seeds met the cross+self target on validation
# (+0.13 mean) but not on test2016 (-0.33 mean)
CROSS_SELF_PRE_DROP01_S3 = reseeded(CROSS_SELF_PRE_DROP01, 3)
SOFT_PRE_DROP01_S2 = reseeded(SOFT_PRE_DROP01, 2)
SOFT_PRE_DROP01_S3 = reseeded(SOFT_PRE_DROP01, 3)
# cross+self at dropout 0.1's three seeds, each with the soft run of its seed, by name
CROSS_SELF_DROP01_PAIRS = tuple((cross_self.name, soft.name) for cross_self, soft in (
    (CROSS_SELF_PRE_DROP01, SOFT_PRE_DROP01), (CROSS_SELF_PRE_DROP01_S2, SOFT_PRE_DROP01_S2),
    (CROSS_SELF_PRE_DROP01_S3, SOFT_PRE_DROP01_S3)))
# and at dropout 0.2, the soft recipe best on validation (soft_pre_drop02)
CROSS_SELF_PRE_DROP02 = replace(CROSS_SELF_PRE, name="cross_self_pre_drop02",
                                flags=f"{CROSS_SELF_PRE.flags} {SOFT_PRE_DROP02.flags}",
                                what="cross+self attention with pre-norm layers and dropout 0.2 "
                                     "(soft counterpart: soft_pre_drop02)")
# the hard-trained heads keep only ~0.6 of their softmax mass on the key they
# retrieve (teacher-forced, validation): the straight-through gradient assumes
# P·V where the forward takes V[argmax]. An entropy penalty sharpens P
HARD_PRE_ARGMAX_DROP02_ENTROPY = replace(
    HARD_PRE_ARGMAX_DROP02, name="hard_pre_argmax_drop02_entropy0003",
    flags=f"{HARD_PRE_ARGMAX_DROP02.flags} {ENTROPY_PENALTY}",
    what=f"the parity recipe with dropout 0.2 and an entropy penalty of {ENTROPY_WEIGHT:g} on its "
         "hard heads' training distributions")  # 0.01: stopped after 6 epochs, learning slower still
# where the gap comes from, trained from scratch: hard retrieval in decoder
# self-attention only (the conversion closest to parity), cross-attention soft
HARD_PRE_SELF = replace(HARD_PRE_ARGMAX, name="hard_pre_self", flags="--dec-cross-attn-kind soft",
                        what="the parity recipe with hard retrieval in decoder self-attention only "
                             "(cross-attention soft)")
PARITY_RUNS = (
    Run("hard_pre", "transformer_hard_dec_prenorm_small", "--hard-train-retrieval sample",
        "hard, pre-norm, keys sampled in training (the paper's)"),
    Run("hard_pre_anneal", "transformer_hard_dec_prenorm_small",
        f"--hard-train-retrieval sample {CURRICULUM}",
        f"hard, pre-norm, soft-to-hard curriculum over the first {CURRICULUM_UPDATES} updates (~half)"),
    HARD_PRE_COOL,
    reseeded(HARD_PRE_COOL, 2),
    Run("hard_pre_h8", "transformer_hard_dec_prenorm_small",
        "--hard-train-retrieval sample --decoder-attention-heads 8",
        "hard, pre-norm, 8 decoder heads (of 16 dims)"),
    Run("soft_pre_h8", "transformer_soft_prenorm_small", "--decoder-attention-heads 8",
        "soft, pre-norm, 8 decoder heads"),
    # the recipe and its soft counterpart with a second training seed: the gap's noise
    reseeded(HARD_PRE_ARGMAX, 2),
    reseeded(SOFT_PRE, 2),
    # is hard retrieval held back by the recipe's regularisation? (its training
    # loss stays above soft's)
    HARD_PRE_ARGMAX_DROP02,
    SOFT_PRE_DROP02,
    reseeded(HARD_PRE_ARGMAX_DROP02, 2),
    reseeded(SOFT_PRE_DROP02, 2),
    HARD_PRE_SELF,
    reseeded(HARD_PRE_SELF, 2),
    HARD_PRE_ARGMAX_DROP01,
    SOFT_PRE_DROP01,
    reseeded(HARD_PRE_ARGMAX_DROP01, 2),
    SOFT_PRE_DROP01_S2,
    HARD_PRE_ARGMAX_DROP01_H8,
    HARD_PRE_ARGMAX_DROP01_H8_S2,
    SOFT_PRE_DROP01_H8_S2,
    HARD_PRE_ARGMAX_DROP01_H8_ANNEAL_S2,
    *(run for pair in CURRICULUM_RESEEDS for run in pair),
    HARD_PRE_ARGMAX_DROP02_H8_ANNEAL,
    SOFT_PRE_DROP02_H8,
    CROSS_SELF_PRE,
    reseeded(CROSS_SELF_PRE, 2),
    CROSS_SELF_PRE_DROP01,
    CROSS_SELF_PRE_DROP01_S2,
    CROSS_SELF_PRE_DROP01_S3,
    SOFT_PRE_DROP01_S3,
    CROSS_SELF_PRE_DROP02,
    HARD_PRE_ARGMAX_DROP02_ENTROPY,
    HARD_PRE_ARGMAX_D256,
    SOFT_PRE_D256,
    HARD_PRE_ARGMAX_BASE,
    SOFT_PRE_BASE,
    # sequence-level distillation (Kim and Rush, 2016): soft_pre's beam
    # translations of the training sources replace the references, for the
    # hard recipe and its soft counterpart alike
    replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_seqkd", corpus="soft_pre",
            what="the parity recipe trained on soft_pre's translations of the training set "
                 "(sequence-level distillation)"),
    replace(SOFT_PRE, name="soft_pre_seqkd", corpus="soft_pre",
            what="soft_pre's recipe trained on soft_pre's translations of the training set "
                 "(hard_pre_argmax_seqkd's soft counterpart)"),
    *TOPK_RUNS,
)
# every run trained from scratch, and with its fine-tunings every trained run
FROM_SCRATCH = RUNS + PARITY_RUNS
TRAINED = FROM_SCRATCH + FINETUNES

# the recipe's conversion (soft_pre + 5 hard epochs, 20 % of its updates) with
# three fine-tuning seeds, each against 5 more soft epochs with its seed
CONVERSION_PAIRS = tuple((hard.name, soft.name) for hard, soft in (
    (HARD_PRE_ARGMAX_FROM_SOFT, SOFT_PRE_MORE),
    *((reseeded(HARD_PRE_ARGMAX_FROM_SOFT, seed), reseeded(SOFT_PRE_MORE, seed)) for seed in (2, 3))))


def against_controls_and_parent(conversions):
    """Pairs of CURRICULUM_SOFT_PARENT's conversions (one per PRESET_CONVERSION_SEEDS seed, in
    order) with their seeds' soft controls, then with the parent itself."""
    conversions = tuple(conversions)
    return (*((conversion.name, control.name) for conversion, (_, control) in zip(conversions, PRESET_CONVERSIONS)),
            *((conversion.name, CURRICULUM_SOFT_PARENT.name) for conversion in conversions))


# (hard or cross+self run, its soft counterpart: the same recipe) for the gap column
PARITY_PAIRS = (("hard", "soft"), ("hard_pre", "soft_pre"), ("hard_pre_argmax", "soft_pre"),
                ("hard_pre_anneal", "soft_pre"), ("hard_pre_h8", "soft_pre_h8"),
                ("hard_pre_from_soft", "soft_pre"), ("hard_pre_from_soft", "soft_pre_more"),
                ("hard_pre_argmax_from_soft", "soft_pre"), CONVERSION_PAIRS[0], CONVERSION_PAIRS[1],
                ("hard_pre_argmax_from_soft_kd", "soft_pre"),
                ("hard_pre_argmax_from_soft_kd", "soft_pre_more"),
                ("hard_pre_argmax_from_soft_kd_s2", "soft_pre"),
                CONVERSION_PAIRS[2],
                ("hard_pre_from_soft_s3", "soft_pre_more_s3"),
                ("hard_pre_argmax_from_soft_anneal_s3", "soft_pre_more_s3"),
                ("hard_pre_argmax_from_soft_anneal_s4", "soft_pre_more_s4"),
                ("hard_pre_argmax_s2", "soft_pre_s2"),
                ("hard_pre_cool", "soft_pre"), ("hard_pre_cool_s2", "soft_pre_s2"),
                ("hard_pre_argmax_from_soft_cool", "soft_pre_more"),
                ("hard_pre_argmax_from_soft_cool_s2", "soft_pre_more_s2"),
                ("hard_pre_self_from_soft", "soft_pre_more"), ("hard_pre_self_from_soft_s2", "soft_pre_more_s2"),
                ("hard_pre_cross_from_soft", "soft_pre_more"),
                ("hard_pre_cross_from_soft_s2", "soft_pre_more_s2"),
                ("hard_pre_argmax_from_soft_lr3e4", "soft_pre_more_lr3e4"),
                ("hard_pre_argmax_drop02", "soft_pre_drop02"), ("hard_pre_argmax_drop02", "soft_pre"),
                ("hard_pre_argmax_drop02_s2", "soft_pre_drop02_s2"),
                (HARD_PRE_ARGMAX_D256.name, SOFT_PRE_D256.name),
                (HARD_PRE_ARGMAX_BASE.name, SOFT_PRE_BASE.name),
                *((conversion.name, against) for conversion, control in BIGGER_CONVERSIONS
                  for against in (control.name, conversion.start)),
                ("hard_pre_self", "soft_pre"), ("hard_pre_self_s2", "soft_pre_s2"),
                ("hard_pre_argmax_drop01", "soft_pre_drop01"),
                (HARD_PRE_ARGMAX_DROP02_ENTROPY.name, "soft_pre_drop02"),
                *((conversion.name, "soft_pre_drop01_more") for conversion in DROP01_CONVERSIONS[:2]),
                *((run.name, "soft_pre_drop01_more") for run in HARD_DROP01_MORE),
                ("hard_pre_argmax_drop01_s2", "soft_pre_drop01_s2"),
                (HARD_PRE_ARGMAX_DROP01_H8.name, SOFT_PRE_DROP01_H8.name),
                (HARD_PRE_ARGMAX_DROP01_H8_S2.name, SOFT_PRE_DROP01_H8_S2.name),
                (HARD_PRE_ARGMAX_DROP01_H8.name, SOFT_PRE_DROP01.name),
                *CURRICULUM_PAIRS,
                (HARD_PRE_ARGMAX_DROP02_H8_ANNEAL.name, SOFT_PRE_DROP02_H8.name),
                (HARD_PRE_ARGMAX_DROP02_H8_ANNEAL.name, SOFT_PRE_DROP02.name),
                (H8_CONVERSION.name, H8_CONTROL.name), (H8_CONVERSION.name, SOFT_PRE_DROP01_H8.name),
                *against_controls_and_parent(conversion for conversion, _ in PRESET_CONVERSIONS),
                # against their controls only: their parents were retrained for them, and the
                # seed-3 retrain did not reproduce the parent's committed record (HARD_PARITY.md)
                *((conversion.name, control.name) for conversion, control in PARENT_CONVERSIONS),
                *((conversion.name, control.name) for conversion, control in PARENT_RESEEDED_CONVERSIONS),
                *((conversion.name, RETRAINED_CONTROL.name) for conversion in SHARPENED_CONVERSIONS),
                (CURRICULUM_HARD_MORE.name, PRESET_CONVERSIONS[0][1].name),
                *((conversion.name, control.name) for conversion, control in BRISK_PRESET_CONVERSIONS),
                *((brisk.name, control.name) for (brisk, _), (_, control) in zip(BRISK_PRESET_CONVERSIONS,
                                                                              PRESET_CONVERSIONS)),
                *against_controls_and_parent(DISTILLED_PRESET_CONVERSIONS),
                *against_controls_and_parent(WARM_DISTILLED_PRESET_CONVERSIONS),
                *against_controls_and_parent(TEACHER_ONLY_PRESET_CONVERSIONS),
                ("hard_pre_argmax_seqkd", "soft_pre_seqkd"), ("hard_pre_argmax_seqkd", "soft_pre"),
                ("hard_pre_argmax_from_soft_seqkd", "soft_pre_more_seqkd"),
                ("hard_pre_argmax_from_soft_seqkd", "soft_pre"),
                # cross+self against soft (the parity target with its fewer parameters)
                ("cross_self", "soft"), ("cross_self_pre", "soft_pre"),
                ("cross_self_pre_s2", "soft_pre_s2"),
                *CROSS_SELF_DROP01_PAIRS, (CROSS_SELF_PRE_DROP01.name, SOFT_PRE.name),
                (CROSS_SELF_PRE_DROP02.name, SOFT_PRE_DROP02.name))


@dataclass(frozen=True)
class Target:
    """One of issue 18's targets, judged on the mean over seeds of run BLEU
    minus its soft counterpart's (beam 4): met where that gap is at least
    ``bound`` (within 0.3: -0.3), or, for a ``drop``, at most ``bound``."""
    claim: str
    pairs: Tuple[Tuple[str, str], ...]
    bound: float
    drop: bool = False

    def met(self, gap: float) -> bool:
        return gap <= self.bound if self.drop else gap >= self.bound


PARITY_TARGETS = (
    Target("hard within 0.3 of soft trained alike: the curriculum preset at dropout 0.1 "
           "(`transformer_hard_dec_anneal_small`) against its soft counterpart "
           "(`transformer_soft_prenorm_h8_small`)", CURRICULUM_PAIRS, -0.3),
    Target("soft-trained, hard-decoded drops at least 1: those soft counterparts decoded with hard attention",
           tuple((decoded_with(soft, "hard").name, soft) for _, soft in CURRICULUM_PAIRS), -1.0, drop=True),
    Target("cross+self (final) within 0.3 of soft trained alike: pre-norm, dropout 0.1",
           CROSS_SELF_DROP01_PAIRS, -0.3),
    Target("a soft checkpoint converted to hard in 20 % of its updates within 0.3: the recipe's conversion "
           "against 5 more soft epochs", CONVERSION_PAIRS, -0.3),
)

# rows of the main table after the runs: fine-tunings and Table-4 switches, in this order
TABLE_EXTRA_ROWS = ("fairseq", "fairseq_h8", "hard_pre_argmax_from_soft", "hard_pre_argmax_from_soft_kd",
                    "hard_pre_from_soft", "soft_pre_more",
                    "soft_decoded_hard", "hard_decoded_soft", "soft_pre_decoded_hard",
                    "hard_pre_argmax_decoded_soft", "fairseq_cross_self",
                    "flexible_ft", "flexible_band_ft", "flexible_gate32_band_ft", "soft_ft",
                    "flexible_ce_ft", "flexible_band_5ep_ft")

CPS_ROWS = (  # the flexible-attention paper's Table 1: (result name, what)
    ("soft", "global attention (soft baseline)"),
    ("local_cps", "local attention (Luong local-p, D=10)"),
    ("flexible_inf", "flexible attention, τ = ∞ (no skipping)"),
    ("flexible_auto", "flexible attention, τ = log₁₀ S̄ (the paper's rule)"),
    ("flexible_ce_ft_inf", "+ 1 epoch with the plain loss (the gate loss's control), τ = ∞"),
    ("flexible_ce_ft_auto", "+ 1 epoch with the plain loss, τ = log₁₀ S̄"),
    ("flexible_ft_inf", "+ fine-tuning with the gate loss, τ = ∞"),
    ("flexible_ft_auto", "+ fine-tuning with the gate loss, τ = log₁₀ S̄"),
    ("flexible_ft_tau075", "+ fine-tuning with the gate loss, τ = 0.75"),
    ("flexible_band_ft_inf", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = ∞"),
    ("flexible_band_ft_auto", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = log₁₀ S̄"),
    ("flexible_band_ft_tau075", "+ fine-tuning within the bands of τ = log₁₀ S̄, decoded with τ = 0.75"),
    ("flexible_band_5ep_ft_inf", "+ the same fine-tuning for 5 epochs (2 averaged), τ = ∞"),
    ("flexible_band_5ep_ft_auto", "+ the same fine-tuning for 5 epochs, τ = log₁₀ S̄"),
    ("flexible_band_5ep_ft_tau075", "+ the same fine-tuning for 5 epochs, τ = 0.75"),
    ("flexible_gate32_inf", "flexible attention with a 32-unit gate network (d/4), τ = ∞"),
    ("flexible_gate32_auto", "flexible attention with a 32-unit gate network, τ = log₁₀ S̄"),
    ("flexible_gate32_band_ft_inf", "+ fine-tuning within the bands, decoded with τ = ∞"),
    ("flexible_gate32_band_ft_auto", "+ fine-tuning within the bands, decoded with τ = log₁₀ S̄"),
    ("flexible_gate32_band_ft_tau075", "+ fine-tuning within the bands, decoded with τ = 0.75"),
    ("soft_ft", "global attention, 1 more epoch as the fine-tuning's (its control)"),
)


@dataclass(frozen=True)
class Benchmark:
    """``scripts/benchmark_decoding.py`` (its ``--json``/``--markdown`` go to
    results/NAME.*) with ``args`` (split at spaces: no argument holds one), on ``models`` (trained runs, or decodes: a
    run with overrides; each one only if trained) and the binarized data when
    ``data``."""
    name: str
    what: str
    args: str
    models: Tuple[str, ...] = ()
    data: bool = False


_TRAINED = ("fairseq",) + tuple(run.name for run in RUNS) + (
    "flexible_ft", "flexible_band_ft", "flexible_gate32_band_ft", "fairseq_cross_self")
_SMALL_TEST = "--beam 4 --batch-size 64 --max-sentences 384 --fixed-output-len 20 --reps 5 --threads 1"


def _base_test(reps=3):
    """The Base-dims benchmarks' decoding settings: 128 test sources, 20 output tokens."""
    return (f"--beam 4 --batch-size 64 --max-sentences 128 --fixed-output-len 20 --reps {reps} "
            "--threads 1 --sublayer-times")


# the Base-dims benchmarks' baseline and fairseq's own model beside it
_BASE_PEERS = "--arch soft=transformer_soft --arch fairseq=transformer"
_BASE_PARITY_ARCHS = (f"{_BASE_PEERS} --arch hard=transformer_hard_dec "
                      "--arch soft_pre=transformer_soft_prenorm "
                      "--arch hard_pre_argmax=transformer_hard_dec_prenorm")
_BASE_WINDOWED = f"{_BASE_PEERS} --arch local=transformer_local --arch flexible=transformer_flexible"
BENCHMARKS = (
    # the trained checkpoints, the test set, 20 output tokens for every model:
    # the cost of the mechanisms, not of how long each model's translations are
    Benchmark("speed_small", "decoding and training speed, small preset, the trained checkpoints",
              f"--baseline soft {_SMALL_TEST} --train-batches 6 --sublayer-times", _TRAINED, True),
    Benchmark("speed_small_flexible",
              "the flexible family at the small preset, Multi30k test, the trained checkpoints "
              "(the band-trained ones also at τ = 0.75)",
              f"--baseline soft {_SMALL_TEST} --sublayer-times",
              ("soft", "fairseq", "soft_ft", "local", "flexible", "flexible_ft", "flexible_band_ft",
               "flexible_gate32", "flexible_gate32_band_ft", "flexible_band_ft_tau075",
               "flexible_gate32_band_ft_tau075"), True),
    # the parity recipe's presets (issue 18), trained after speed_small was measured,
    # with the same settings beside soft, fairseq and hard
    Benchmark("speed_small_parity", "speed_small's settings for the parity presets beside soft, "
              "fairseq and hard (trained later)",
              f"--baseline soft {_SMALL_TEST} --train-batches 6 --sublayer-times",
              ("soft", "fairseq", "hard", "soft_pre", "hard_pre_argmax"), True),
    # the curriculum (8 heads) beside its soft counterpart, that checkpoint in
    # fairseq's own transformer, and the 4-head parity presets at the same dropout
    Benchmark("speed_small_curriculum", "speed_small's settings for the curriculum's 8-head "
              "presets beside fairseq and the 4-head parity presets (trained later)",
              f"--baseline {SOFT_PRE_DROP01_H8.name} {_SMALL_TEST} --train-batches 6 --sublayer-times",
              (SOFT_PRE_DROP01_H8.name, "fairseq_h8", HARD_PRE_ARGMAX_DROP01_H8_ANNEAL.name,
               SOFT_PRE_DROP01.name, HARD_PRE_ARGMAX_DROP01.name), True),
    # hard retrieval in decoder self-attention only: what it keeps of the recipe's speed
    Benchmark("speed_small_self_only", "speed_small's settings: hard retrieval in decoder "
              "self-attention only beside the parity recipe and soft_pre",
              f"--baseline soft_pre {_SMALL_TEST} --train-batches 6 --sublayer-times",
              ("soft_pre", "hard_pre_argmax", "hard_pre_self"), True),
    # trained gates and centres on 100-token sources: where skipping can pay
    Benchmark("speed_small_long_sources", "small preset, the trained checkpoints, 100-token sources",
              "--baseline soft --src-len 100 --num-sentences 128 --batch-size 64 "
              "--fixed-output-len 20 --beam 4 --reps 5 --threads 1 --sublayer-times",
              ("soft", "fairseq", "local", "flexible", "flexible_ft", "flexible_band_ft",
               "flexible_gate32_band_ft", "hard"), True),
    # Transformer Base dims, random weights, the test sources, 20 generated tokens each
    Benchmark("speed_base", "decoding speed at Transformer Base dims (random weights)",
              f"{_BASE_PEERS} --arch hard=transformer_hard_dec "
              "--arch cross_self=transformer_cross_self --arch fairseq_cross_self=transformer "
              "--override fairseq_cross_self={'cross_self_attention':True,'no_cross_attention':True} "
              "--arch hard_cross_self=transformer_hard_cross_self --arch aan=transformer_aan "
              "--arch aan_no_ffn=transformer_aan --override aan_no_ffn={'aan_ffn_dim':0} "
              "--arch local=transformer_local --arch flexible=transformer_flexible "
              "--override flexible={'flexible_mean_source_length':14.4} "
              f"--baseline soft {_base_test()}", data=True),
    # the parity recipe's presets at Base dims (8 heads there, as the curriculum's),
    # measured later, with the same settings beside soft, fairseq and hard
    Benchmark("speed_base_parity", "speed_base's settings for the parity presets (pre-norm) beside "
              "soft, fairseq and hard (measured later)",
              f"{_BASE_PARITY_ARCHS} --baseline soft {_base_test()}", data=True),
    # its 3 repetitions left the pre-norm pair inside this VM's noise (min-max overlapping)
    Benchmark("speed_base_parity_7reps", "speed_base_parity with 7 repetitions instead of 3",
              f"{_BASE_PARITY_ARCHS} --baseline soft {_base_test(reps=7)}", data=True),
    # Base dims with long sources: where skipping source positions matters
    Benchmark("speed_base_long_sources",
              "Base dims, 100-token sources: where skipping source positions pays",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':100.0}} "
              "--arch flexible_gate128=transformer_flexible "
              "--override flexible_gate128={'flexible_mean_source_length':100.0,'flexible_gate_dim':128} "
              "--arch hard=transformer_hard_dec --vocab 10000 --src-len 100 --num-sentences 64 "
              "--batch-size 32 --fixed-output-len 20 --baseline soft --beam 4 --reps 5 --threads 1 "
              "--sublayer-times"),
    # the per-step cost of soft cross-attention grows with the source, the bands' does not
    Benchmark("speed_base_200_token_sources", "Base dims, 200-token sources, 40 output tokens",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':200.0}} "
              "--arch hard=transformer_hard_dec --vocab 10000 --src-len 200 --num-sentences 32 "
              "--batch-size 32 --fixed-output-len 40 --baseline soft --beam 4 --reps 3 --threads 1 "
              "--sublayer-times"),
    # outputs as long as translations of such sources: the per-step cost outweighs caching
    Benchmark("speed_base_200_token_sources_160_outputs",
              "Base dims, 200-token sources, 160 output tokens",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':200.0}} "
              "--vocab 10000 --src-len 200 --num-sentences 32 --batch-size 32 "
              "--fixed-output-len 160 --baseline soft --beam 4 --reps 3 --threads 1 --sublayer-times"),
    Benchmark("speed_base_400_token_sources", "Base dims, 400-token sources, 100 output tokens",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':400.0}} "
              "--vocab 10000 --src-len 400 --num-sentences 16 --batch-size 16 "
              "--fixed-output-len 100 --baseline soft --beam 4 --reps 3 --threads 1 --sublayer-times"),
    # self-attention's cost grows with the target prefix, the average attention network's not
    Benchmark("speed_base_long_outputs",
              "Base dims, 60 output tokens: where a constant-cost decoder step pays",
              f"{_BASE_PEERS} --arch aan=transformer_aan "
              "--arch aan_no_ffn=transformer_aan "
              "--override aan_no_ffn={'aan_ffn_dim':0} --arch cross_self=transformer_cross_self "
              "--arch hard=transformer_hard_dec --baseline soft --beam 4 --batch-size 64 "
              "--max-sentences 64 --fixed-output-len 60 --reps 3 --threads 1 --sublayer-times",
              data=True),
)

# the main table's speed columns: each row from the first of these that measured it
TABLE_SPEED_BENCHMARKS = ("speed_small", "speed_small_parity", "speed_small_curriculum")
# and its Base-dims column
TABLE_BASE_SPEED_BENCHMARKS = ("speed_base", "speed_base_parity")


def _gpu_models(src_len):
    """fairseq's own transformer and ours at Base dims; ours with the
    engine's captured step, soft and hard also as fairseq decodes them."""
    graph = "'decoding_engine':'graph'"
    ours = {"soft": ("transformer_soft", ""), "hard": ("transformer_hard_dec", ""),
            "cross_self": ("transformer_cross_self", ""),
            "hard_cross_self": ("transformer_hard_cross_self", ""),
            "aan": ("transformer_aan", ""), "aan_no_ffn": ("transformer_aan", ",'aan_ffn_dim':0"),
            "local": ("transformer_local", ""),
            "flexible": ("transformer_flexible", f",'flexible_mean_source_length':{src_len}.0")}
    args = ["--arch fairseq=transformer", "--arch fairseq_cross_self=transformer",
            "--override fairseq_cross_self={'cross_self_attention':True,'no_cross_attention':True}"]
    for name, (arch, extra) in ours.items():
        args += [f"--arch {name}={arch}", f"--override {name}={{{graph}{extra}}}"]
    for name in ("soft", "hard"):  # the same models, decoded step by step as fairseq does
        args += [f"--arch {name}_dynamic={ours[name][0]}",
                 f"--override {name}_dynamic={{'decoding_engine':'dynamic'}}"]
    return " ".join(args)


# the GPU matrix (scripts/gpu_results.sh): Base dims, random weights, beam 4,
# every sentence decoded to exactly its source length, ratios to fairseq's transformer
GPU_BENCHMARKS = tuple(
    Benchmark(f"speed_gpu_{src_len}tok_batch{batch}_{dtype}",
              f"GPU, Base dims, {src_len}-token sources and outputs, batch {batch}, {dtype}",
              f"{_gpu_models(src_len)} --device cuda --dtype {dtype} --vocab 10000 "
              f"--src-len {src_len} --num-sentences {2 * batch} --batch-size {batch} "
              f"--fixed-output-len {src_len} --beam 4 --reps 5 --baseline fairseq")
    for src_len in (30, 100, 200) for batch in (64, 128, 256) for dtype in ("fp32", "fp16"))
# the main table's GPU column: one cell of that matrix (ratios to fairseq's transformer)
TABLE_GPU_BENCHMARK = "speed_gpu_100tok_batch128_fp16"

# what each other output of scripts/results.sh shows (results/README.md's file list)
OUTPUTS = {
    **{b.name: b.what for b in BENCHMARKS + GPU_BENCHMARKS},
    "hard_parity": "hard retrieval attention against soft attention trained the same way: "
                   "the ablation toward parity",
    "short_budget": "every architecture at the short budget (5 epochs): the earlier headline table",
    "op_counts": "operations and host syncs of one beam search per architecture, beside "
                 "fairseq's transformer (what a GPU pays per step)",
    "attention_step_costs": "one decoding step of cross-attention alone, per mechanism, Base dims "
                            "(flexible_small_gate: a d/4 gate network)",
    "attention_step_costs_small": "the same at the small preset's dims (d = 128, 4 heads)",
    "op_costs_cpu": "per-operation costs of one decoding step (the hard-attention paper's Table 2)",
    "memory": "peak memory of training and decoding",
    "speed_vs_length": "decoding speed against source length",
    "bleu_vs_cps": "flexible attention: BLEU against score computations per step over τ",
    "bleu_vs_cps_gate32": "the same for flexible_gate32_band_ft (a d/4 gate network) at τ = 0.75 to 1.25",
    "attention_soft": "cross-attention heatmaps, soft baseline",
    "attention_hard": "chosen source positions of hard retrieval attention",
    "attention_flexible_ft": "cross-attention of flexible attention after fine-tuning",
    "flexible_gate": "flexible attention's gate g_t over the decoding steps of one sentence",
}


def decodes_by_name():
    return {decode.name: decode for decode in DECODES}


def benchmark_models(benchmark, work_dir):
    """--model NAME=CHECKPOINT (and --override NAME=DICT) for each model of
    ``benchmark`` whose run is trained in ``work_dir``."""
    decodes = decodes_by_name()
    args = []
    for name in benchmark.models:
        decode = decodes.get(name)
        run = decode.run if decode else name
        checkpoint = Path(work_dir) / "runs" / run / "checkpoint_avg.pt"
        if not checkpoint.is_file():
            continue
        args += ["--model", f"{name}={checkpoint}"]
        if decode and decode.overrides:
            args += ["--override", f"{name}={decode.overrides!r}"]
    return args


def main(argv):
    command = argv[0] if argv else ""
    if command == "runs":
        lines = [f"{r.name}\t{r.arch}\t{r.corpus or '-'}\t{r.flags}" for r in FROM_SCRATCH]
    elif command == "finetunes":
        lines = [f"{f.name}\t{f.start}\t{f.arch}\t{f.epochs}\t{f.average}\t{f.warmup}\t"
                 f"{f.lr:g}\t{f.teacher or '-'}\t{f.corpus or '-'}\t{f.flags}" for f in FINETUNES]
    elif command == "decodes":
        lines = [f"{d.name}\t{d.run}\t{d.model_overrides()!r}\t{d.search or '-'}" for d in DECODES]
    elif command == "benchmarks":
        lines = [b.name for b in BENCHMARKS]
    elif command == "gpu-benchmarks":
        lines = [b.name for b in GPU_BENCHMARKS]
    elif command == "benchmark" and len(argv) == 3:
        # one argument per line: the benchmark's models, its data, its settings
        benchmark = next((b for b in BENCHMARKS + GPU_BENCHMARKS if b.name == argv[1]), None)
        if benchmark is None:
            sys.exit(f"experiments.py: no benchmark {argv[1]!r}")
        lines = benchmark_models(benchmark, argv[2]) + benchmark.args.split()
        if benchmark.data:
            lines += ["--data", str(Path(argv[2]) / "data-bin")]
    else:
        sys.exit(__doc__.split("\n\n")[1])
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
