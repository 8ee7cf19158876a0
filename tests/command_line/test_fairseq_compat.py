"""Pins for each fairseq behaviour ``fairseq_hardattn.compat`` works
around, where each applies (a fairseq command, ``compat.loading``, never a
plain import), and the TensorBoard logging a fairseq user expects."""

import dataclasses
import re
import struct
import subprocess
import sys
import warnings

import omegaconf
import torch
from fairseq import checkpoint_utils, ngram_repeat_block
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn import compat
from fairseq_hardattn.compat import command_line, generation, text

from conftest import REPO, USER_DIR, decisive_model, make_dictionary, random_batch, run_cli, tool_env, train

# a plain Python process: what fairseq and the standard library hold before
# and after the plugin is imported and translates through the hub
UNCHANGED_BY_IMPORT = """
import argparse, importlib, inspect, pkgutil, sys, warnings
import fairseq, fairseq_cli.interactive, fairseq_cli.generate
from fairseq import hub_utils
import torch.fx.experimental.symbolic_shapes  # torch's first forward imports it, and SymPy adds a warning filter

def functions():
    found = {("sys", "excepthook"): sys.excepthook, ("warnings", "filters"): tuple(warnings.filters)}
    for name, value in vars(argparse.ArgumentParser).items():
        found[("argparse.ArgumentParser", name)] = value
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith(("fairseq.", "fairseq_cli.")) or module is None:
            continue
        for name, value in list(vars(module).items()):
            if inspect.isfunction(value):
                found[(module_name, name)] = value
            elif inspect.isclass(value) and value.__module__ == module_name:
                for attribute, member in vars(value).items():
                    if inspect.isfunction(member):
                        found[(module_name + "." + name, attribute)] = member
    return found

before = functions()
import fairseq_hardattn
hub = fairseq_hardattn.from_pretrained(@directory@, checkpoint_file=@name@, data_name_or_path=@data@)
assert hub.translate("s1 s2", beam=2)
from fairseq.models.transformer import TransformerModel
fairseqs = TransformerModel.from_pretrained(@directory@, checkpoint_file=@name@, data_name_or_path=@data@,
                                            user_dir=@user_dir@)
assert fairseqs.translate(["s1 s2"], beam=2)
after = functions()
changed = sorted(key for key in before
                 if (after.get(key) != before[key] if key == ("warnings", "filters") else after.get(key) is not before[key]))
print("changed:", changed)
"""


def test_importing_the_plugin_and_translating_through_the_hub_change_no_function_of_fairseq(
        trained_checkpoints, reorder_data):
    """A notebook, a server: argparse's parser, sys.excepthook, the warning
    filters and every function and method of fairseq's modules are what they
    were, after the plugin's hub and fairseq's own hub translated."""
    hard = trained_checkpoints["hard"]
    code = UNCHANGED_BY_IMPORT
    for key, value in dict(directory=str(hard.parent), name=hard.name, data=str(reorder_data),
                           user_dir=USER_DIR).items():
        code = code.replace(f"@{key}@", repr(value))
    proc = subprocess.run([sys.executable, "-c", code], env=tool_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "changed: []", proc.stdout[-2000:]


def test_loading_checks_checkpoints_within_and_leaves_fairseqs_functions_after():
    originals = (checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.overwrite_args_by_name)
    with compat.loading():
        inside = (checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.overwrite_args_by_name)
        assert all(getattr(f, "_fairseq_hardattn", False) for f in inside)
        with compat.loading():  # nested: the same checks, not wrapped twice
            assert (checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.overwrite_args_by_name) == inside
        assert (checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.overwrite_args_by_name) == inside
    assert (checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.overwrite_args_by_name) == originals


def test_fairseqs_library_noise_is_filtered_and_real_warnings_are_not():
    with warnings.catch_warnings(record=True) as caught:
        command_line.quiet_fairseq_noise()
        warnings.warn("hydra.experimental.initialize() is no longer experimental. "
                      "Use hydra.initialize()", UserWarning)
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                      "then device pinned memory won't be used.", UserWarning)
        warnings.warn("a warning about the user's own run", UserWarning)
    assert [str(w.message) for w in caught] == ["a warning about the user's own run"]


def test_the_cli_prints_no_library_noise(reorder_data, tmp_path):
    proc = train(reorder_data, tmp_path, "transformer_hard_dec", updates=1)
    for _, pattern in command_line.FAIRSEQ_NOISE:
        assert not re.search(pattern, proc.stderr, flags=re.M), pattern
    assert "Please install tensorboardX" not in proc.stderr + proc.stdout
    assert "DEBUG:hydra" not in proc.stderr


def tensorboard_scalars(path):
    """(tag, value) of every scalar in a TensorBoard event file (TFRecord
    frames: length, its CRC, an Event proto, its CRC)."""
    from tensorboardX.proto import event_pb2

    data, offset, scalars = path.read_bytes(), 0, []
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        event = event_pb2.Event.FromString(data[offset + 12: offset + 12 + length])
        offset += 12 + length + 4
        scalars += [(value.tag, value.simple_value) for value in event.summary.value]
    return scalars


def test_tensorboard_logdir_records_the_training_loss(reorder_data, tmp_path):
    logdir = tmp_path / "tensorboard"
    train(reorder_data, tmp_path / "run", "transformer_hard_dec", "--tensorboard-logdir", logdir,
          updates=3)
    files = sorted((logdir / "train_inner").glob("events.out.tfevents.*"))
    assert files, sorted(p.name for p in logdir.rglob("*"))
    losses = [value for tag, value in tensorboard_scalars(files[0]) if tag == "loss"]
    assert len(losses) == 3 and all(value > 0 for value in losses)


def test_user_dir_from_anywhere(tmp_path):
    """``python -m fairseq_hardattn`` prints the directory to pass as --user-dir."""
    proc = run_cli("python", "-m", "fairseq_hardattn", cwd=tmp_path)
    assert proc.stdout.strip().endswith("fairseq_hardattn")


def readme_python_example():
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_quickstart_and_the_readmes_python_example(reorder_data, tmp_path):
    """examples/quickstart.sh from raw text to sacreBLEU (one epoch), then the
    README's Python example, as written, on what it made."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):  # the README's languages: en -> de
        for side, lang in (("src", "en"), ("tgt", "de")):
            (raw / f"{split}.{lang}").write_text(
                (reorder_data.parent / "raw" / f"{split}.{side}").read_text())
    script = REPO / "examples" / "quickstart.sh"
    proc = subprocess.run(["bash", str(script), str(raw), "en", "de", "work/quickstart"],
                          cwd=tmp_path, env=tool_env(EPOCHS="1", BPE_MERGES="50"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.fullmatch(r"\d+(\.\d+)?", proc.stdout.strip().splitlines()[-1])  # the BLEU score
    # one epoch of a tiny corpus: warmup follows the run's updates, and the script says it is short
    updates = int(re.search(r"quickstart: warning: about (\d+) updates", proc.stderr).group(1))
    warmup = int(re.search(r"for 1 epochs \((\d+) warmup updates\)", proc.stderr).group(1))
    assert 1 <= warmup <= max(1, updates // 4) and "too few to learn to translate well" in proc.stderr
    assert "detokenize" not in proc.stderr  # sacreBLEU's warning about tokenized input
    example = subprocess.run([sys.executable, "-c", readme_python_example()], cwd=tmp_path,
                             env=tool_env(), capture_output=True, text=True, timeout=600)
    assert example.returncode == 0, example.stderr[-3000:]
    translations, aligned = example.stdout.strip().splitlines()[-2:]
    assert eval(translations) and all(isinstance(t, str) for t in eval(translations))
    assert re.search(r" \[\(\d+, 0\), \(\d+, 1\)", aligned), aligned  # (source, target) pairs


def test_no_repeat_ngram_size_bans_repeated_ngrams(monkeypatch):
    """fairseq's Python n-gram blocker compared padding with the hypothesis and
    banned nothing (fairseq issue 5206): as a fairseq command with the plugin
    runs it, no hypothesis repeats a bigram under ``no_repeat_ngram_size=2``,
    and the option changes the output of a model that repeats itself without it."""
    blocker = ngram_repeat_block.NGramRepeatBlock
    monkeypatch.setattr(blocker, "_no_repeat_ngram", generation.generated_tokens_only(blocker._no_repeat_ngram))
    d = make_dictionary()
    model = decisive_model("transformer_hard_dec", d)  # one token dominates: repetitions
    src, lengths, _ = random_batch(d, [9, 7, 6, 4, 3], seed=2)

    def hypotheses(size):
        generator = SequenceGenerator([model], d, beam_size=4, max_len_b=10, no_repeat_ngram_size=size)
        with torch.no_grad():
            found = generator.generate(None, {"net_input": {"src_tokens": src, "src_lengths": lengths}})
        return [[h["tokens"].tolist() for h in hyps] for hyps in found]

    def repeats_a_bigram(tokens):
        bigrams = list(zip(tokens, tokens[1:]))
        return len(bigrams) != len(set(bigrams))

    free = hypotheses(0)
    assert any(repeats_a_bigram(t) for hyps in free for t in hyps)  # the case the option is for
    blocked = hypotheses(2)
    assert not any(repeats_a_bigram(t) for hyps in blocked for t in hyps)


def test_printed_text_is_fairseqs_own_from_a_list_of_the_ids():
    """fairseq-generate and fairseq-interactive print the text of token ids
    through ``Dictionary.string``, which walked a tensor one 0-d tensor at a
    time; with the ids handed over as ints the text is the same, character
    for character, for every option that changes it."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for word in ("a@@", "b", "c@@", "d", "e"):
        d.add_symbol(word)
    d.bos_index = d.bos()  # (a dictionary with a BOS drops it too)
    string = Dictionary.string
    wrapped = text.token_ids_as_integers(string)
    ids = [d.index(w) for w in ("a@@", "b", "c@@", "d")] + [d.unk(), d.bos(), d.pad(), d.index("e"), d.eos()]
    options = [dict(), dict(bpe_symbol="subword_nmt"), dict(escape_unk=True), dict(unk_string="<?>"),
               dict(extra_symbols_to_ignore=[d.index("e")]), dict(include_eos=True), dict(separator="_"),
               dict(bpe_symbol="subword_nmt", escape_unk=True, extra_symbols_to_ignore={d.pad()})]
    cases = 0
    for dtype in (torch.int64, torch.int32, torch.uint8):
        for tensor in (torch.tensor(ids, dtype=dtype), torch.tensor([ids, ids[::-1]], dtype=dtype)):
            for kwargs in options:
                assert wrapped(d, tensor, **kwargs) == string(d, tensor, **kwargs), (dtype, kwargs)
                cases += 1
    assert wrapped(d, torch.tensor([], dtype=torch.long)) == string(d, torch.tensor([], dtype=torch.long)) == ""
    assert wrapped(d, ids) == string(d, ids)  # a list, as it was
    assert string(d, torch.tensor(ids), escape_unk=True).split()[4] == "<<unk>>"  # the options did change it
    assert cases == 3 * 2 * len(options)


def test_sources_read_are_fairseqs_own_ids_looked_up_at_once():
    """fairseq-interactive's ``encode_line`` set each id of its tensor one at
    a time; looked up as a list, the ids and their type are fairseq's for
    every option, and the options that add words or watch them still go
    through fairseq's loop."""
    from fairseq.data import Dictionary

    d = Dictionary()
    for word in ("a@@", "b", "c"):
        d.add_symbol(word)
    encode_line = Dictionary.encode_line
    wrapped = text.words_looked_up_at_once(encode_line)
    lines = ["a@@ b c", "  b   zz\ta@@  ", "", "c", "unseen words only"]
    options = [dict(add_if_not_exist=False), dict(add_if_not_exist=False, append_eos=False),
               dict(add_if_not_exist=False, reverse_order=True),
               dict(add_if_not_exist=False, line_tokenizer=lambda line: line.split("@@"))]
    for line in lines:
        for kwargs in options:
            expected, found = encode_line(d, line, **kwargs), wrapped(d, line, **kwargs)
            assert found.dtype == expected.dtype == torch.int32 and found.tolist() == expected.tolist(), (line, kwargs)
    assert wrapped(d, "b zz", add_if_not_exist=False).tolist() == [d.index("b"), d.unk(), d.eos()]
    seen = []
    assert wrapped(d, "b c", add_if_not_exist=False, append_eos=False, consumer=lambda w, i: seen.append((w, i))).tolist() == [
        d.index("b"), d.index("c")]
    assert seen == [("b", d.index("b")), ("c", d.index("c"))]
    assert "new" not in d.indices and wrapped(d, "new b", add_if_not_exist=True).tolist()[0] == d.index("new")


def test_a_tokenizers_options_are_read_once_as_their_dataclass():
    """fairseq's Moses tokenizer read two options through OmegaConf on every
    line; built by the wrapped task, it holds them as its plain dataclass,
    the values and the tokens unchanged."""
    from fairseq.data.encoders.moses_tokenizer import MosesTokenizerConfig
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.fairseq_task import FairseqTask
    from omegaconf import DictConfig

    from fairseq import options

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_generation_parser(interactive=True), [
        "data-bin", "--tokenizer", "moses", "--source-lang", "de", "--target-lang", "en", "--moses-no-escape"]))
    build = text.options_read_once(FairseqTask.build_tokenizer)
    plain, fairseqs = build(None, cfg.tokenizer), FairseqTask.build_tokenizer(None, cfg.tokenizer)
    assert isinstance(fairseqs.cfg, DictConfig) and isinstance(plain.cfg, MosesTokenizerConfig)
    assert plain.cfg.moses_no_escape is True and plain.cfg.moses_no_dash_splits is False
    line = "Ein \"Hund\" läuft über die Straße-Brücke & bellt."
    assert plain.encode(line) == fairseqs.encode(line) and "&" in plain.encode(line)
    assert build(None, cfg.bpe) is None  # (no --bpe)

    @dataclasses.dataclass
    class Options:
        needed: str = omegaconf.MISSING
        other: int = 1

    class Encoder:
        def __init__(self, cfg):
            self.cfg = cfg

    unresolved = Encoder(omegaconf.OmegaConf.structured(Options))
    assert text.with_plain_options(unresolved) is unresolved and isinstance(unresolved.cfg, DictConfig)
    assert unresolved.cfg.other == 1  # (left as it was: the encoder reads it as before)
