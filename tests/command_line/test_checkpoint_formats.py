"""Both checkpoint formats alike: fairseq's older one (options as one
``argparse.Namespace``, ``args``: what fairseq wrote before its hydra
configs, and the format of its published translation models) takes every
``--model-overrides`` key and hub keyword as today's (``cfg``) does, for this
plugin's models and fairseq's transformer: applied, or refused in one line."""

import re

import pytest
import torch
from fairseq import options

import fairseq_hardattn
from fairseq_hardattn import ConfigError
from fairseq_hardattn.decoding.int8 import Int8Linear
from fairseq_hardattn.models.attention_kind_base import AttentionKindTransformerModel
from fairseq_hardattn.modules import HardRetrievalAttention

from conftest import (TRAIN_FLAGS, USER_DIR, generate, load_with_overrides, one_error_line,
                      tiny_dim_flags)

ARCHS = {"soft": "transformer", "hard": "transformer_hard_dec"}


@pytest.fixture(scope="module")
def both_formats(trained_checkpoints, reorder_data, tmp_path_factory):
    """kind -> {"cfg": the trained checkpoint, "args": the same weights in the older format}."""
    root = tmp_path_factory.mktemp("args_format")
    found = {}
    for kind, arch in ARCHS.items():
        state = torch.load(trained_checkpoints[kind], weights_only=False)
        args = options.parse_args_and_arch(options.get_training_parser(), [
            str(reorder_data), "--arch", arch, *map(str, TRAIN_FLAGS), *tiny_dim_flags(arch)])
        older = root / kind / "checkpoint_last.pt"
        older.parent.mkdir()
        torch.save({"args": args, "cfg": None, "model": state["model"],
                    "optimizer_history": state["optimizer_history"], "extra_state": state["extra_state"],
                    "last_optimizer_state": None}, older)
        found[kind] = {"cfg": trained_checkpoints[kind], "args": older}
    return found


def output_lines(stdout):
    return [line for line in stdout.splitlines() if re.match(r"^[HPS]-\d+\t", line)]


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_the_older_format_decodes_as_todays(both_formats, reorder_data, kind):
    runs = {fmt: generate(reorder_data, path).stdout for fmt, path in both_formats[kind].items()}
    assert output_lines(runs["args"]) == output_lines(runs["cfg"]) and output_lines(runs["cfg"])


@pytest.mark.parametrize("kind", sorted(ARCHS))
@pytest.mark.parametrize("overrides", [
    {"dec_self_attn_kind": "hard", "dec_cross_attn_kind": "hard"},
    {"int8_decoding": True},
    {"decoding_engine": "fairseq"},
])
def test_overrides_act_on_both_formats_alike(both_formats, kind, overrides):
    for fmt, path in both_formats[kind].items():
        model = load_with_overrides(path, overrides)
        if "dec_self_attn_kind" in overrides:
            hard = [m for m in model.modules() if isinstance(m, HardRetrievalAttention)]
            assert len(hard) == 2 * len(model.decoder.layers), fmt
        if "int8_decoding" in overrides:  # the plugin's model, which quantizes when prepared
            assert isinstance(model, AttentionKindTransformerModel) and model.args.int8_decoding, fmt
        if "decoding_engine" in overrides:
            assert model.decoder.decoding_engine == "fairseq", fmt


@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_a_misspelt_override_is_refused_in_both_formats(both_formats, reorder_data, kind):
    for fmt, path in both_formats[kind].items():
        with pytest.raises(ConfigError, match="'dec_self_attn_kindd' is no option of"):
            load_with_overrides(path, {"dec_self_attn_kindd": "hard"})
        proc = generate(reorder_data, path, "--model-overrides", "{'dec_self_attn_kindd': 'hard'}",
                        check=False)
        one_error_line(proc, "'dec_self_attn_kindd' is no option of")


def test_hard_overrides_and_int8_through_the_cli_and_the_hub_on_the_older_format(both_formats,
                                                                               reorder_data):
    older, today = both_formats["soft"]["args"], both_formats["soft"]["cfg"]
    hard = "{'dec_self_attn_kind': 'hard', 'dec_cross_attn_kind': 'hard'}"
    runs = {fmt: generate(reorder_data, path, "--model-overrides", hard).stdout
            for fmt, path in (("args", older), ("cfg", today))}
    assert output_lines(runs["args"]) == output_lines(runs["cfg"])
    assert output_lines(runs["args"]) != output_lines(generate(reorder_data, older).stdout)
    hub = fairseq_hardattn.from_pretrained(str(older.parent), checkpoint_file=older.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR,
                                           int8_decoding=True)
    assert isinstance(hub.models[0].decoder.output_projection, Int8Linear)
    assert hub.translate("s1 s2 s3", beam=2)


def fairseq_env(tmp_path):
    """A process of this environment that never loads the plugin (no
    --user-dir), with the startup hook installed as ``python -m
    fairseq_hardattn --install-startup-hook`` installs it (a ``.pth`` file in a
    site directory, read at interpreter start): all it has of the plugin."""
    from conftest import tool_env
    from fairseq_hardattn import startup_hook

    site = tmp_path / "site"
    site.mkdir()
    startup_hook.install(str(site))
    (tmp_path / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site)!r})\n")
    return tool_env(PYTHONPATH=str(tmp_path))


def test_fairseqs_own_commands_read_fairseq_checkpoints_without_the_plugin(both_formats, reorder_data,
                                                                          tmp_path):
    """A plain fairseq transformer (both formats) through fairseq-generate,
    fairseq-interactive, fairseq-train --restore-file and the hub, none given
    --user-dir; a checkpoint of the plugin's stops in one line saying to add it."""
    import subprocess
    import sys

    from conftest import BIN_DIR, MAX_LEN_B

    env = fairseq_env(tmp_path)
    run = lambda tool, *args, **kw: subprocess.run([str(BIN_DIR / tool), *map(str, args)], env=env,
                                                   capture_output=True, text=True, timeout=600, **kw)
    for fmt, path in both_formats["soft"].items():
        proc = run("fairseq-generate", reorder_data, "--path", path, "--cpu", "--beam", 2,
                   "--max-len-b", MAX_LEN_B)
        # (16 of the 20: without the plugin, fairseq drops a last batch of 4, compat.batches)
        assert proc.returncode == 0 and len(re.findall(r"^H-", proc.stdout, re.M)) >= 16, \
            (fmt, proc.stderr[-1500:])
        proc = run("fairseq-interactive", reorder_data, "--path", path, "--cpu", "--beam", 2,
                   "--source-lang", "src", "--target-lang", "tgt", input="s1 s2 s3\n")
        assert proc.returncode == 0 and "H-0" in proc.stdout, (fmt, proc.stderr[-1500:])
    last = tmp_path / "restore" / "checkpoint_last.pt"
    last.parent.mkdir()
    last.write_bytes(both_formats["soft"]["cfg"].read_bytes())
    proc = run("fairseq-train", reorder_data, "--arch", "transformer", "--cpu", "--optimizer", "adam",
               "--lr", "1e-3", "--max-tokens", 1000, "--criterion", "label_smoothed_cross_entropy",
               "--no-progress-bar", *tiny_dim_flags("transformer"), "--save-dir", last.parent,
               "--max-update", 4, "--num-workers", 0)
    assert proc.returncode == 0 and "Loaded checkpoint" in proc.stdout + proc.stderr, proc.stderr[-1500:]
    hub = subprocess.run([sys.executable, "-c", (
        "import sys; from fairseq.models.transformer import TransformerModel as T; "
        "m = T.from_pretrained(sys.argv[1], checkpoint_file=sys.argv[2], data_name_or_path=sys.argv[3]); "
        "print(type(m.models[0]).__module__, bool(m.translate('s1 s2', beam=2)))"),
        str(both_formats["soft"]["args"].parent), "checkpoint_last.pt", str(reorder_data)],
        env=env, capture_output=True, text=True, timeout=600)
    assert hub.returncode == 0 and hub.stdout.split() == ["fairseq.models.transformer.transformer_legacy",
                                                         "True"], hub.stderr[-1500:]
    proc = run("fairseq-generate", reorder_data, "--path", both_formats["hard"]["cfg"], "--cpu")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"fairseq-hardattn: error: {both_formats['hard']['cfg']} is a checkpoint of the fairseq-hardattn "
        "plugin: load it with --user-dir")
