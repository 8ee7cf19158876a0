"""The hub (``fairseq_hardattn.from_pretrained``): fairseq's
``GeneratorHubInterface`` for a model of the plugin or of fairseq's
Transformer family, loaded with the plugin's checks (``compat.loading``), its
first-contact mistakes stopped in one line.

- A model directory, checkpoint or data directory that does not exist (or
  is a plain file) is one ``ConfigError`` naming it; fairseq fails with a
  ``TypeError`` about ``None``, or tarfile's ``ReadError: empty file``.
- ``translate`` and ``sample`` take a str or a list of str. fairseq iterates
  whatever it is given, so bytes became one translation per byte, a None in
  a list was translated as a sentence, and None or a number failed with a
  bare ``'NoneType' object is not iterable``; here anything else is a
  ``TypeError`` naming what was passed. An empty sentence (or one of
  spaces) gives an empty translation, as in the corpus command and
  fairseq-interactive (fairseq translated the end of sentence alone).
- ``generate`` builds its generator once for a set of options (fairseq
  deep-copies its generation options and builds a generator on every call)
  and decodes a single sentence as one batch made directly (fairseq builds
  a dataset, a batch iterator and a data loader for it): the same batch,
  the same hypotheses, a few milliseconds less a sentence.
- The text of a hypothesis's token ids (``string``, which ``decode`` calls)
  hands them to ``Dictionary.string`` as ints, as the plugin does in
  fairseq's commands (``text.token_ids_as_integers``): fairseq walks a
  tensor one 0-d tensor per id. The same text. A sentence's ids
  (``binarize``) are looked up as a list and its tokenizer keeps its options
  as a plain dataclass, as in the commands too (``text``): the same ids.

fairseq's own ``TransformerModel.from_pretrained(..., user_dir=...)`` loads the
plugin's checkpoints too (they decode with the plugin's engine), without
these checks: the plugin changes nothing of fairseq's own functions there.
"""

import os
import warnings
from collections import OrderedDict

import torch
from fairseq import hub_utils
from fairseq.data import Dictionary
from omegaconf import OmegaConf, open_dict

from ..errors import ConfigError, cased_input_warning
from .text import token_ids_as_integers, with_plain_options, words_looked_up_at_once

_looked_up_at_once = words_looked_up_at_once(Dictionary.encode_line)


def _check_paths(model_dir, checkpoint_file, data):
    if not isinstance(model_dir, str) or model_dir.startswith(("http://", "https://")):
        return
    if not os.path.exists(model_dir):
        raise ConfigError(f"from_pretrained: no model directory {model_dir!r}")
    missing = [name for name in checkpoint_file.split(os.pathsep)
               if not os.path.isfile(os.path.join(model_dir, name))]
    if missing:
        found = sorted(n for n in os.listdir(model_dir) if n.endswith(".pt"))
        raise ConfigError(f"from_pretrained: no checkpoint_file {missing[0]!r} in "
                          f"{model_dir} (it has: {', '.join(found) or 'no .pt file'})")
    _check_hub_data(model_dir, data)


def _check_hub_data(model_dir, data):
    """``data_name_or_path`` as fairseq resolves it (a path starting with '.'
    is relative to the model directory): a data directory, or an archive of
    one."""
    if not isinstance(data, str) or data.startswith(("http://", "https://")):
        return
    path = os.path.join(model_dir, data) if data.startswith(".") else data
    if not os.path.exists(path):
        raise ConfigError(f"from_pretrained: no data directory {path!r} (data_name_or_path: the "
                          "directory fairseq-preprocess wrote, with the dict.*.txt files)")
    if os.path.isfile(path):
        import tarfile

        if not tarfile.is_tarfile(path):
            raise ConfigError(f"from_pretrained: data_name_or_path {path!r} is a file, not a data "
                              "directory (the one fairseq-preprocess wrote) or an archive of one")


def _sentences_checked(method, sentences):
    """``sentences`` as the hub's ``translate`` / ``sample`` take them (a str,
    or a list of str: any iterable of str, read once); else a ``TypeError``
    naming what was passed."""
    accepted = "a str or a list of str"
    if isinstance(sentences, str):
        return sentences
    if isinstance(sentences, (bytes, bytearray)):
        raise TypeError(f"{method}: expects {accepted}, got {type(sentences).__name__} "
                        f"({bytes(sentences[:40])!r}): decode it first, e.g. .decode('utf-8')")
    try:
        sentences = list(sentences)
    except TypeError:
        raise TypeError(f"{method}: expects {accepted}, got {type(sentences).__name__} "
                        f"({sentences!r:.60})") from None
    for i, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"{method}: sentence {i + 1} of {len(sentences)} is "
                            f"{type(sentence).__name__} ({sentence!r:.60}), not a str "
                            f"(it expects {accepted})")
    return sentences


class CheckedHub(hub_utils.GeneratorHubInterface):
    """fairseq's hub interface, whose ``translate`` and ``sample`` check what
    they are given, and whose ``string`` reads the ids as ints."""

    string = token_ids_as_integers(hub_utils.GeneratorHubInterface.string)

    def __init__(self, cfg, task, models):
        super().__init__(cfg, task, models)
        with_plain_options(self.tokenizer)
        with_plain_options(self.bpe)
        self.case_checked = False  # (the first sentences given, once)

    def binarize(self, sentence: str) -> torch.LongTensor:
        if type(self.src_dict).encode_line is not Dictionary.encode_line:  # (a dictionary's own encode_line)
            return super().binarize(sentence)
        return _looked_up_at_once(self.src_dict, sentence, add_if_not_exist=False).long()

    def translate(self, sentences, beam: int = 5, verbose: bool = False, **kwargs):
        return self._sample("translate", sentences, beam, verbose, **kwargs)

    def sample(self, sentences, beam: int = 1, verbose: bool = False, **kwargs):
        return self._sample("sample", sentences, beam, verbose, **kwargs)

    def _sample(self, method, sentences, beam, verbose, **kwargs):
        """fairseq's ``sample``, where an empty sentence (or one of spaces)
        gives an empty translation, as in the corpus command and
        fairseq-interactive, instead of a translation of the end of sentence."""
        sentences = self._case_checked(_sentences_checked(method, sentences))
        if isinstance(sentences, str):
            return self._sample(method, [sentences], beam, verbose, **kwargs)[0]
        given = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        texts = [""] * len(sentences)
        if given:
            translated = super().sample([sentences[i] for i in given], beam, verbose, **kwargs)
            for i, text in zip(given, translated):
                texts[i] = text
        return texts

    # generators kept, by the options that built them
    KEPT_GENERATORS = 8

    def generate(self, tokenized_sentences, beam=5, verbose=False, skip_invalid_size_inputs=False,
                 inference_step_args=None, prefix_allowed_tokens_fn=None, **kwargs):
        if torch.is_tensor(tokenized_sentences) and tokenized_sentences.dim() == 1:
            return self.generate(tokenized_sentences.unsqueeze(0), beam=beam, verbose=verbose, **kwargs)[0]
        generator = None if verbose or prefix_allowed_tokens_fn is not None else self._generator(beam, kwargs)
        if generator is None:  # (fairseq's own call: what it prints, or options that are not kept)
            return super().generate(tokenized_sentences, beam, verbose, skip_invalid_size_inputs,
                                    inference_step_args, prefix_allowed_tokens_fn, **kwargs)
        if len(tokenized_sentences) == 1 and self._fits(tokenized_sentences[0]):
            batches = [self._one_sentence_batch(tokenized_sentences[0])]
        else:
            batches = self._build_batches(tokenized_sentences, skip_invalid_size_inputs)
        results = []
        for batch in batches:
            batch = hub_utils.utils.apply_to_sample(lambda t: t.to(self.device), batch)
            translations = self.task.inference_step(generator, self.models, batch, **(inference_step_args or {}))
            results.extend(zip(batch["id"].tolist(), translations))
        if generator.__dict__.get("_pool") is not None:  # (the weights its workers forked with)
            self._pool_weights = self._weights()
        return [hypotheses for _, hypotheses in sorted(results, key=lambda x: x[0])]

    def _generator(self, beam, kwargs):
        """The generator fairseq's ``generate`` would build for these options,
        built once while the hub's generation options, the options given,
        torch's seed and the models' weights stay the same (a generator's
        worker processes decode with the weights they were forked with);
        None where an option is not hashable."""
        options = (beam, torch.initial_seed(), tuple(sorted(kwargs.items())), _snapshot(self.cfg.generation))
        try:
            hash(options)
        except TypeError:
            return None
        kept = self.__dict__.setdefault("_generators", OrderedDict())
        if any(generator.__dict__.get("_pool") is not None for generator in kept.values()):
            self._end_stale_workers(kept)
        if options not in kept:
            gen_args = OmegaConf.create(OmegaConf.to_container(self.cfg.generation))
            with open_dict(gen_args):
                gen_args.beam = beam
                for name, value in kwargs.items():
                    setattr(gen_args, name, value)
            kept[options] = self.task.build_generator(self.models, gen_args)
            while len(kept) > self.KEPT_GENERATORS:
                kept.popitem(last=False)
        kept.move_to_end(options)
        return kept[options]

    def _end_stale_workers(self, kept):
        """Where the models' weights changed since workers forked: the
        generators (and their workers) made anew."""
        if self.__dict__.get("_pool_weights") != self._weights():
            for generator in kept.values():
                generator.close_workers(workers_later=True)
            kept.clear()

    def _weights(self) -> tuple:
        """The models' parameters' memory and versions (an in-place change moves a version)."""
        parameters = self.__dict__.get("_model_parameters")
        if parameters is None:
            parameters = self._model_parameters = [p for model in self.models for p in model.parameters()]
        return tuple((p.data_ptr(), p._version) for p in parameters)

    def _fits(self, tokens) -> bool:
        """Whether fairseq's batch iterator would take this sentence as it is:
        within the model's positions and the batch's tokens."""
        most = self.max_positions
        most = most[0] if isinstance(most, (tuple, list)) else most
        max_tokens = self.cfg.dataset.max_tokens
        return (most is None or tokens.numel() <= most) and (max_tokens is None or tokens.numel() <= max_tokens)

    def _one_sentence_batch(self, tokens):
        """The batch fairseq's iterator makes of this one sentence."""
        dataset = self.task.build_dataset_for_inference([tokens], torch.LongTensor([tokens.numel()]))
        return dataset.collater([dataset[0]])

    def _case_checked(self, sentences):
        """``sentences``, with one warning on the first call where the model
        learned from lowercased text and they are mostly cased."""
        if not self.case_checked:
            self.case_checked = True
            warning = cased_input_warning(self.src_dict, [sentences] if isinstance(sentences, str) else sentences,
                                          0, "the sentences given")
            if warning:
                warnings.warn(warning, stacklevel=3)
        return sentences


def _snapshot(options) -> tuple:
    """The values of an omegaconf section, hashable: read from its nodes (its
    public ``to_container`` is a hundred times slower, felt on each sentence)."""
    try:
        nodes = vars(options)["_content"]
        return tuple((key, repr(node._value())) for key, node in nodes.items())
    except (KeyError, AttributeError, TypeError):
        return tuple(sorted(repr(OmegaConf.to_container(options)).split(", ")))


def from_pretrained(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
    """A checkpoint of the plugin (or of fairseq's Transformer family) as a
    hub interface: fairseq's ``TransformerModel.from_pretrained`` with the
    plugin's checks; keyword arguments as fairseq's (``bpe``, ``tokenizer``,
    ``source_lang``, ...) and model options to decode with
    (``int8_decoding=True``, ``decoding_workers=1``, the attention kinds)."""
    from . import loading

    _check_paths(model_name_or_path, checkpoint_file, data_name_or_path)
    with loading():
        loaded = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                           **kwargs)
    return CheckedHub(loaded["args"], loaded["task"], loaded["models"])
