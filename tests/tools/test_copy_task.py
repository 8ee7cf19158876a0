"""The sanity check of Amato et al. (seed 003): a correct implementation learns
to copy. ``transformer_hard_dec`` (hard decoder self- and cross-attention,
trained by sampling, decoded by argmax) must reach >= 95% exact match."""

import re

from hardattn_tools import synthetic

from conftest import USER_DIR, preprocess, run_cli

COPY_MODEL = [
    "--arch", "transformer_hard_dec", "--encoder-layers", 2, "--decoder-layers", 2,
    "--encoder-embed-dim", 64, "--decoder-embed-dim", 64,
    "--encoder-ffn-embed-dim", 128, "--decoder-ffn-embed-dim", 128,
    "--encoder-attention-heads", 4, "--decoder-attention-heads", 4, "--dropout", 0.0,
]


def exact_match(generate_output):
    targets = dict(re.findall(r"^T-(\d+)\t(.*)$", generate_output, flags=re.M))
    hyps = {i: h for i, _, h in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", generate_output, flags=re.M)}
    assert len(targets) == len(hyps) > 0
    return sum(hyps[i] == t for i, t in targets.items()) / len(targets)


def test_hard_decoder_learns_the_copy_task(tmp_path):
    synthetic.write_task("copy", str(tmp_path / "raw"), sizes=(4000, 100, 200),
                         vocab=12, min_len=3, max_len=10)
    data = preprocess(str(tmp_path / "raw"), str(tmp_path / "bin"))
    run_cli(
        "fairseq-train", data, "--user-dir", USER_DIR, *COPY_MODEL,
        "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--clip-norm", 1.0,
        "--lr", 1.5e-3, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 100,
        "--max-tokens", 2000, "--max-update", 500, "--criterion", "cross_entropy",
        "--save-dir", tmp_path / "ckpt", "--no-epoch-checkpoints", "--cpu", "--seed", 1,
        "--no-progress-bar", "--num-workers", 0,
    )
    out = run_cli(
        "fairseq-generate", data, "--user-dir", USER_DIR, "--path",
        tmp_path / "ckpt" / "checkpoint_best.pt", "--beam", 4, "--batch-size", 64, "--cpu",
    ).stdout
    assert exact_match(out) >= 0.95
