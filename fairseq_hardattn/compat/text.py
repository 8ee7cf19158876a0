"""The text fairseq's commands read and print, in a fairseq command run with
the plugin (and the corpus command): the same text, without the per-token
and per-line costs that make the command's own process a sizeable share of
the CPU next to the engine's workers.

- ``Dictionary.string`` walks a tensor of token ids one 0-d tensor at a
  time, which cost fairseq-generate's loop several times the engine's
  decoding of a large set. ``token_ids_as_integers`` hands it the ids as a
  list of ints: the same text, character for character.
- ``Dictionary.encode_line``, on every line fairseq-interactive reads, sets
  its IntTensor one id at a time. ``words_looked_up_at_once`` looks the
  words up in a list and makes the tensor once: the same ids.
- fairseq's Moses tokenizer reads two of its options through OmegaConf on
  every line. ``options_read_once`` gives a tokenizer or BPE built by the
  task its options as a plain dataclass: the same values.

The plugin's hub reads its sentences the same way (``hub.CheckedHub``).
"""

import dataclasses
import functools

import torch
from fairseq.data import dictionary
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

_INTEGER_TYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def token_ids_as_integers(string):
    """Wrap ``Dictionary.string(tensor, ...)``: a 1-D integer tensor is read
    as the list of its ids (a 2-D one is a line per row, each row through
    this wrapper again)."""
    @functools.wraps(string)
    def text(self, tensor, *args, **kwargs):
        if torch.is_tensor(tensor) and tensor.dim() == 1 and tensor.dtype in _INTEGER_TYPES:
            tensor = tensor.tolist()
        return string(self, tensor, *args, **kwargs)
    return text


def words_looked_up_at_once(encode_line):
    """Wrap ``Dictionary.encode_line``: a line encoded without adding words
    (how sources are read) is looked up as a list; adding words, a
    ``consumer``, another tokenizer or a dictionary with its own ``index``
    go through fairseq's loop."""
    @functools.wraps(encode_line)
    def encoded(self, line, line_tokenizer=dictionary.tokenize_line, add_if_not_exist=True, consumer=None,
                append_eos=True, reverse_order=False):
        if (add_if_not_exist or consumer is not None or line_tokenizer is not dictionary.tokenize_line
                or type(self).index is not dictionary.Dictionary.index):
            return encode_line(self, line, line_tokenizer, add_if_not_exist, consumer, append_eos, reverse_order)
        words = line_tokenizer(line)
        if reverse_order:
            words.reverse()
        indices, unknown = self.indices, self.unk_index
        ids = [indices.get(word, unknown) for word in words]
        if append_eos:
            ids.append(self.eos_index)
        return torch.tensor(ids, dtype=torch.int32)
    return encoded


def with_plain_options(encoder):
    """``encoder`` (a tokenizer or BPE, or None), its options (``cfg``) made
    the plain dataclass they were declared as; left as they are where one is
    missing or does not resolve (the encoder reads it as before, or fails as
    before)."""
    options = getattr(encoder, "cfg", None)
    if isinstance(options, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(options)):
        try:
            encoder.cfg = OmegaConf.to_object(options)
        except OmegaConfBaseException:
            pass
    return encoder


def options_read_once(build):
    """Wrap ``FairseqTask.build_tokenizer`` / ``build_bpe``: the object built
    keeps its options as a plain dataclass (``with_plain_options``)."""
    @functools.wraps(build)
    def built(self, cfg):
        return with_plain_options(build(self, cfg))
    return built
