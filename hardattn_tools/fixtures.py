"""What the benchmarks decode and train on: models (trained checkpoints or
random-weight architectures), tasks, batches (test sets, random sources,
training batches) and fairseq's generator, set up as fairseq-generate does."""

import argparse
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn.errors import ConfigError
from fairseq_hardattn.compat import loading


@dataclass
class ModelSpec:
    name: str
    checkpoint: Optional[str] = None
    arch: Optional[str] = None
    overrides: Dict = field(default_factory=dict)


def parse_model_specs(model_args, arch_args, override_args) -> List[ModelSpec]:
    specs = []
    for text, key in [(t, "checkpoint") for t in model_args or []] + [
        (t, "arch") for t in arch_args or []
    ]:
        name, sep, value = text.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"expected NAME=VALUE, got {text!r}")
        if any(s.name == name for s in specs):
            raise ConfigError(f"model name {name!r} given twice")
        specs.append(ModelSpec(name=name, **{key: value}))
    for text in override_args or []:
        name, sep, value = text.partition("=")
        spec = next((s for s in specs if s.name == name), None)
        if spec is None:
            raise ConfigError(f"--override names unknown model {name!r}")
        try:
            spec.overrides = dict(eval(value, {"__builtins__": {}}))
        except Exception:
            raise ConfigError(f"--override {name}: not a Python dict: {value!r}") from None
    if not specs:
        raise ConfigError("give at least one --model NAME=CHECKPOINT or --arch NAME=ARCH")
    return specs


def setup_translation_task(data_dir: str):
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [data_dir, "--task", "translation", "--cpu"])
    return tasks.setup_task(args)


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def check_device(device: str):
    """A one-line error where the device is not there."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch finds no CUDA GPU on this machine "
                          "(the GPU benchmarks need one; use --device cpu)")


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's (its model name, and whether it has AMX:
    int8 decoding packs for oneDNN there), for a benchmark's settings."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    name = "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return f"{name} ({'with' if amx else 'no'} AMX)"


def to_device(sample, device: str):
    """A batch (nested dicts of tensors) on ``device``."""
    if isinstance(sample, dict):
        return {key: to_device(value, device) for key, value in sample.items()}
    return sample.to(device) if torch.is_tensor(sample) else sample


class Ensemble(torch.nn.ModuleList):
    """Several checkpoints decoded as one (``--model NAME=a.pt:b.pt``, as
    fairseq-generate's ``--path a.pt:b.pt``)."""

    def prepare_for_inference_(self, cfg):
        for model in self:
            model.prepare_for_inference_(cfg)


def members(model) -> List["torch.nn.Module"]:
    """The models a benchmark's model decodes with: an ensemble's, or itself."""
    return list(model) if isinstance(model, Ensemble) else [model]


def every_member(models: Dict[str, "torch.nn.Module"]) -> List["torch.nn.Module"]:
    """The models a benchmark's models decode with, ensembles' members included."""
    return [member for model in models.values() for member in members(model)]


def set_decoding_engine(models: Dict[str, "torch.nn.Module"], engine: Optional[str]):
    """``--decoding-engine`` for every model of this plugin (fairseq's own
    models have none: they decode as fairseq does)."""
    if engine is None:
        return
    for model in every_member(models):
        if hasattr(model.decoder, "decoding_engine"):
            model.decoder.decoding_engine = engine


def load_models(specs: List[ModelSpec], task, arch_overrides=None, device="cpu", dtype="fp32",
                keep_small_presets=False):
    """name -> model on ``device`` in ``dtype``, built from a checkpoint or an
    arch (``arch_overrides`` on every arch, or only on those that are not a
    ``_small`` preset with ``keep_small_presets``)."""
    models = {}
    for spec in specs:
        torch.manual_seed(0)
        if spec.checkpoint:
            paths = spec.checkpoint.split(os.pathsep)  # a:b: an ensemble
            for path in paths:
                if not os.path.exists(path):
                    raise ConfigError(f"checkpoint not found: {path}")
            with loading():  # as fairseq-generate with the plugin loads them
                loaded, _ = checkpoint_utils.load_model_ensemble(
                    paths, arg_overrides=spec.overrides or None, task=task
                )
            model = loaded[0] if len(loaded) == 1 else Ensemble(loaded)
        else:
            if spec.arch not in ARCH_MODEL_REGISTRY:
                raise ConfigError(f"unknown architecture {spec.arch!r}")
            overrides = {} if keep_small_presets and spec.arch.endswith("_small") else arch_overrides
            args = argparse.Namespace(arch=spec.arch, **(overrides or {}))
            for key, value in spec.overrides.items():
                setattr(args, key, value)
            ARCH_CONFIG_REGISTRY[spec.arch](args)
            model = ARCH_MODEL_REGISTRY[spec.arch].build_model(args, task)
        models[spec.name] = model.to(device=device, dtype=DTYPES[dtype])
    return models


def test_batches(task, subset, batch_size, max_sentences=None, max_positions=(1024, 1024)):
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    iterator = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size, max_positions=max_positions,
        ignore_invalid_inputs=True, seed=1,
    ).next_epoch_itr(shuffle=False)
    batches, count = [], 0
    for sample in iterator:
        if max_sentences is not None and count >= max_sentences:
            break
        if max_sentences is not None and count + sample["nsentences"] > max_sentences:
            keep = max_sentences - count
            sample = {
                "id": sample["id"][:keep],
                "nsentences": keep,
                "net_input": {k: v[:keep] for k, v in sample["net_input"].items()},
                "target": None if sample["target"] is None else sample["target"][:keep],
            }
        batches.append(sample)
        count += sample["nsentences"]
    return batches


def random_batches(dictionary, num_sentences, src_len, batch_size, seed=1):
    """Sources of exactly ``src_len`` tokens (the last one EOS), in batches."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for start in range(0, num_sentences, batch_size):
        n = min(batch_size, num_sentences - start)
        src = torch.randint(dictionary.nspecial, len(dictionary), (n, src_len), generator=g)
        src[:, -1] = dictionary.eos()
        batches.append({
            "id": torch.arange(start, start + n),
            "nsentences": n,
            "net_input": {"src_tokens": src, "src_lengths": torch.full((n,), src_len)},
            "target": None,
        })
    return batches


# fairseq-generate's default length limit (--max-len-a, --max-len-b): outputs
# of at most a * source length + b tokens
GENERATE_MAX_LEN = (0.0, 200)


def make_generator(model, dictionary, beam, fixed_output_len=None, max_len=GENERATE_MAX_LEN):
    """The generator fairseq-generate builds for ``model`` (the plugin's beam
    search where the model's --decoding-engine asks for it, else fairseq's)."""
    from fairseq_hardattn.decoding import generator_class

    if fixed_output_len:
        # EOS is blocked until min_len and forced at max_len: same work for all
        settings = dict(beam_size=beam, min_len=fixed_output_len, max_len_a=0, max_len_b=fixed_output_len)
    else:
        settings = dict(beam_size=beam, max_len_a=max_len[0], max_len_b=max_len[1])
    chosen = generator_class(members(model), argparse.Namespace())
    generator_cls = chosen[0] if chosen else SequenceGenerator
    return generator_cls(members(model), dictionary, **settings)


def prepare_for_decoding(model, beam, dtype="fp32"):
    """What fairseq-generate does to a model before decoding
    (``prepare_for_inference_``: int8 Linear layers where it asks for them)."""
    model.eval()
    on_cpu = next(model.parameters()).device.type == "cpu"
    cfg = argparse.Namespace(
        generation=argparse.Namespace(beam=beam, print_alignment=False, no_beamable_mm=False,
                                      retain_dropout=False),
        common=argparse.Namespace(fp16=dtype == "fp16", bf16=False, cpu=on_cpu))
    model.prepare_for_inference_(cfg)
    return model


def synthetic_dictionary(size):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - d.nspecial):
        d.add_symbol(f"w{i}")
    return d


class DictionaryTask:
    """What ``build_model`` and the batch builders need of a translation
    task, for models with random weights and no data directory."""

    def __init__(self, d):
        self.source_dictionary = self.target_dictionary = d


def training_batches(task, count, max_tokens, dictionary, seed=1):
    if task is not None and not isinstance(task, DictionaryTask):
        task.load_dataset("train")
        it = task.get_batch_iterator(dataset=task.dataset("train"), max_tokens=max_tokens,
                                     max_positions=(1024, 1024), ignore_invalid_inputs=True,
                                     seed=seed).next_epoch_itr(shuffle=False)
        return [b for _, b in zip(range(count), it)]
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        n, length = max(1, max_tokens // 24), 24
        src = torch.randint(dictionary.nspecial, len(dictionary), (n, length), generator=g)
        tgt = torch.randint(dictionary.nspecial, len(dictionary), (n, length), generator=g)
        prev = torch.cat([torch.full((n, 1), dictionary.eos()), tgt[:, :-1]], 1)
        batches.append({"net_input": {"src_tokens": src, "src_lengths": torch.full((n,), length),
                                      "prev_output_tokens": prev}, "target": tgt})
    return batches
