"""Every registered architecture end to end through fairseq's own tools with
``--user-dir``: preprocess (the shared fixture), train a few updates, save,
generate."""

import pytest

import fairseq_hardattn

from conftest import TEST_SENTENCES, generate, hypotheses, train

ARCHS = fairseq_hardattn.registered_architectures()


@pytest.mark.parametrize("arch", ARCHS)
def test_train_save_generate(arch, reorder_data, tmp_path):
    train(reorder_data, tmp_path, arch)
    out = generate(reorder_data, tmp_path / "checkpoint_last.pt").stdout
    # every test sentence is translated (batch size 8 does not divide 20)
    assert sorted(map(int, hypotheses(out))) == list(range(TEST_SENTENCES))
    assert "BLEU4 =" in out
