"""Sampling in the plugin's search (``--sampling``, ``--sampling-topk``,
``--sampling-topp``, ``--temperature``; ``--beam N``: N samples of each
sentence): fairseq's ``search.Sampling``, drawn for each sentence from a
random generator of its own.

fairseq's generator draws a batch's samples from the process's one random
generator, so a sentence's samples depend on the sentences that share its
batch, on the batches before it and on the order the batches decode in:
another ``--max-tokens``, a shard, a worker process gives other samples.
Here each sentence draws from ``torch.Generator`` seeded with
``sentence_seed(seed, id)``, ``id`` its index in the data (fairseq-generate,
the hub), its line (fairseq-interactive, the corpus command), and ``seed``
the command's ``--seed`` (the hub's ``seed=``; else torch's initial seed).
Its draws are the calls fairseq's ``Sampling.step`` makes for a batch of
that one sentence with the process's generator seeded so: the same
samples as fairseq's wherever the probabilities are the same bits
(``tests/unit/test_sampling.py``). A sentence's samples are therefore the
same in any batch, chunk, worker or shard, and across runs. With one sample
a sentence and no nucleus (back-translation's ``--beam 1``), every draw is
PyTorch's ``exponential_``, and the sentences' generators run in C, a step's
draws one call (``kernels/sentence_draws.c``: PyTorch's generator and
``exponential_`` as its CPU code makes them, checked once per process to
give the same numbers bit for bit, else ``torch.Generator`` as above).

As in fairseq, each of the N rows of a sentence is one sample from the
first step to its end; a sample that has ended keeps its row (fairseq
decodes it on, its output unused) until every sample of its sentence has.
"""

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import kernels

# an odd 64-bit constant (2^64 / golden ratio): sentence seeds differ in their low 32 bits,
# which are what a CPU generator's Mersenne Twister is seeded with
_SPREAD = 0x9E3779B97F4A7C15


def sentence_seed(seed: int, sentence_id: int) -> int:
    """The seed of sentence ``sentence_id``'s generator: ``seed`` itself for
    sentence 0 (fairseq's own draws for a set of one sentence)."""
    return (int(seed) + _SPREAD * int(sentence_id)) % (1 << 64)


class SentenceDraws:
    """Each sentence's random generator and its step of fairseq's
    ``Sampling`` (``topk`` > 0: among the k most probable tokens; ``topp`` >
    0: among the smallest set whose probability reaches p)."""

    def __init__(self, seed: int, sentence_ids: List[int], beam: int, topk: int, topp: float):
        seeds = [sentence_seed(seed, i) for i in sentence_ids]
        # one draw per sentence and step, each an exponential_: the generators in C
        self.states = kernel_generators(seeds) if beam == 1 and topp <= 0 else None
        self.generators = None if self.states is not None else [torch.Generator().manual_seed(s) for s in seeds]
        self.beam, self.topk, self.topp = beam, topk, topp

    def keep(self, kept: List[int]):
        """Only the sentences ``kept`` (positions in the batch) go on."""
        if self.states is not None:
            self.states = self.states[torch.tensor(kept, dtype=torch.long)]
        else:
            self.generators = [self.generators[i] for i in kept]

    def step(self, step: int, lprobs: Tensor, truncated: Optional[Tensor] = None
             ) -> Tuple[Tensor, Tensor]:
        """(the sampled tokens' log-probabilities, the tokens), each (sentences,
        beam): row b of a sentence continues its row b (at step 0 every sample
        starts from the sentence's one row). ``lprobs``: the log-probabilities
        (sentences x rows, vocabulary), or with ``truncated`` (the k best
        tokens of each row, descending) their values (``sampling_topk``)."""
        sentences = len(self.generators) if self.states is None else self.states.size(0)
        rows = 1 if step == 0 else self.beam
        lprobs = lprobs.view(sentences, rows, -1)
        if self.topp > 0:
            probs, tokens = self._nucleus(lprobs)
        elif truncated is not None:
            probs, tokens = lprobs.exp(), truncated.view(sentences, rows, -1)
        elif self.topk > 0:
            values, tokens = lprobs.topk(self.topk)
            probs = values.exp_()
        else:
            probs, tokens = lprobs.exp(), None
        if (step > 0 or self.states is not None) and self.topp <= 0:  # (one draw: multinomial's own way)
            drawn = self._one_each(probs)
        else:
            drawn = torch.empty(sentences, self.beam, dtype=torch.long)
            for s, generator in enumerate(self.generators):
                sentence = probs[s] if self.topp <= 0 else probs[s][:, :self._widths[s]]
                if step == 0:
                    drawn[s] = torch.multinomial(sentence.reshape(1, -1), self.beam, replacement=True,
                                                 generator=generator)[0]
                else:
                    drawn[s] = torch.multinomial(sentence, 1, replacement=True, generator=generator)[:, 0]
        if step == 0:
            probs = probs.expand(sentences, self.beam, -1)
            tokens = None if tokens is None else tokens.expand(sentences, self.beam, -1)
        scores = probs.gather(2, drawn.unsqueeze(2)).log_().squeeze(2)
        if tokens is not None:
            drawn = tokens.gather(2, drawn.unsqueeze(2)).squeeze(2)
        return scores, drawn

    def _one_each(self, probs: Tensor) -> Tensor:
        """``torch.multinomial(probs[s], 1, replacement=True, generator=s's)``
        for every sentence s at once: the index of the largest ``probs / q``
        per row, q exponential draws (PyTorch's algorithm for one sample per
        row: the same numbers from the same generator, the same bits of the
        quotients and the same first maximum), drawn per sentence into one
        tensor so that the rest is one operation for the batch."""
        q = torch.empty_like(probs, memory_format=torch.contiguous_format)
        if self.states is not None:
            kernels.exponential_draws(self.states, q)
        else:
            for sentence, generator in zip(q.unbind(0), self.generators):  # (unbind: one call for every view)
                sentence.exponential_(generator=generator)
        return torch.div(probs, q, out=q).argmax(dim=2)

    def _nucleus(self, lprobs: Tensor) -> Tuple[Tensor, Tensor]:
        """fairseq's ``Sampling._sample_topp`` for each sentence: the tokens by
        probability, those outside the nucleus at probability 0, cut to the
        widest nucleus among the sentence's rows (``_widths``)."""
        probs = lprobs.exp()
        sorted_probs, sorted_tokens = probs.sort(descending=True)
        inside = sorted_probs.cumsum(dim=2).lt(self.topp)
        # one more token than those below p, so that the mass reaches it
        last = inside.cumsum(dim=2)[:, :, -1:].clamp_(0, inside.size(2) - 1)
        inside = inside.scatter_(2, last, True)
        self._widths = (last.amax(dim=(1, 2)) + 1).tolist()
        return sorted_probs.masked_fill_(~inside, 0), sorted_tokens


_checked: Dict[str, bool] = {}


def kernel_generators(seeds: List[int]) -> Optional[Tensor]:
    """The generators seeded with ``seeds`` in C (``kernels.sentence_generators``),
    or None: no kernel, or its draws are not this PyTorch's."""
    return kernels.sentence_generators(seeds) if kernel_draws_available() else None


def kernel_draws_available() -> bool:
    """Whether the C generators draw this PyTorch's numbers (checked once a process)."""
    if not kernels.available():
        return False
    if "draws" not in _checked:
        _checked["draws"] = _kernel_draws_are_torchs()
    return _checked["draws"]


def _kernel_draws_are_torchs() -> bool:
    """Whether the C generators draw what ``exponential_`` draws from
    ``torch.Generator`` with the same seeds, bit for bit: seeds below and
    above 32 bits, float32 and float64, short calls and one past a renewal
    of the generator's state."""
    seeds = [0, 7, sentence_seed(1, 3), (1 << 64) - 1]
    for dtype in (torch.float32, torch.float64):
        states = kernels.sentence_generators(seeds)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        for per in (3, 1000):
            drawn = torch.empty(len(seeds), per, dtype=dtype)
            kernels.exponential_draws(states, drawn)
            theirs = [torch.empty(per, dtype=dtype).exponential_(generator=g) for g in generators]
            if not torch.equal(drawn, torch.stack(theirs)):
                return False
    return True
