"""Pins for each fairseq behaviour ``fairseq_hardattn.fairseq_compat`` works
around, and the TensorBoard logging a fairseq user expects."""

import re
import struct
import subprocess
import sys
import warnings

import torch
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGenerator

from fairseq_hardattn import fairseq_compat

from conftest import REPO, decisive_model, make_dictionary, random_batch, run_cli, tool_env, train


def test_install_wraps_fairseqs_checkpoint_loading_once():
    for name in ("load_checkpoint_to_cpu", "overwrite_args_by_name"):
        assert getattr(getattr(checkpoint_utils, name), "_fairseq_hardattn", False), name
    wrapped = checkpoint_utils.load_checkpoint_to_cpu
    fairseq_compat.install()
    assert checkpoint_utils.load_checkpoint_to_cpu is wrapped  # not wrapped twice


def test_fairseqs_library_noise_is_filtered_and_real_warnings_are_not():
    fairseq_compat.install()
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("hydra.experimental.initialize() is no longer experimental. "
                      "Use hydra.initialize()", UserWarning)
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                      "then device pinned memory won't be used.", UserWarning)
        warnings.warn("a warning about the user's own run", UserWarning)
    assert [str(w.message) for w in caught] == ["a warning about the user's own run"]


def test_the_cli_prints_no_library_noise(reorder_data, tmp_path):
    proc = train(reorder_data, tmp_path, "transformer_hard_dec", updates=1)
    for _, pattern in fairseq_compat.FAIRSEQ_NOISE:
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


def test_no_repeat_ngram_size_bans_repeated_ngrams():
    """fairseq's Python n-gram blocker compared padding with the hypothesis and
    banned nothing (fairseq issue 5206): with the plugin, no hypothesis repeats
    a bigram under ``no_repeat_ngram_size=2``, and the option changes the output
    of a model that repeats itself without it."""
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
