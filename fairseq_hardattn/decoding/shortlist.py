"""A vocabulary shortlist (``--model-overrides "{'shortlist': FILE}"``, the
hub's ``shortlist=FILE``; ``shortlist_k`` keeps each source token's K best):
each batch's output projection and softmax run over the batch's candidates
only, the union of its source tokens' candidates in the table, the table's
tokens for every sentence, EOS, unk, and any prefix tokens. Scores are
log-probabilities normalised over those candidates.

The table is CTranslate2's vocabulary map (``vmap.txt``): a line per source
token, ``TOKEN<TAB>CANDIDATE CANDIDATE ...`` (best first), and a line with an
empty key for the tokens every sentence may produce; ``python -m
fairseq_hardattn shortlist`` makes one from a binarized training set
(``fairseq_hardattn/shortlist_table.py``), and CTranslate2 reads the same file
(``use_vmap``). A sentence's candidates are its batch's: its translation may
differ in another batch, as with CTranslate2's map.
"""

from typing import Optional

import torch
from torch import Tensor

from ..errors import ConfigError
from . import packed_linear
from .int8 import Int8Linear


class Shortlist:
    """``always``: the target ids every batch may produce; ``table``: (source
    vocabulary, K) target ids per source id, best first, -1 where a source
    token has fewer (or no line)."""

    def __init__(self, always: Tensor, table: Tensor):
        self.always, self.table = always, table

    @classmethod
    def load(cls, path: str, source_dictionary, target_dictionary, k: Optional[int] = None) -> "Shortlist":
        """The table in ``path`` for these dictionaries, each line cut to its
        ``k`` first candidates (all where None); tokens outside the
        dictionaries are left out."""
        if k is not None and k < 1:
            raise ConfigError(f"shortlist_k must be at least 1, got {k}")
        always = {target_dictionary.eos(), target_dictionary.unk(), target_dictionary.bos()}
        rows = {}
        try:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    key, tab, candidates = line.rstrip("\n").partition("\t")
                    if not tab:
                        raise ConfigError(f"shortlist {path} line {number}: no tab between the source token "
                                          f"and its candidates (CTranslate2's vocabulary map format)")
                    # (a token the dictionary lacks reads as unk, a candidate always)
                    ids = [target_dictionary.index(t) for t in candidates.split()]
                    if not key:
                        always.update(ids)
                    elif " " not in key:  # (n-grams of several tokens: CTranslate2's only)
                        source = source_dictionary.index(key)
                        if source != source_dictionary.unk() or key == "<unk>":
                            rows[source] = ids[:k] if k is not None else ids
        except OSError as error:
            raise ConfigError(f"shortlist {path}: {error.strerror}") from None
        width = max((len(ids) for ids in rows.values()), default=0)
        table = torch.full((len(source_dictionary), max(width, 1)), -1, dtype=torch.long)
        for source, ids in rows.items():
            table[source, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        always.discard(target_dictionary.pad())
        return cls(torch.tensor(sorted(always), dtype=torch.long), table)

    def candidates(self, src_tokens: Tensor, prefix_tokens: Optional[Tensor] = None, pad: int = 1) -> Tensor:
        """The batch's candidates: target ids, ascending."""
        sources = torch.unique(src_tokens.cpu())
        found = [self.always, self.table[sources].flatten()]
        if prefix_tokens is not None:
            found.append(prefix_tokens.cpu().flatten())
        ids = torch.unique(torch.cat(found))
        ids = ids[(ids >= 0) & (ids != pad)]
        return ids.to(src_tokens.device)


def restricted_projection(projection, columns: Tensor):
    """A function of the decoder's features that gives the logits of
    ``columns`` only: the output projection's rows of those tokens (float32,
    packed for oneDNN as the search packs the whole projection; int8 rows
    packed like the whole layer's)."""
    if isinstance(projection, Int8Linear):
        rows = projection.rows(columns)
        return lambda features: rows(features.contiguous())
    weight = getattr(projection, "weight", None)
    if not torch.is_tensor(weight) or getattr(projection, "bias", None) is not None:
        raise ConfigError("a shortlist needs the decoder's output projection to be a Linear layer "
                          "without bias (fairseq's Transformer's)")
    rows = weight.detach().index_select(0, columns)
    if packed_linear.packable_weight(rows) and packed_linear.onednn_linear_available():
        # as the whole projection runs in the search: oneDNN's Linear on rows packed once a batch
        product = packed_linear.packed_product(rows)
        return lambda features: product(features.contiguous())
    transposed = rows.t().contiguous()
    return lambda features: torch.mm(features.to(transposed.dtype), transposed).float()
