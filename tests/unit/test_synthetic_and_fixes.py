"""The synthetic tasks and the plugin's fixes to its fairseq build."""

import numpy as np
import pytest
import torch

import fairseq_hardattn  # noqa: F401  (torch >= 2.6 reads fairseq checkpoints)
from fairseq_hardattn.compat.batches import batch_by_size
from hardattn_tools import synthetic


def test_synthetic_tasks_are_deterministic_and_reorder():
    a = synthetic.make_pairs("reorder", 50, seed=7)
    assert a == synthetic.make_pairs("reorder", 50, seed=7)
    assert a != synthetic.make_pairs("reorder", 50, seed=8)
    reordered = 0
    for src, tgt in a:
        assert len(src.split()) == len(tgt.split())
        # the target is not a word-by-word (monotone) translation
        reordered += [w[1:] for w in src.split()] != [w[1:] for w in tgt.split()]
    assert reordered > 40
    for src, tgt in synthetic.make_pairs("copy", 20, seed=1):
        assert src == tgt


def test_reorder_rule_on_a_known_sentence():
    perm = list(range(24))  # identity translation makes the order visible
    # phrases end at markers 0..2: [5 7 1] [9 4 0] [8]
    assert synthetic._reorder_target([5, 7, 1, 9, 4, 0, 8], perm) == [1, 7, 5, 0, 4, 9, 8]


def test_synthetic_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown synthetic task"):
        synthetic.make_pairs("sort", 3, seed=1)
    with pytest.raises(ValueError, match="min_len"):
        synthetic.make_pairs("copy", 3, seed=1, min_len=5, max_len=3)


@pytest.mark.parametrize("count, max_sentences", [(100, 50), (100, 128), (21, 8), (7, 3)])
def test_batching_keeps_every_sentence(count, max_sentences):
    indices = np.arange(count, dtype=np.int64)
    for vec in (None, np.full(count, 10, dtype=np.int64)):
        batches = batch_by_size(
            indices, lambda i: 10, num_tokens_vec=vec, max_sentences=max_sentences,
            required_batch_size_multiple=8,
        )
        assert sorted(np.concatenate(batches).tolist()) == list(range(count))
        # fairseq's rule: "less than N or a multiple of N"
        assert all(len(b) % 8 == 0 or len(b) < 8 for b in batches[:-1])


def test_fairseq_style_checkpoint_loads_with_weights_only_default(tmp_path):
    import argparse

    state = {"args": None, "cfg": {"model": argparse.Namespace(arch="x")},
             "extra_state": {"best": np.float64(1.5), "bleu": np.array([1, 2])},
             "model": {"w": torch.ones(2)}}
    torch.save(state, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt")  # torch >= 2.6: weights_only=True
    assert loaded["cfg"]["model"].arch == "x"
    assert loaded["extra_state"]["best"] == 1.5
