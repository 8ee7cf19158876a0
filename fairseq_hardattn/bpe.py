"""``--bpe subword_nmt_vocab``: fairseq's subword-nmt BPE with subword-nmt's
vocabulary filter, so that fairseq-interactive and the hub split words as
``examples/bpe_binarize.sh`` split the training data (``apply-bpe
--vocabulary vocab.SRC --vocabulary-threshold 1``: merges that produce a
subword rarer than the threshold in the training text are undone). fairseq's
own ``subword_nmt`` has no filter, so it split some sentences otherwise
(2 of 200 Multi30k test sources)."""

from dataclasses import dataclass, field

from fairseq.data.encoders import register_bpe
from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE, SubwordNMTBPEConfig


@dataclass
class SubwordNMTVocabularyConfig(SubwordNMTBPEConfig):
    bpe_vocabulary: str = field(
        default="???", metadata={"help": "subword-nmt's vocabulary of the source language "
                                         "(bpe_binarize.sh writes WORK/bpe/vocab.SRC)"})
    bpe_vocabulary_threshold: int = field(
        default=1, metadata={"help": "subwords seen fewer times in training are split further"})


@register_bpe("subword_nmt_vocab", dataclass=SubwordNMTVocabularyConfig)
class SubwordNMTVocabularyBPE(SubwordNMTBPE):
    def __init__(self, cfg):
        super().__init__(cfg)
        from subword_nmt import apply_bpe

        with open(cfg.bpe_vocabulary, encoding="utf-8") as vocabulary:
            self.bpe.vocab = apply_bpe.read_vocabulary(vocabulary, cfg.bpe_vocabulary_threshold)
