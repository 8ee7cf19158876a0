"""fairseq's batches, able to read ahead: so that the plugin's search can
hand the batches after the one it was asked for to worker processes
(``workers``) while it decodes that one.

fairseq-generate, the hub and ``--eval-bleu`` iterate a ``CountingIterator``
and hand the generator one batch at a time; fairseq-interactive iterates its
``make_batches``. Both can read ahead on request (``take_ahead``: the
iterators of a task the engine attached to, ``attach``; fairseq-interactive's
batches, ``InteractiveBatches``, in a command run with the plugin) and note,
per thread, the batch they yielded last (``note_yielded``), so that the
search finds the batches after its own (``batches_after``). What they yield,
and its order, is unchanged.
"""

import collections
import functools
import threading
import weakref
from typing import Dict, List

import torch
from fairseq.data import iterators

_last = threading.local()


def source_tokens(batch):
    """A batch's source tokens: a sample's ``net_input``, or
    fairseq-interactive's ``Batch``."""
    if isinstance(batch, dict):
        net_input = batch.get("net_input")
        return net_input.get("src_tokens") if isinstance(net_input, dict) else None
    return getattr(batch, "src_tokens", None)


def note_yielded(source, batch):
    """``source`` (a lookahead source: ``take_ahead(n)``) yielded ``batch`` in
    this thread; weak references, so nothing is kept alive."""
    tokens = source_tokens(batch)
    if torch.is_tensor(tokens):
        _last.tokens, _last.source = weakref.ref(tokens), weakref.ref(source)


def batches_after(sample, n: int) -> List[Dict]:
    """Up to ``n`` samples that this thread's last lookahead source will yield
    after ``sample`` (read ahead now, yielded later as they are), or [] when
    ``sample`` is not that source's last batch."""
    tokens, source = getattr(_last, "tokens", None), getattr(_last, "source", None)
    tokens, source = tokens and tokens(), source and source()
    if tokens is None or source is None or tokens is not source_tokens(sample):
        return []
    return source.take_ahead(n)


class LookaheadCountingIterator(iterators.CountingIterator):
    """fairseq's ``CountingIterator`` with a read-ahead buffer: ``take_ahead``
    pulls batches now, ``__next__`` yields them in order later (and notes each
    batch it yields). An iterator of a task the engine attached to becomes
    one (``attach``); fairseq's class is unchanged."""

    def __next__(self):
        ahead = self.__dict__.get("_ahead")
        if ahead:
            if not self.has_next():
                raise StopIteration
            batch = ahead.popleft()
            self.n += 1
        else:
            batch = super().__next__()
        note_yielded(self, batch)
        return batch

    def take_ahead(self, n):
        ahead = self.__dict__.setdefault("_ahead", collections.deque())
        while len(ahead) < n and self.n + len(ahead) < self.total:
            try:
                ahead.append(next(self._itr))
            except StopIteration:
                break
        return [batch for batch in list(ahead)[:n] if isinstance(batch, dict) and "net_input" in batch]


def attach(task):
    """``task``'s batch iterators read ahead: the epochs its
    ``get_batch_iterator`` gives yield ``LookaheadCountingIterator``s (this
    task object only)."""
    get_batch_iterator = getattr(task, "get_batch_iterator", None)
    if get_batch_iterator is None:
        return

    @functools.wraps(get_batch_iterator)
    def reading_ahead(*args, **kwargs):
        epochs = get_batch_iterator(*args, **kwargs)
        if hasattr(epochs, "next_epoch_itr") and not getattr(epochs, "_reads_ahead", False):
            next_epoch_itr = epochs.next_epoch_itr

            @functools.wraps(next_epoch_itr)
            def next_epoch(*args, **kwargs):
                itr = next_epoch_itr(*args, **kwargs)
                if type(itr) is iterators.CountingIterator:
                    itr.__class__ = LookaheadCountingIterator
                return itr

            epochs.next_epoch_itr, epochs._reads_ahead = next_epoch, True
        return epochs

    task.get_batch_iterator = reading_ahead


# the line numbers of fairseq-interactive's batches while their source tokens
# live, by the tokens' id (its samples carry no ids; sampling seeds each
# sentence by its line)
_line_numbers: Dict[int, tuple] = {}


def _note_lines(tokens, lines: torch.Tensor):
    key = id(tokens)
    _line_numbers[key] = (weakref.ref(tokens, lambda _: _line_numbers.pop(key, None)), lines)


def with_ids(sample):
    """``sample`` with each sentence's index in the data as its ``id``: a
    sample's own, or the lines of fairseq-interactive's batch it was built
    from (a copy of the sample; else ``sample`` as it is)."""
    if not isinstance(sample, dict) or torch.is_tensor(sample.get("id")):
        return sample
    tokens = source_tokens(sample)
    entry = _line_numbers.get(id(tokens)) if torch.is_tensor(tokens) else None
    if entry is None or entry[0]() is not tokens:
        return sample
    return dict(sample, id=entry[1])


def sentence_ids(sample) -> List[int]:
    """Each sentence's index in the data (``with_ids``), else its row."""
    ids = with_ids(sample).get("id")
    return ids.tolist() if torch.is_tensor(ids) else list(range(source_tokens(sample).size(0)))


class InteractiveBatches:
    """fairseq-interactive's batches (``make_batches``), able to read ahead:
    the samples it builds from them are ``{"net_input": {"src_tokens",
    "src_lengths"}, "id"}``, as fairseq-interactive's own with its ids:
    ``first_line`` plus each line's index in this buffer."""

    def __init__(self, batches, first_line: int = 0):
        self._batches = iter(batches)
        self._ahead = collections.deque()
        self._first_line = first_line

    def __iter__(self):
        return self

    def _next_batch(self):
        batch = next(self._batches)
        ids = getattr(batch, "ids", None)
        if torch.is_tensor(ids) and torch.is_tensor(batch.src_tokens):
            _note_lines(batch.src_tokens, ids + self._first_line)
        return batch

    def __next__(self):
        batch = self._ahead.popleft() if self._ahead else self._next_batch()
        note_yielded(self, batch)
        return batch

    def take_ahead(self, n):
        while len(self._ahead) < n:
            try:
                self._ahead.append(self._next_batch())
            except StopIteration:
                break
        return [{"net_input": {"src_tokens": b.src_tokens, "src_lengths": b.src_lengths},
                 "id": b.ids + self._first_line}
                for b in list(self._ahead)[:n]
                # (lines of no source token besides the end of sentence are not decoded)
                if getattr(b, "constraints", None) is None and b.src_tokens.size(1) > 1]
