"""The plugin's beam search: fairseq's ``SequenceGenerator`` semantics, with
the per-step passes over the vocabulary cut to what the search needs.

fairseq's generator spends much of a CPU decoding step on its search: a full
``log_softmax``, a NaN check and several writes over the (hypotheses x
vocabulary) scores, a top-k over beam x vocabulary per sentence, and it
copies every hypothesis's token and score history, and the encoder output,
on every step. Here, per step:

- the log-normaliser of every hypothesis (``logsumexp`` of the raw logits),
  the special columns written on the logits (pad; unk's penalty; EOS before
  ``min_len`` or alone at ``max_len``; a forced prefix token; banned n-grams),
  and each hypothesis's best 2 x beam tokens: the sentence's best 2 x beam
  candidates are among them;
- the candidates' log-probabilities are those values minus the normaliser
  (fairseq: ``log_softmax`` of every logit, then the same selection);
- histories are not copied: each step records its tokens, scores and the
  hypothesis each continues (a back-pointer); a finished hypothesis is read
  back along its pointers, once;
- the encoder output is reordered only when finished sentences leave the
  batch (within a sentence, every hypothesis reads the same source), and the
  decoder's caches by the back-pointers, as fairseq does, except on a CPU
  step where every row continues its own (greedy search and sampling, until
  a sentence leaves or a sample ends).

Same hypotheses and scores as fairseq's generator (the scores to float32
rounding: the normaliser is summed in another order), for every option this
search supports; the others run fairseq's generator (``fallback_reason``).
``tests/unit/test_beam_search.py`` compares both. Sampling (``--sampling``)
is this search with fairseq's ``Sampling`` step, each sentence drawing from
a generator of its own (``sampling``).
"""

import contextlib
import logging
import math
from typing import Dict, List, Optional

import torch
from fairseq import search, utils
from fairseq.data import data_utils
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment
from torch import Tensor, nn

from .. import kernels
from ..modules import decoding_step
from ..modules.cached_projection import CachedProjectionAttention
from . import direct_step, engines, native_search
from .int8 import Int8Linear
from .lineage import Lineage
from .packed_linear import packed_linears
from .read_ahead import sentence_ids
from .sampling import SentenceDraws
from .shortlist import restricted_projection
from .workers import ParallelBatches

logger = logging.getLogger(__name__)


class PluginBeamSearch(ParallelBatches, SequenceGenerator):
    """fairseq's ``SequenceGenerator`` (same constructor, ``generate`` and
    output) whose search is this module's: one model, or an ensemble (the
    mean of its models' probabilities, as fairseq's ``EnsembleModel``), beam
    search or sampling (``search_strategy`` fairseq's ``Sampling``; ``seed``:
    the sentences' generators are seeded from it, by default torch's initial
    seed, which fairseq's tools set to ``--seed``): ``fallback_reason`` says
    why a configuration runs fairseq's generator instead. Several batches
    decode at once in worker processes where the caller iterates them
    (``workers``). A call's state lives in the call: threads may decode with
    one generator at once."""

    serial_generate = SequenceGenerator.generate

    def __init__(self, models, tgt_dict, seed: Optional[int] = None, **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        if type(self.search) not in (search.BeamSearch, search.Sampling) or self.lm_model is not None:
            raise ValueError("PluginBeamSearch runs beam search and sampling "
                             "(fallback_reason names what else needs fairseq's generator)")
        self.sampling = type(self.search) is search.Sampling
        self.seed = torch.initial_seed() if seed is None else int(seed)

    @torch.no_grad()
    def _generate(self, sample: Dict[str, Dict[str, Tensor]], prefix_tokens: Optional[Tensor] = None,
                  constraints: Optional[Tensor] = None, bos_token: Optional[int] = None):
        if constraints is not None:
            raise NotImplementedError("constraints need fairseq's generator")
        if self.sampling and prefix_tokens is not None:  # fairseq's draws, from torch's generator
            return SequenceGenerator._generate(self, sample, prefix_tokens=prefix_tokens, bos_token=bos_token)
        models = self.model.models
        why_not = native_search.why_not(self, models, sample["net_input"]["src_tokens"], prefix_tokens)
        native = None if why_not is not None else native_search.kept(models[0], StepLogits.CANDIDATE_ROWS)
        if native is not None:  # (a prepared model's, from an earlier call: no packing to open)
            return sorted_by_score(native.search(self, models[0], sample, bos_token))
        with contextlib.ExitStack() as packing:
            # on a CPU, the large float32 Linear layers on oneDNN's prepacked kernels
            packed = [packing.enter_context(packed_linears(model)) for model in models]
            if why_not is None:
                native, why_not = native_search.NativeModel.of(models[0], packed[0], StepLogits.CANDIDATE_ROWS)
            if native is not None:
                return sorted_by_score(native.search(self, models[0], sample, bos_token))
            logger.debug("the Python search decodes this batch: the native search does not take %s", why_not)
            steps = [StepLogits(model, layers) for model, layers in zip(models, packed)]
            return self._search(sample, prefix_tokens, bos_token, steps)

    def _search(self, sample: Dict[str, Dict[str, Tensor]], prefix_tokens: Optional[Tensor],
                bos_token: Optional[int], steps: List["StepLogits"]):
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        if "src_lengths" in net_input:
            src_lengths = net_input["src_lengths"]
        else:
            src_lengths = (src_tokens.ne(self.eos) & src_tokens.ne(self.pad)).long().sum(dim=1)
        bsz, src_len = src_tokens.size()[:2]
        beam = self.beam_size
        device = src_tokens.device
        # the logits' columns: every target token, or the batch's shortlist (decoding/shortlist.py)
        shortlist = getattr(self.model.models[0], "shortlist", None)
        columns = None if shortlist is None else shortlist.candidates(src_tokens, prefix_tokens, self.pad)
        vocab = self.vocab_size if columns is None else len(columns)
        pad, unk, eos = self._special_columns_of(columns)
        if self.match_source_len:
            max_len = int(src_lengths.max())
        else:
            max_len = min(int(self.max_len_a * src_len + self.max_len_b), self.max_len - 1)
        assert self.min_len <= max_len, "min_len cannot be larger than max_len, please adjust these!"

        expand = torch.arange(bsz, device=device).repeat_interleave(beam)
        for step_logits in steps:  # each model's encoder output, caches and lineage
            step_logits.start(net_input, expand, bsz * beam, max_len + 1, columns)
        # the first step's hypotheses of a sentence are all the same: on a CPU it
        # decodes one per sentence, and the first reorder makes the beams
        one_per_sentence = (all(s.lineage is not None for s in steps) and beam > 1
                            and prefix_tokens is None and self.repeat_ngram_blocker is None)

        # candidates per hypothesis, and per sentence as fairseq's (at step 0 from one hypothesis)
        candidates = min(2 * beam, vocab)
        first_candidates, sentence_candidates = min(2 * beam, vocab - 1), min(2 * beam, beam * vocab - 1)
        draws, ignored = None, None
        if self.sampling:  # each sentence's generator; a sample that ended keeps its row, ignored
            draws = SentenceDraws(self.seed, sentence_ids(sample), beam, self.search.sampling_topk,
                                  self.search.sampling_topp)
            ignored = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
            topk = self.search.sampling_topk
            candidates = min(topk, vocab) if topk > 0 and self.search.sampling_topp <= 0 else 0
        # the search's state: per hypothesis (row), its last token and cumulative score;
        # per step, every row's token, cumulative score and the row it continues
        rows = bsz * beam
        bos = self.eos if bos_token is None else bos_token
        last = torch.full((bsz if one_per_sentence else rows,), bos, dtype=torch.long, device=device)
        scores = torch.zeros(rows, device=device)
        step_tokens = torch.empty(max_len + 1, rows, dtype=torch.long, device=device)
        step_scores = torch.empty(max_len + 1, rows, device=device)
        step_parents = torch.empty(max_len + 1, rows, dtype=torch.long, device=device)
        # fairseq's token buffer, kept only where n-gram blocking or a prefix reads it
        tokens = None
        if self.repeat_ngram_blocker is not None or prefix_tokens is not None:
            tokens = torch.full((rows, max_len + 2), self.pad, dtype=torch.long, device=device)
            tokens[:, 0] = last
        finalized: List[List[Dict[str, Tensor]]] = [[] for _ in range(bsz)]
        sentences = list(range(bsz))  # the original index of each sentence still in the batch
        slots = torch.arange(max(first_candidates, sentence_candidates), device=device)
        first_rows = torch.arange(bsz, device=device) * beam  # the first row of each sentence
        order: Optional[Tensor] = None  # rows of the last step each row continues
        # a sampled or greedy row continues its own row until samples end or sentences
        # leave: while it does, the caches need no reorder (on a CPU: the check would
        # be a GPU's second host sync a step)
        own_rows, unmoved = torch.arange(rows, device=device), False

        for step in range(max_len + 1):
            for step_logits in steps:
                step_logits.next_step(None if unmoved else order, step, rows)
            # the decoder reads the last token and the length. A hypothesis whose score is
            # -inf already (fewer candidates than the beam: a forced prefix, a tiny
            # vocabulary) may end with pad, which fairseq's decoder would mask; its
            # output is never read, so it reads EOS there instead
            prefix = last.masked_fill(last.eq(self.pad), self.eos).unsqueeze(1).expand(-1, step + 1)
            one_row = one_per_sentence and step == 0
            forcing = prefix_tokens is not None and step < prefix_tokens.size(1) and step < max_len
            # where only each row's candidates and normaliser are read: the C kernel,
            # with a packed output projection a block of rows at a time
            kernel_step = step < max_len and not forcing and self.repeat_ngram_blocker is None and candidates
            in_blocks = kernel_step and len(steps) == 1 and steps[0].in_row_blocks(prefix)
            logits = None if in_blocks else self._logits(steps, prefix, one_row)
            if in_blocks or (kernel_step and kernels.can_run_beam_candidates(logits)):
                # one C call: the normaliser and the candidates, the special columns adjusted
                special, adds = self._kernel_columns(pad, unk, eos)[step < self.min_len]
                if in_blocks:
                    top, top_tokens, normaliser = steps[0].candidates(prefix, one_row, self.temperature,
                                                                      special, adds, candidates)
                else:
                    top, top_tokens, normaliser = kernels.beam_candidates(logits, special, adds, candidates)
            else:
                normaliser = torch.logsumexp(logits, dim=1, keepdim=True)
                # the special columns, on the logits (the normaliser already has them)
                if pad is not None:
                    logits[:, pad] = -math.inf
                if self.unk_penalty:
                    logits[:, unk] -= self.unk_penalty
                if step >= max_len:
                    logits[:, :eos] = -math.inf
                    logits[:, eos + 1:] = -math.inf
                if forcing:
                    logits, scores = self._force_prefix(step, logits, scores, tokens, prefix_tokens,
                                                        step_scores, step_parents, step_tokens, columns)
                elif step < self.min_len:
                    logits[:, eos] = -math.inf
                if self.repeat_ngram_blocker is not None:
                    logits = self.repeat_ngram_blocker(tokens, logits, bsz, beam, step)
                if draws is not None:  # every token's log-probability
                    top, top_tokens = logits, None
                else:
                    top, top_tokens = logits.topk(candidates, dim=1)
            lprobs = top - normaliser if len(steps) == 1 else top  # an ensemble's: log-probabilities
            if draws is not None:  # fairseq's Sampling: row b of a sentence continues its row b
                if step == 0 and lprobs.size(0) != bsz:
                    lprobs = lprobs[first_rows]
                    top_tokens = None if top_tokens is None else top_tokens[first_rows]
                sentence_scores, cand_tokens = draws.step(step, lprobs, top_tokens)
                if step == 0:
                    cand_beams = torch.zeros_like(cand_tokens)
                else:
                    cand_beams = slots[:beam].expand(bsz, beam)
                    sentence_scores = sentence_scores + scores.view(bsz, beam)
            elif step == 0:  # every hypothesis of a sentence is the same: its first one's candidates
                if one_per_sentence:
                    lprobs, top_tokens = lprobs.repeat_interleave(beam, 0), top_tokens.repeat_interleave(beam, 0)
                sentence_scores = lprobs[first_rows, :first_candidates]
                cand_beams = torch.zeros_like(sentence_scores, dtype=torch.long)
                cand_tokens = top_tokens[first_rows, :first_candidates]
            else:
                totals = (lprobs + scores.unsqueeze(1)).view(bsz, beam * candidates)
                sentence_scores, picked = totals.topk(sentence_candidates, dim=1)
                cand_beams = torch.div(picked, candidates, rounding_mode="trunc")
                cand_tokens = top_tokens.view(bsz, beam * candidates).gather(1, picked)

            if columns is not None:  # the shortlist's columns -> tokens
                cand_tokens = columns[cand_tokens]
            # hypotheses ending with EOS among each sentence's best `beam`: finished
            eos_mask = cand_tokens.eq(self.eos) & sentence_scores.ne(-math.inf)
            if ignored is not None:  # samples that ended before end no more
                eos_mask &= ~ignored
            ending = eos_mask[:, :beam]
            finished_sentences: List[int] = []
            if bool(ending.any()):  # the step's one host sync: a cheap check
                finished_sentences = self._finalize(
                    step, ending, cand_beams, sentence_scores, step_tokens, step_scores,
                    step_parents, finalized, sentences, max_len)
                if len(finished_sentences) == len(sentences):
                    break
            assert step < max_len, f"{step} < {max_len}"

            # each sentence continues with its best `beam` candidates not ending with EOS
            # (the first `beam` by position: candidates are sorted by score); a sampled
            # sentence with all its `beam` candidates, those that ended last
            width = eos_mask.size(1)
            if ignored is not None:
                eos_mask |= ignored
            ranks, active = torch.add(eos_mask.long() * width, slots[:width]).topk(beam, dim=1, largest=False)
            if ignored is not None:
                ignored = ranks.ge(width)
            parents = cand_beams.gather(1, active) + first_rows.unsqueeze(1)
            last = cand_tokens.gather(1, active).view(-1)
            scores = sentence_scores.gather(1, active).view(-1)
            order = parents.view(-1)
            if finished_sentences:  # they leave the batch: every row of the others moves up
                keep = [i for i, s in enumerate(sentences) if s not in finished_sentences]
                kept = torch.tensor(keep, device=device)
                sentences = [sentences[i] for i in keep]
                order, last, scores = (t.view(bsz, beam)[kept].view(-1) for t in (order, last, scores))
                if draws is not None:
                    draws.keep(keep)
                    ignored = ignored[kept]
                bsz, rows = len(keep), len(keep) * beam
                for step_logits in steps:
                    step_logits.reorder_encoder_out(order)
                # the histories keep their rows: record where each kept row came from
                first_rows = first_rows[:bsz]
                if prefix_tokens is not None:
                    prefix_tokens = prefix_tokens[kept]
            if one_per_sentence and step == 0:
                # from one row per sentence to its beam (cross-attention caches stay per sentence)
                order = torch.div(order, beam, rounding_mode="trunc")
                for step_logits in steps:
                    decoding_step.set_hypotheses_per_sentence(step_logits.incremental_state, beam)
            unmoved = ((draws is not None or beam == 1) and device.type == "cpu" and not finished_sentences
                       and not (one_per_sentence and step == 0) and torch.equal(order, own_rows[:rows]))
            step_tokens[step, :rows] = last
            step_scores[step, :rows] = scores
            step_parents[step, :rows] = order
            if tokens is not None:
                tokens = tokens.index_select(0, order)
                tokens[:, step + 1] = last

        return sorted_by_score(finalized)

    def _logits(self, steps: List["StepLogits"], prefix: Tensor, one_row: bool) -> Tensor:
        """The step's float32 logits (rows, vocabulary), at the search's
        temperature: one model's, or an ensemble's log-probabilities (the mean
        of its models' probabilities, not renormalised, as fairseq's)."""
        if len(steps) == 1:
            logits = steps[0](prefix, one_row)
            if self.temperature != 1.0:
                logits = logits / self.temperature
            return logits.float()
        each = [step_logits(prefix, one_row).float() for step_logits in steps]
        if self.temperature != 1.0:
            each = [x / self.temperature for x in each]
        if kernels.can_run_ensemble_log_probs(each):
            return kernels.ensemble_log_probs(each)
        logits = torch.logsumexp(torch.stack([torch.log_softmax(x, dim=-1) for x in each]),
                                 dim=0) - math.log(len(steps))
        logits[logits != logits] = -math.inf  # fairseq's NaN check
        return logits

    def _special_columns_of(self, columns: Optional[Tensor]):
        """The logits' columns of pad, unk and EOS: their ids, or with a
        shortlist their places in it (pad: None, never a candidate)."""
        if columns is None:
            return self.pad, self.unk, self.eos
        place = {int(token): i for i, token in enumerate(columns.tolist())
                 if token in (self.pad, self.unk, self.eos)}
        return place.get(self.pad), place[self.unk], place[self.eos]

    def _kernel_columns(self, pad: Optional[int], unk: int, eos: int):
        """(columns, adds) of the C kernel, without and with EOS blocked
        (before min_len): pad never chosen (NaN), unk with its penalty."""
        specials = self.__dict__.setdefault("_specials", {})
        if (pad, unk, eos) not in specials:
            columns = [unk] + ([pad] if pad is not None else [])
            adds = [-float(self.unk_penalty)] + ([math.nan] if pad is not None else [])
            specials[pad, unk, eos] = tuple(
                (torch.tensor(columns + [eos] * eos_blocked, dtype=torch.long),
                 torch.tensor(adds + [math.nan] * eos_blocked, dtype=torch.float32))
                for eos_blocked in (False, True))
        return specials[pad, unk, eos]

    def _finalize(self, step, ending, cand_beams, sentence_scores, step_tokens, step_scores,
                  step_parents, finalized, sentences, max_len) -> List[int]:
        """Store the hypotheses ending with EOS (``ending``: (sentences, beam)
        candidates) as fairseq does; returns the original indices of the
        sentences now finished."""
        beam = self.beam_size
        which = ending.nonzero()  # (sentence, slot) pairs, row-major as fairseq's masked_select
        in_batch, slot = which[:, 0], which[:, 1]
        row = cand_beams[in_batch, slot] + in_batch * beam
        eos_scores = sentence_scores[in_batch, slot]
        # read each hypothesis back along its pointers
        hyp_tokens = torch.empty(len(row), step + 1, dtype=torch.long, device=row.device)
        hyp_scores = torch.empty(len(row), step + 1, device=row.device)
        hyp_tokens[:, step] = self.eos
        hyp_scores[:, step] = eos_scores
        if not kernels.read_back(step_tokens, step_scores, step_parents, row, step, hyp_tokens, hyp_scores):
            at = row
            for s in range(step - 1, -1, -1):
                hyp_tokens[:, s] = step_tokens[s, at]
                hyp_scores[:, s] = step_scores[s, at]
                at = step_parents[s, at]
            hyp_scores[:, 1:] = hyp_scores[:, 1:] - hyp_scores[:, :-1].clone()
        if self.normalize_scores:
            eos_scores = eos_scores / (step + 1) ** self.len_penalty
        newly_finished = []
        for i, b in enumerate(in_batch.tolist()):
            sentence = sentences[b]
            if len(finalized[sentence]) < beam:
                finalized[sentence].append({
                    "tokens": hyp_tokens[i], "score": eos_scores[i], "attention": torch.empty(0),
                    "alignment": torch.empty(0), "positional_scores": hyp_scores[i]})
        for b in sorted(set(in_batch.tolist())):
            sentence = sentences[b]
            if len(finalized[sentence]) == beam or step == max_len:
                newly_finished.append(sentence)
        return newly_finished

    def _force_prefix(self, step, logits, scores, tokens, prefix_tokens, step_scores, step_parents,
                      step_tokens, columns=None):
        """fairseq's ``_prefix_tokens`` on the logits: a row whose sentence
        has a prefix token at this step can only continue with it (its
        column: its id, or its place in the shortlist ``columns``)."""
        beam = self.beam_size
        forced = prefix_tokens[:, step].repeat_interleave(beam)
        mask = forced.ne(self.pad)
        column = forced if columns is None else torch.searchsorted(columns, forced).clamp_(max=len(columns) - 1)
        kept = logits.gather(1, column.unsqueeze(1))
        logits[mask] = -math.inf
        logits[mask] = logits[mask].scatter(1, column[mask].unsqueeze(1), kept[mask])
        eos = forced.eq(self.eos)
        if bool(eos.any()):
            # a prefix that ends here: every hypothesis of the sentence becomes its first one
            first = eos.view(-1, beam)[:, 0]
            for buffer in (tokens, logits):
                grouped = buffer.view(-1, beam, buffer.size(-1))
                grouped[first] = grouped[first][:, :1]
            rows = forced.numel()
            histories = (step_tokens, step_scores, step_parents) if step > 0 else ()
            for buffer in (scores,) + tuple(h[step - 1, :rows] for h in histories):
                grouped = buffer.view(-1, beam)
                grouped[first] = grouped[first][:, :1]
        return logits, scores


def sorted_by_score(finalized: List[List[Dict[str, Tensor]]]) -> List[List[Dict[str, Tensor]]]:
    """Each sentence's hypotheses by score, best first (fairseq's order)."""
    for sentence in finalized:
        if len(sentence) > 1:
            by_score = torch.tensor([float(h["score"].item()) for h in sentence])
            sentence[:] = [sentence[i] for i in torch.sort(by_score, descending=True)[1]]
    return finalized


class StepLogits:
    """One model's part of one call: its encoder output (per sentence, and
    per hypothesis), its caches (the incremental state, the lineage on a CPU)
    and each step's logits: the decoder's, and on a CPU its output projection
    as one product over the features: oneDNN's packed Linear
    (``packed_linear``), the int8 Linear, or else an ``mm`` with the
    transposed weight kept contiguous (faster than ``F.linear``). The
    copies are the call's own, never kept from an earlier one: fairseq's
    optimizer updates weights through .data, which leaves their version as
    it was (``--eval-bleu``'s generator lives through training)."""

    def __init__(self, model, packed_layers):
        self.model, self.decoder = model, model.decoder
        self.packed_layers = packed_layers
        self.transposed = None  # the output projection's weight, transposed
        self.buffer = None  # every step's logits (a fresh one each step costs its page faults)
        self.incremental_state: Dict[str, Dict[str, Optional[Tensor]]] = {}
        self.lineage = None
        self.shortlisted = None  # the logits of a shortlist's columns, from the features
        self.direct = None  # the decoder's steps after the first as direct calls (direct_step)
        self.direct_checked = False

    def start(self, net_input, expand: Tensor, rows: int, capacity: int, columns: Optional[Tensor] = None):
        """Encode the sources; on a CPU, self-attention caches that are never
        reordered (their ancestors are: ``Lineage``); the output projection
        to the shortlist ``columns`` where there is one."""
        if columns is not None:
            self.shortlisted = restricted_projection(self.decoder.output_projection, columns)
        encoder = self.model.encoder
        self.sentence_encoder_out = encoder.forward_torchscript(net_input)
        self.encoder_out = encoder.reorder_encoder_out(self.sentence_encoder_out, expand)
        src_tokens = net_input["src_tokens"]
        engine = getattr(self.decoder, "decoding_engine", "fairseq")
        if (engines.step_of(engine, src_tokens) == engines.LINEAGE_STEP
                and any(isinstance(m, CachedProjectionAttention) and m.kernel_mode for m in self.decoder.modules())):
            self.lineage = Lineage.start(self.incremental_state, rows, capacity)
            if direct_step.supports(self.decoder) is None:
                self.direct = direct_step.DirectStep(self.decoder, capacity)

    def next_step(self, order: Optional[Tensor], step: int, rows: int):
        """Row i of this step continues row ``order[i]`` of the last one."""
        if order is not None:
            self.decoder.reorder_incremental_state_scripting(self.incremental_state, order)
            if self.lineage is not None:
                self.lineage.reorder(order)
        if self.lineage is not None:
            self.lineage.set_step(step, rows)

    def reorder_encoder_out(self, order: Tensor):
        """Finished sentences left the batch."""
        self.encoder_out = self.model.encoder.reorder_encoder_out(self.encoder_out, order)

    def features(self, prefix, encoder_out) -> Tensor:
        """The decoder's features of each hypothesis's last token (rows, embed_dim)."""
        if self.direct is not None and prefix.size(1) > 1:  # (the first step made the caches)
            if self.direct_checked or self.direct.usable(self.incremental_state, self.lineage):
                self.direct_checked = True
                return self.direct(prefix, encoder_out, self.incremental_state)
            self.direct = None
        return self.decoder(prefix, encoder_out=encoder_out, incremental_state=self.incremental_state,
                            features_only=True)[0][:, -1, :]

    # rows of logits made at a time where only each row's candidates are read
    CANDIDATE_ROWS = 256

    def in_row_blocks(self, prefix: Tensor) -> bool:
        """Whether ``candidates`` can make the step's logits a block of rows
        at a time: oneDNN's packed output projection, whose rows are the same
        bits in any block (as its few shapes assume), on a CPU."""
        return (not prefix.is_cuda and self.shortlisted is None
                and getattr(self.decoder, "adaptive_softmax", None) is None
                and getattr(self.decoder, "output_projection", None) in self.packed_layers
                and kernels.available())

    def candidates(self, prefix, one_per_sentence: bool, temperature: float, special: Tensor, adds: Tensor,
                   k: int):
        """``kernels.beam_candidates`` of the step's logits (at ``temperature``),
        made and read ``CANDIDATE_ROWS`` rows at a time: a batch's logits would
        be its rows times the vocabulary (a hundred MB and more at beam 4),
        allocated anew on every step and read back from memory; a block's
        stay in the caches."""
        encoder_out = self.sentence_encoder_out if one_per_sentence else self.encoder_out
        features = self.features(prefix, encoder_out).contiguous()
        rows = features.size(0)
        out = features.new_empty(rows, k), torch.empty(rows, k, dtype=torch.int64), features.new_empty(rows, 1)
        projection = self.decoder.output_projection
        for start in range(0, rows, self.CANDIDATE_ROWS):
            end = min(start + self.CANDIDATE_ROWS, rows)
            logits = projection(features[start:end])
            if temperature != 1.0:
                logits = logits / temperature
            kernels.beam_candidates(logits, special, adds, k, out=tuple(t[start:end] for t in out))
        return out

    def __call__(self, prefix, one_per_sentence: bool) -> Tensor:
        decoder, incremental_state = self.decoder, self.incremental_state
        encoder_out = self.sentence_encoder_out if one_per_sentence else self.encoder_out
        if self.shortlisted is not None:
            return self.shortlisted(self.features(prefix, encoder_out))
        projection = getattr(decoder, "output_projection", None)
        # --int8-decoding's int8 Linear, or oneDNN's packed one: on the features as one matrix
        own_kernel = (isinstance(projection, Int8Linear)
                      or projection in self.packed_layers)
        if (prefix.is_cuda or getattr(decoder, "adaptive_softmax", None) is not None
                or not (own_kernel or (isinstance(projection, nn.Linear) and projection.bias is None))):
            if self.direct is not None and not prefix.is_cuda and decoder.adaptive_softmax is None:
                return decoder.output_layer(self.features(prefix, encoder_out))  # (e.g. bfloat16's)
            return decoder(prefix, encoder_out=encoder_out, incremental_state=incremental_state)[0][:, -1, :]
        features = self.features(prefix, encoder_out)
        if own_kernel:
            return projection(features.contiguous())
        if self.transposed is None:
            self.transposed = projection.weight.detach().t().contiguous()
        rows, vocab = features.size(0), self.transposed.size(1)
        if self.buffer is None or self.buffer.numel() < rows * vocab or self.buffer.dtype != features.dtype:
            self.buffer = features.new_empty(rows * vocab)
        return torch.mm(features, self.transposed, out=self.buffer[:rows * vocab].view(rows, vocab))


class PluginBeamSearchWithAlignment(SequenceGeneratorWithAlignment, PluginBeamSearch):
    """``--print-alignment``: this search, then one teacher-forced pass over
    the finished hypotheses for their attention over the source (models with
    ``full_context_alignment``: this search records no attention per step).
    fairseq's pass encodes each source again for every hypothesis, computes
    logits over the vocabulary at every position, which only its attention
    is read from, and aligns all beam hypotheses, where fairseq-generate
    prints ``--nbest`` (default 1): several times the decoding time. Here each
    sentence's encoder output serves its hypotheses, the decoder stops at its
    features, and the pass covers the best ``aligned_nbest`` hypotheses of
    each sentence; another hypothesis's alignment is computed when it is
    read (``LazilyAligned``). The attention, and the alignments taken from it,
    are fairseq's."""

    generate = ParallelBatches.generate

    def __init__(self, models, tgt_dict, aligned_nbest: int = 1, **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        self.aligned_nbest = aligned_nbest

    @torch.no_grad()
    def serial_generate(self, models, sample, **kwargs):
        finalized = self._generate(sample, **kwargs)
        eager = [(i, j) for i, hypotheses in enumerate(finalized)
                 for j in range(min(self.aligned_nbest, len(hypotheses)))]
        for (i, j), alignment in zip(eager, self.alignments(sample, finalized, eager)):
            finalized[i][j]["alignment"] = alignment
        for i, hypotheses in enumerate(finalized):
            for j in range(self.aligned_nbest, len(hypotheses)):
                hypotheses[j] = LazilyAligned(hypotheses[j], self, sample, finalized, (i, j))
        return finalized

    def alignments(self, sample, finalized, which):
        """The alignments of the hypotheses ``which`` ((sentence, rank) pairs),
        from one teacher-forced pass over them."""
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        hypotheses = [finalized[i][j]["tokens"] for i, j in which]
        sentence_of = torch.tensor([i for i, _ in which], device=src_tokens.device)
        prev_output_tokens = data_utils.collate_tokens(hypotheses, self.pad, self.eos, self.left_pad_target,
                                                       move_eos_to_beginning=True)
        tgt_tokens = data_utils.collate_tokens(hypotheses, self.pad, self.eos, self.left_pad_target,
                                               move_eos_to_beginning=False)
        attention = None
        for model in self.model.models:  # an ensemble's attention is its models' mean, as fairseq's
            encoder_out = model.encoder.forward_torchscript(net_input)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, sentence_of)
            extra = model.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=True,
                                  src_lengths=net_input.get("src_lengths"))[1]
            attention = extra["attn"][0] if attention is None else attention + extra["attn"][0]
        if len(self.model.models) > 1:
            attention = attention / len(self.model.models)
        attention, tgt_tokens = attention.cpu(), tgt_tokens.cpu()
        src_tokens = src_tokens.cpu().index_select(0, sentence_of.cpu())
        if self.extract_alignment is utils.extract_hard_alignment:
            return hard_alignments(attention, src_tokens, tgt_tokens, self.pad, self.eos)
        return [self.extract_alignment(attention[r], src_tokens[r], tgt_tokens[r], self.pad, self.eos)
                for r in range(len(which))]


class LazilyAligned(dict):
    """A hypothesis below the ``--nbest`` that fairseq-generate prints: its
    ``"alignment"`` is computed when first read (as fairseq's, from a pass
    over it alone)."""

    def __init__(self, hypothesis, generator, sample, finalized, where):
        super().__init__((key, value) for key, value in hypothesis.items() if key != "alignment")
        self._source = (generator, sample, finalized, where)

    def __reduce__(self):  # to another process (a decoding worker's result): aligned now
        return dict, (dict(self, alignment=self["alignment"]),)

    def __missing__(self, key):
        if key != "alignment":
            raise KeyError(key)
        generator, sample, finalized, where = self._source
        with torch.no_grad():
            self["alignment"] = generator.alignments(sample, finalized, [where])[0]
        return self["alignment"]


def hard_alignments(attention: Tensor, src_tokens: Tensor, tgt_tokens: Tensor, pad: int, eos: int):
    """fairseq's ``utils.extract_hard_alignment`` for every row at once: per
    target token (neither pad nor EOS), the (source word, target word) pair
    of its strongest source token (neither pad nor EOS), words counted from
    0 over the tokens that are neither. fairseq's compares each token with a
    Python list, one tensor at a time: most of --print-alignment's cost."""
    src_invalid = src_tokens.eq(pad) | src_tokens.eq(eos)
    tgt_valid = tgt_tokens.ne(pad) & tgt_tokens.ne(eos)
    src_word = (~src_invalid).long().cumsum(1) - 1  # token -> word, as get_token_to_word_mapping
    tgt_word = tgt_valid.long().cumsum(1) - 1
    scores = attention.masked_fill(src_invalid.unsqueeze(1), float("-inf"))
    strongest = scores.max(dim=2)[1]  # (rows, tgt_len)
    aligned_src = src_word.gather(1, strongest)
    found = []
    for row in range(attention.size(0)):
        if not bool(tgt_valid[row].any()) or bool(src_invalid[row].all()):
            found.append([])
            continue
        keep = tgt_valid[row]
        found.append(list(zip(aligned_src[row][keep].tolist(), tgt_word[row][keep].tolist())))
    return found


def fallback_reason(models, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None) -> Optional[str]:
    """Why fairseq's generator must decode ``models`` with generation options
    ``args`` (None: this search supports them)."""
    extra = extra_gen_cls_kwargs or {}
    checks = (
        (getattr(args, "sampling", False) and getattr(args, "prefix_size", 0) > 0, "--sampling with --prefix-size"),
        # (each sentence draws from a torch.Generator of its own, a CPU one)
        (getattr(args, "sampling", False) and engines.on_cuda(models), "--sampling on CUDA"),
        (getattr(args, "diverse_beam_groups", -1) > 0, "--diverse-beam-groups"),
        (getattr(args, "diversity_rate", -1) > -1, "--diversity-rate"),
        (getattr(args, "match_source_len", False), "--match-source-len"),
        (bool(getattr(args, "constraints", False)), "--constraints"),
        (prefix_allowed_tokens_fn is not None or getattr(args, "prefix_allowed_tokens_fn", None),
         "prefix_allowed_tokens_fn"),
        (extra.get("lm_model") is not None, "--lm-path (language model fusion)"),
        (getattr(args, "print_alignment", False)
         and not all(getattr(model, "full_context_alignment", False) for model in models),
         "--print-alignment of a model that aligns from per-step attention"),
    )
    return next((what for needed, what in checks if needed), None)
