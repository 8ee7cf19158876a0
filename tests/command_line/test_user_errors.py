"""A user's mistake is one line naming its real cause (``fairseq-hardattn:
error: ...``), through fairseq's own tools and the hub, never a traceback;
``LOGLEVEL=DEBUG`` keeps the traceback for debugging."""

import re

import pytest
import torch

from conftest import (
    TRAIN_FLAGS,
    TINY_DIM_FLAGS,
    USER_DIR,
    generate,
    one_error_line,
    preprocess,
    run_cli,
    tool_env,
)


@pytest.fixture(scope="module")
def small_data(reorder_data, tmp_path_factory):
    """Data binarized from 5 sentences: smaller dictionaries than reorder_data's,
    once joined, once per language."""
    root = tmp_path_factory.mktemp("small")
    raw = reorder_data.parent / "raw"
    for split in ("train", "valid", "test"):
        for lang in ("src", "tgt"):
            lines = (raw / f"train.{lang}").read_text().splitlines()[:5]
            (root / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    joined = preprocess(str(root), str(root / "joined"))
    separate = root / "separate"
    run_cli("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
            "--trainpref", root / "train", "--validpref", root / "valid",
            "--destdir", separate, "--workers", "1")
    return {"joined": joined, "separate": separate}


def test_truncated_and_empty_checkpoints(trained_checkpoints, reorder_data, tmp_path):
    truncated, empty = tmp_path / "truncated.pt", tmp_path / "empty.pt"
    truncated.write_bytes(trained_checkpoints["hard"].read_bytes()[:50000])
    empty.write_bytes(b"")
    line = one_error_line(generate(reorder_data, truncated, check=False),
                          f"cannot read the checkpoint {truncated}: it is truncated")
    assert re.search(r"\(\w+Error: .+\)$", line)  # the underlying error, in brief
    one_error_line(generate(reorder_data, empty, check=False),
                   f"the checkpoint {empty} is an empty file")
    one_error_line(generate(reorder_data, tmp_path / "nowhere.pt", check=False),
                   f"no checkpoint at {tmp_path / 'nowhere.pt'}")


def test_loglevel_debug_keeps_the_traceback(trained_checkpoints, reorder_data, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(trained_checkpoints["hard"].read_bytes()[:50000])
    proc = run_cli("fairseq-generate", reorder_data, "--user-dir", USER_DIR, "--path", truncated,
                   "--cpu", check=False, env=tool_env(LOGLEVEL="DEBUG"))
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "torch/serialization.py" in proc.stderr
    assert "fairseq-hardattn: error: cannot read the checkpoint" in proc.stderr.splitlines()[-1]


def test_a_dictionary_of_another_size(trained_checkpoints, small_data):
    one_error_line(generate(small_data["joined"], trained_checkpoints["hard"], check=False),
                   "the checkpoint's source dictionary has ")
    proc = generate(small_data["joined"], trained_checkpoints["hard"], check=False)
    assert str(small_data["joined"]) in proc.stderr  # names the data dir


def test_share_all_embeddings_needs_a_joined_dictionary(small_data, tmp_path):
    proc = run_cli("fairseq-train", small_data["separate"], "--arch", "transformer_hard_dec",
                   *TRAIN_FLAGS, *TINY_DIM_FLAGS, "--share-all-embeddings",
                   "--save-dir", tmp_path, check=False)
    one_error_line(proc, "--share-all-embeddings needs one dictionary for both languages")
    assert "--joined-dictionary" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_fp16_training_without_a_gpu(reorder_data, tmp_path):
    proc = run_cli("fairseq-train", reorder_data, "--arch", "transformer_hard_dec", *TRAIN_FLAGS,
                   *TINY_DIM_FLAGS, "--fp16", "--max-update", 1, "--save-dir", tmp_path,
                   check=False)
    one_error_line(proc, "--fp16 needs a CUDA GPU and torch finds none")


@pytest.mark.parametrize("overrides, expected", [
    ("{'dec_cross_attn_knd': 'soft'}",
     "--model-overrides key 'dec_cross_attn_knd' is no option of transformer_hard_dec; "
     "did you mean 'dec_cross_attn_kind'"),
    ("{'print_cps': True}",
     "--model-overrides key 'print_cps' does not apply to transformer_hard_dec"),
])
def test_model_overrides_nothing_reads(trained_checkpoints, reorder_data, overrides, expected):
    proc = generate(reorder_data, trained_checkpoints["hard"], "--model-overrides", overrides,
                    check=False)
    one_error_line(proc, expected)


def test_a_distillation_teacher_of_another_dictionary(trained_checkpoints, small_data, tmp_path):
    proc = run_cli("fairseq-train", small_data["joined"], "--arch", "transformer_hard_dec",
                   *TRAIN_FLAGS, *TINY_DIM_FLAGS, "--save-dir", tmp_path,
                   "--criterion", "label_smoothed_cross_entropy_with_distillation",
                   "--distill-teacher", trained_checkpoints["soft"], check=False)
    one_error_line(proc, "dictionary")


def test_a_retired_training_option_is_refused_as_any_unknown_option(reorder_data, tmp_path):
    proc = run_cli("fairseq-train", reorder_data, "--arch", "transformer_hard_dec_prenorm_small",
                   *TRAIN_FLAGS, "--save-dir", tmp_path, "--hard-cooling-updates", 10, check=False)
    one_error_line(proc, "unrecognized arguments: --hard-cooling-updates 10")
