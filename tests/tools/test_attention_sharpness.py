"""tools/attention_sharpness: how much of each hard head's softmax mass its
retrieved key holds, teacher-forced on a data set."""

import json
import subprocess
import sys

import pytest
from fairseq.data import Dictionary, data_utils

from conftest import TINY_DIMS, tool_env
from hardattn_tools.attention_sharpness import sharpness


def sharpness_cli(*args):
    return subprocess.run([sys.executable, "-m", "hardattn_tools.attention_sharpness",
                           *map(str, args)], env=tool_env(), capture_output=True, text=True,
                          timeout=600)


def target_tokens(data_bin, subset):
    """Real (non-padding) target tokens of ``subset``, end-of-sentence included."""
    pair = next(data_bin.glob(f"{subset}.*-*.*.idx")).name.split(".")[1]
    target = pair.split("-")[1]
    dictionary = Dictionary.load(str(data_bin / f"dict.{target}.txt"))
    prefix = str(data_bin / f"{subset}.{pair}.{target}")
    dataset = data_utils.load_indexed_dataset(prefix, dictionary)  # its sizes live in its mmap
    return int(sum(int(size) for size in dataset.sizes))


def test_every_hard_head_is_measured_on_every_real_target_position(reorder_data, trained_checkpoints,
                                                                    tmp_path):
    measured = sharpness(str(reorder_data), str(trained_checkpoints["hard"]), "valid", max_tokens=64)
    layers = TINY_DIMS["decoder_layers"]
    assert sorted(measured) == sorted(f"decoder.layers.{i}.{kind}" for i in range(layers)
                                      for kind in ("self_attn", "encoder_attn"))
    rows = target_tokens(reorder_data, "valid") * TINY_DIMS["decoder_attention_heads"]
    for numbers in measured.values():
        assert numbers["rows"] == rows
        assert 0.0 < numbers["argmax_mass"] <= 1.0 and numbers["effective_keys"] >= 1.0
    # the batch size changes nothing, and the command line writes the same numbers
    proc = sharpness_cli(reorder_data, trained_checkpoints["hard"], "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads((tmp_path / "s.json").read_text())
    assert list(runs) == ["hard", "provenance"]  # named by the checkpoint's folder; where it was measured
    assert runs["provenance"]["commit"] and runs["provenance"]["cpu"]
    written = runs["hard"]
    assert written["all_hard_heads_argmax_mass"] == pytest.approx(
        sum(n["argmax_mass"] for n in measured.values()) / len(measured), abs=1e-3)  # equal rows
    assert written["per_attention"].keys() == measured.keys()
    for name, numbers in measured.items():
        assert written["per_attention"][name] == pytest.approx(numbers, abs=2e-4)
    assert proc.stdout.splitlines()[0] == "run\tattention\targmax mass\teffective keys"


def test_a_model_without_hard_heads_is_one_line_error(reorder_data, trained_checkpoints, tmp_path):
    for checkpoint, expected in ((trained_checkpoints["soft"], "has no hard retrieval attention"),
                                 (tmp_path / "none.pt", "no checkpoint at")):
        proc = sharpness_cli(reorder_data, checkpoint)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "error:" in proc.stderr.splitlines()[-1] and expected in proc.stderr.splitlines()[-1]
