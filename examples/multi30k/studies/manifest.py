"""The manifest's vocabulary: what a run, a fine-tuning, a decode, a
benchmark and a target are, and the helpers every study names its entries
with. The studies (this package's other modules) declare the entries."""

from dataclasses import dataclass, field, replace
from typing import Dict, Tuple

SOFT_KINDS = {"dec_self_attn_kind": "soft", "dec_cross_attn_kind": "soft"}
HARD_KINDS = {"dec_self_attn_kind": "hard", "dec_cross_attn_kind": "hard"}

# the commit that last ran the options retired since (--hard-cooling-updates,
# --hard-sharpening-updates, --hard-entropy-penalty: every measured use made
# hard retrieval worse); runs that used them stay declared for their records
# and are trained only from that commit
RETIRED_OPTIONS_COMMIT = "0871ee5"
# the soft-to-hard conversions' schedule (and their controls'): 5 epochs, 20 % of
# the 25-epoch budget, 100 warmup updates, the last 2 epochs averaged
CONVERSION_SCHEDULE = {"epochs": 5, "average": 2, "warmup": 100}


@dataclass(frozen=True)
class Run:
    """Trained from scratch with the recipe of common.sh; ``corpus``: a trained
    run whose translations of the training sources replace the references
    (sequence-level distillation: hardattn_tools/distillation.py);
    ``retired``: a commit whose plugin still had the options it trained with
    (not trained from here; its records stay)."""
    name: str
    arch: str
    flags: str
    what: str
    corpus: str = ""
    retired: str = ""


@dataclass(frozen=True)
class FineTune:
    """Continues ``start``'s averaged checkpoint (``--finetune-from-model``,
    which builds from these options: repeat the start's own, e.g. a gate size)
    for ``epochs`` at a peak ``lr``, averaging the last ``average`` epoch
    checkpoints; ``warmup`` 0: a fixed lr, else inverse-sqrt after that many
    warmup updates; ``teacher``: a trained run distilled from
    (``--distill-teacher`` its averaged checkpoint; give the criterion in ``flags``);
    ``corpus``, ``retired``: as a Run's."""
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
    retired: str = ""


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



def decoded_with(run: str, kind: str) -> Decode:
    """``run`` decoded with ``kind`` attention in decoder self- and cross-attention."""
    return Decode(f"{run}_decoded_{kind}", run, {"soft": SOFT_KINDS, "hard": HARD_KINDS}[kind],
                  f"the `{run}` checkpoint decoded with {kind} decoder attention (Table 4)")



def searched_with(run: str, beam: int, lenpen: float) -> Decode:
    """``run`` decoded with beam ``beam`` and length penalty ``lenpen``."""
    return Decode(f"{run}_beam{beam}_lenpen{lenpen:g}".replace(".", "p"), run,
                  what=f"the `{run}` checkpoint decoded with beam {beam}, length penalty {lenpen:g}",
                  search=f"--beam {beam} --lenpen {lenpen:g}")


@dataclass(frozen=True)
class Target:
    """One of the parity targets, judged on the mean over seeds of run BLEU
    minus its soft counterpart's (beam 4): met where that gap is at least
    ``bound`` (within 0.3: -0.3), or, for a ``drop``, at most ``bound``."""
    claim: str
    pairs: Tuple[Tuple[str, str], ...]
    bound: float
    drop: bool = False

    def met(self, gap: float) -> bool:
        return gap <= self.bound if self.drop else gap >= self.bound



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

