"""fairseq's generation, in a fairseq command run with the plugin.

- ``--no-repeat-ngram-size``: fairseq's Python n-gram blocker (every CPU
  run, and GPU runs of this build, which ships no CUDA extension for it)
  compares the last n-1 entries of the whole preallocated token buffer
  (padding) with the hypothesis, so it bans nothing and the option silently
  does nothing (fairseq issue 5206). ``generated_tokens_only`` hands it the
  tokens generated so far.
- ``--fp16`` without a GPU would decode in half precision on the CPU (other
  hypotheses, several times slower) and ``--bf16`` is not applied by
  fairseq's decoding tools at all: both stop in one line
  (``cpu_precision_checked``).
"""

import functools

import torch

from ..errors import ConfigError


def generated_tokens_only(no_repeat_ngram):
    """Wrap ``NGramRepeatBlock._no_repeat_ngram``: it reads the last n-1
    tokens of what it is given, so give it the tokens up to this step."""
    @functools.wraps(no_repeat_ngram)
    def blocked(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        return no_repeat_ngram(self, tokens[:, : step + 1], lprobs, bsz, beam_size, step)
    return blocked


def cpu_precision_checked(prepare_for_inference):
    """Wrap ``BaseFairseqModel.prepare_for_inference_``, which fairseq-generate,
    fairseq-interactive and the hub call on every model before decoding:
    ``--fp16`` without a GPU would decode in half precision on the CPU (other
    hypotheses, several times slower) and ``--bf16`` is not applied by
    fairseq's decoding tools at all; both stop in one line instead."""

    @functools.wraps(prepare_for_inference)
    def prepare(self, cfg):
        common = getattr(cfg, "common", None)
        on_cpu = getattr(common, "cpu", False) or not torch.cuda.is_available()
        if getattr(common, "fp16", False) and on_cpu:
            raise ConfigError("--fp16 needs a CUDA GPU to decode (on the CPU fairseq would decode in "
                              "half precision: other hypotheses, several times slower): decode "
                              "without --fp16")
        if getattr(common, "bf16", False):
            raise ConfigError("--bf16 is not applied by fairseq's decoding tools (they decode in "
                              "float32, or in float16 with --fp16 on a GPU): decode without --bf16")
        return prepare_for_inference(self, cfg)

    return prepare
