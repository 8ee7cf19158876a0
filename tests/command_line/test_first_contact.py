"""A new user's first mistakes, each through the entry point a user would
use (fairseq's command-line tools or the hub): one line naming the problem,
the override applied, or the run kept (the README's troubleshooting
table lists them)."""

import re
import subprocess
import sys

import pytest
import torch

import fairseq_hardattn
from fairseq_hardattn import ConfigError
from fairseq_hardattn.modules import HardRetrievalAttention

from conftest import (BIN_DIR, MAX_LEN_B, REPO, TINY_DIM_FLAGS, TRAIN_FLAGS, USER_DIR, generate, hypotheses,
                      interactive, load_with_overrides, one_error_line, run_cli, tool_env, train)

HARD_KINDS = "{'dec_self_attn_kind': 'hard', 'dec_cross_attn_kind': 'hard'}"


@pytest.fixture(scope="module")
def other_checkpoints(reorder_data, tmp_path_factory):
    """An average attention network and a pre-norm soft model, a few updates each."""
    root = tmp_path_factory.mktemp("other")
    train(reorder_data, root / "aan", "transformer_aan", updates=2)
    train(reorder_data, root / "soft_pre", "transformer_soft_prenorm", updates=2)
    return {name: root / name / "checkpoint_last.pt" for name in ("aan", "soft_pre")}


def test_plugin_overrides_apply_to_a_fairseq_transformer_checkpoint(trained_checkpoints, reorder_data):
    """The paper's Table 4 on a plain fairseq `transformer` checkpoint: the
    overrides decode it hard (CLI and hub), and keys of another family or of
    no model stop in one line."""
    soft = trained_checkpoints["soft"]
    model = load_with_overrides(soft, eval(HARD_KINDS))
    hard = [m for m in model.modules() if isinstance(m, HardRetrievalAttention)]
    assert len(hard) == 2 * len(model.decoder.layers)
    as_soft = generate(reorder_data, soft).stdout
    as_hard = generate(reorder_data, soft, "--model-overrides", HARD_KINDS).stdout
    assert hypotheses(as_hard) and re.findall(r"^H-.*", as_soft, re.M) != re.findall(r"^H-.*", as_hard, re.M)
    hub = fairseq_hardattn.from_pretrained(str(soft.parent), checkpoint_file=soft.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR,
                                           dec_self_attn_kind="hard", dec_cross_attn_kind="hard")
    assert any(isinstance(m, HardRetrievalAttention) for m in hub.models[0].modules())
    assert hub.translate("s1 s2 s3", beam=2)
    for overrides, expected in (("{'flexible_threshold': 1.5}", "does not apply to a fairseq transformer"),
                                ("{'no_such_key': 1}", "'no_such_key' is no option of transformer")):
        one_error_line(generate(reorder_data, soft, "--model-overrides", overrides, check=False), expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("flag, expected", [("--fp16", "--fp16 needs a CUDA GPU to decode"),
                                            ("--bf16", "--bf16 is not applied by fairseq's decoding tools")])
def test_half_precision_decoding_on_a_cpu_stops(trained_checkpoints, reorder_data, flag, expected):
    one_error_line(generate(reorder_data, trained_checkpoints["hard"], flag, check=False), expected)
    one_error_line(interactive(reorder_data, trained_checkpoints["hard"], ["s1 s2"], flag), expected)


@pytest.mark.parametrize("overrides, expected", [
    ("{'_name': 'transformer_hard_dex'}",
     "'_name' 'transformer_hard_dex' is no architecture; did you mean 'transformer_hard_dec'"),
    ("{'dec_self_attn_kind': soft}", "--model-overrides must be a Python literal, every string quoted"),
    ("{'dec_self_attn_kind': 'soft'", "--model-overrides must be a Python literal"),
])
def test_malformed_model_overrides(trained_checkpoints, reorder_data, overrides, expected):
    one_error_line(generate(reorder_data, trained_checkpoints["hard"], "--model-overrides", overrides,
                            check=False), expected)


HUB_SCRIPT = """
import sys
import torch
# a plain fairseq checkpoint: nothing but argparse.Namespace needs allowing
torch.serialization.add_safe_globals([__import__("argparse").Namespace])
state = torch.load(sys.argv[1], weights_only=True)
print(type(state["cfg"]["model"]).__module__, state["cfg"]["model"].arch)
"""


def test_checkpoints_need_none_of_the_plugins_classes(trained_checkpoints, reorder_data):
    """Read in a process that never imports the plugin; and the repository
    root given as --user-dir loads the plugin."""
    checkpoint = trained_checkpoints["hard"]
    proc = subprocess.run([sys.executable, "-c", HUB_SCRIPT, str(checkpoint)], env=tool_env(),
                          capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["argparse", "transformer_hard_dec"]
    from_root = run_cli("fairseq-generate", reorder_data, "--user-dir", REPO, "--path", checkpoint,
                        "--cpu", "--beam", 2, "--max-len-b", MAX_LEN_B)
    assert len(hypotheses(from_root.stdout)) == 20


def test_paths_that_are_not_there(trained_checkpoints, reorder_data, tmp_path):
    hard = trained_checkpoints["hard"]
    one_error_line(generate(reorder_data, hard.parent, check=False),
                   f"the checkpoint {hard.parent} is a directory: give a checkpoint file in it")
    one_error_line(generate(reorder_data, hard, "--gen-subset", "tst", check=False),
                   "no 'tst' split in")
    one_error_line(generate(tmp_path / "no-data-bin", hard, check=False),
                   f"no such file or directory: {tmp_path / 'no-data-bin'}")
    one_error_line(run_cli("fairseq-train", tmp_path / "no-data-bin", "--arch", "transformer_hard_dec",
                           *TRAIN_FLAGS, *TINY_DIM_FLAGS, "--save-dir", tmp_path, check=False),
                   "no such file or directory")
    with pytest.raises(ConfigError, match="from_pretrained: no model directory 'nope'"):
        fairseq_hardattn.from_pretrained("nope", checkpoint_file="checkpoint_last.pt",
                                         user_dir=fairseq_hardattn.USER_DIR)
    with pytest.raises(ConfigError, match=r"no checkpoint_file 'model.pt' in .* checkpoint_last.pt"):
        fairseq_hardattn.from_pretrained(str(hard.parent), data_name_or_path=str(reorder_data),
                                         user_dir=fairseq_hardattn.USER_DIR)


def test_path_options_under_a_file_are_one_line(trained_checkpoints, reorder_data, tmp_path):
    """A folder to write in that is a file, or lies under one: each path
    option named with what is wrong (fairseq: a traceback ending in
    NotADirectoryError from os.makedirs or os.listdir)."""
    hard = trained_checkpoints["hard"]
    a_file = tmp_path / "f"
    a_file.write_text("")
    training = ["--arch", "transformer_hard_dec", *TRAIN_FLAGS, *TINY_DIM_FLAGS, "--max-update", 1]
    for extra, said in ((["--save-dir", a_file / "ckpt"], f"--save-dir {a_file / 'ckpt'}"),
                        ([f"--save-dir={a_file}"], f"--save-dir {a_file}"),
                        (["--save-dir", tmp_path / "ck", "--tensorboard-logdir", a_file / "tb"],
                         f"--tensorboard-logdir {a_file / 'tb'}")):
        one_error_line(run_cli("fairseq-train", reorder_data, *training, *extra, check=False),
                       f"{said}: {a_file} is a file, not a directory")
    one_error_line(generate(reorder_data, hard, "--results-path", a_file / "out", check=False),
                   f"--results-path {a_file / 'out'}: {a_file} is a file, not a directory")
    one_error_line(generate(a_file, hard, check=False),
                   f"the data directory {a_file}: {a_file} is a file, not a directory")
    one_error_line(interactive(a_file, hard, ["s1 s2"]),
                   f"the data directory {a_file}: {a_file} is a file, not a directory")
    one_error_line(generate(reorder_data, a_file / "x.pt", check=False), f"no checkpoint at {a_file / 'x.pt'}")
    with pytest.raises(ConfigError, match="from_pretrained: data_name_or_path .* is a file, not a data directory"):
        fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                         data_name_or_path=str(a_file), user_dir=USER_DIR)
    with pytest.raises(ConfigError, match="from_pretrained: no data directory"):
        fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                         data_name_or_path=str(tmp_path / "none"), user_dir=USER_DIR)


@pytest.mark.parametrize("sentences, expected", [
    (b"s1 s2", r"translate: expects a str or a list of str, got bytes \(b's1 s2'\): decode it first"),
    (["s1 s2", None], r"translate: sentence 2 of 2 is NoneType \(None\), not a str"),
    (None, r"translate: expects a str or a list of str, got NoneType \(None\)"),
    (5, r"translate: expects a str or a list of str, got int \(5\)"),
])
def test_the_hub_takes_a_str_or_a_list_of_str_and_names_anything_else(trained_checkpoints, reorder_data,
                                                                      sentences, expected):
    hard = trained_checkpoints["hard"]
    hub = fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR)
    with pytest.raises(TypeError, match=expected):
        hub.translate(sentences, beam=2, max_len_b=MAX_LEN_B)
    with pytest.raises(TypeError, match=expected.replace("translate", "sample")):
        hub.sample(sentences, beam=2, max_len_b=MAX_LEN_B)
    one, = hub.translate(("s1 s2",), beam=2, max_len_b=MAX_LEN_B)  # any iterable of str
    assert one == hub.translate("s1 s2", beam=2, max_len_b=MAX_LEN_B)
    assert hub.translate(iter(["s1 s2"]), beam=2, max_len_b=MAX_LEN_B) == [one]


def test_the_hub_warns_once_about_cased_sentences_for_a_model_without_capitals(trained_checkpoints,
                                                                            reorder_data):
    """The tiny task's dictionary has no capital letters: the hub's first call
    given mostly cased sentences warns once, and translates them as given."""
    import warnings

    hard = trained_checkpoints["hard"]
    hub = fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR)
    with pytest.warns(UserWarning, match="no capital letters, but 2 of 2 lines from line 1 of the sentences"):
        cased = hub.translate(["S1 S2", "S4 S5 S6"], beam=2, max_len_b=MAX_LEN_B)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert hub.sample("S1 S2", beam=2, max_len_b=MAX_LEN_B)  # (once a hub)
        fresh = fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                                 data_name_or_path=str(reorder_data), user_dir=USER_DIR)
        assert fresh.translate(["s1 s2", "s4 s5 s6"], beam=2, max_len_b=MAX_LEN_B)
    assert not [w for w in seen if "capital letters" in str(w.message)]
    assert len(cased) == 2


def test_the_hubs_text_of_token_ids_is_fairseqs_from_the_ids_as_ints(trained_checkpoints, reorder_data,
                                                                    monkeypatch):
    """The plugin's hub hands ``Dictionary.string`` a hypothesis's ids as
    ints (fairseq's hub hands it the tensor, walked one 0-d tensor per id):
    the same text, and the same translations."""
    from fairseq import hub_utils

    hard = trained_checkpoints["hard"]
    hub = fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR)
    ids = hub.encode("s1 s2 s3 s9 s4")
    assert hub.string(ids) == hub_utils.GeneratorHubInterface.string(hub, ids) == "s1 s2 s3 s9 s4"
    translations = hub.translate(["s1 s2", "s4 s5 s6"], beam=2, max_len_b=MAX_LEN_B)
    given, string = [], type(hub.tgt_dict).string

    def recorded(dictionary, tokens, *args, **kwargs):
        given.append(tokens)
        return string(dictionary, tokens, *args, **kwargs)

    monkeypatch.setattr(type(hub.tgt_dict), "string", recorded)
    assert hub.translate(["s1 s2", "s4 s5 s6"], beam=2, max_len_b=MAX_LEN_B) == translations
    assert given and all(type(tokens) is list for tokens in given)
    monkeypatch.setattr(type(hub), "string", hub_utils.GeneratorHubInterface.string)
    assert hub.translate(["s1 s2", "s4 s5 s6"], beam=2, max_len_b=MAX_LEN_B) == translations
    assert torch.is_tensor(given[-1])  # (fairseq's own hub: the tensor)


def test_the_hubs_ids_of_a_sentence_are_fairseqs_looked_up_at_once(trained_checkpoints, reorder_data):
    """The plugin's hub looks a sentence's words up as a list (fairseq's set
    its tensor one id at a time): the same ids, unknown words and EOS
    included, and the same translations as fairseq's way."""
    from fairseq import hub_utils

    hard = trained_checkpoints["hard"]
    hub = fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR)
    for sentence in ("s1 s2 s3 s9 s4", "s1 unseen  s2", ""):
        ids, fairseqs = hub.binarize(sentence), hub_utils.GeneratorHubInterface.binarize(hub, sentence)
        assert ids.dtype == fairseqs.dtype == torch.long and ids.tolist() == fairseqs.tolist()
    assert hub.binarize("s1 unseen").tolist() == [hub.src_dict.index("s1"), hub.src_dict.unk(), hub.src_dict.eos()]
    translations = hub.translate(["s1 s2", "s4 s5 s6"], beam=2, max_len_b=MAX_LEN_B)
    hub.binarize = lambda sentence: hub_utils.GeneratorHubInterface.binarize(hub, sentence)
    assert hub.translate(["s1 s2", "s4 s5 s6"], beam=2, max_len_b=MAX_LEN_B) == translations


def test_the_hubs_kept_generators_decode_as_fairseqs_hub_does(trained_checkpoints, reorder_data):
    """The plugin's hub builds a generator once for a set of options (fairseq
    builds one a call) and decodes one sentence as one batch made directly:
    the translations of fairseq's own generate, whatever changed between
    calls: the options given, the hub's generation options, torch's seed
    (sampling), the model's weights."""
    from fairseq import hub_utils

    hard = trained_checkpoints["hard"]
    hub = fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR)
    sentences = ["s1 s2", "s4 s5 s6 s7", "s9"]

    def both(*args, **kwargs):
        ours = [hub.sample(s, *args, **kwargs) for s in sentences] + [hub.sample(sentences, *args, **kwargs)]
        with_fairseqs = [hub_utils.GeneratorHubInterface.sample(hub, s, *args, **kwargs) for s in sentences]
        with_fairseqs.append(hub_utils.GeneratorHubInterface.sample(hub, sentences, *args, **kwargs))
        assert ours == with_fairseqs
        return ours

    first = both(3, max_len_b=MAX_LEN_B)
    assert both(3, max_len_b=MAX_LEN_B) == first and len(hub._generators) == 1
    assert both(1, max_len_b=MAX_LEN_B)
    hub.cfg.generation.max_len_b = 2
    assert all(len(t.split()) <= 2 for t in both(3)[:3])
    hub.cfg.generation.max_len_b = MAX_LEN_B
    for seed in (1, 2, 1):
        torch.manual_seed(seed)
        both(2, sampling=True, sampling_topk=3)
    with torch.no_grad():
        for parameter in hub.models[0].parameters():
            parameter.mul_(-1.0)
    assert both(3, max_len_b=MAX_LEN_B) != first


def test_a_line_too_long_for_the_model_is_named_and_the_session_goes_on(trained_checkpoints, reorder_data):
    lines = ["s1 s2", "s4 s5", "s3 " * 1100, "s7 s8", "", "s9"]
    proc = interactive(reorder_data, trained_checkpoints["hard"], lines, "--buffer-size", 2)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert ("fairseq-hardattn: warning: input line 3 has 1101 tokens, more than the model's 1024 "
            "source positions: its hypothesis is empty") in proc.stderr
    assert "error" not in proc.stderr.lower()
    # one H line per input line, in order; the long line's and the empty line's are empty
    assert list(map(int, hypotheses(proc.stdout))) == list(range(len(lines)))
    texts = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", proc.stdout, flags=re.M))
    assert texts["2"] == "" and texts["4"] == "" and all(texts[i] for i in ("0", "1", "3", "5"))
    alone = interactive(reorder_data, trained_checkpoints["hard"], ["s7 s8"])
    assert re.findall(r"^H-0\t\S+\t(.*)$", alone.stdout, flags=re.M) == [texts["3"]]


def test_an_empty_sentence_is_an_empty_translation_through_the_hub(trained_checkpoints, reorder_data):
    hard = trained_checkpoints["hard"]
    hub = fairseq_hardattn.from_pretrained(str(hard.parent), checkpoint_file=hard.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR,
                                           source_lang="src", target_lang="tgt")
    assert hub.translate("") == "" and hub.translate("   ") == "" and hub.sample([""]) == [""]
    both = hub.translate(["s1 s2", "", "s4 s5"], beam=2, max_len_b=MAX_LEN_B)
    assert both[1] == "" and both[0] and both[2]
    assert both[0] == hub.translate("s1 s2", beam=2, max_len_b=MAX_LEN_B)
    assert both[2] == hub.translate("s4 s5", beam=2, max_len_b=MAX_LEN_B)


def test_the_plugins_own_help_is_quick_to_come(tmp_path):
    """``python -m fairseq_hardattn --help`` and the plugin's path import neither torch nor fairseq."""
    for args in (["--help"], []):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fairseq_hardattn", *args],
                              env=tool_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
        assert "torch" not in imported and "fairseq" not in imported and "fairseq_hardattn" in imported


@pytest.mark.parametrize("args, expected", [
    (["--arch", "transformer_hard_dex"],
     "unknown --arch 'transformer_hard_dex' (did you mean transformer_hard_dec"),
    (["--arch", "transformer_hard_dec", "--hard-anneal-update", "5"],
     "unrecognized arguments: --hard-anneal-update 5 (did you mean --hard-anneal-updates"),
])
def test_misspelt_command_lines_are_one_line_with_the_nearest_names(reorder_data, tmp_path, args, expected):
    proc = run_cli("fairseq-train", reorder_data, *args, *TRAIN_FLAGS, "--save-dir", tmp_path, check=False)
    one_error_line(proc, expected)
    assert len(proc.stderr.strip().splitlines()) == 1 and "usage:" not in proc.stderr


def test_checkpoints_of_another_family_or_normalisation(other_checkpoints, reorder_data, tmp_path):
    one_error_line(generate(reorder_data, other_checkpoints["aan"], "--model-overrides",
                            "{'_name': 'transformer_hard_dec'}", check=False),
                   "the checkpoint's family replaces its decoder self-attention")
    proc = run_cli("fairseq-train", reorder_data, "--arch", "transformer_hard_dec", *TRAIN_FLAGS,
                   *TINY_DIM_FLAGS, "--max-update", 1, "--save-dir", tmp_path,
                   "--finetune-from-model", other_checkpoints["soft_pre"], check=False)
    one_error_line(proc, "it has final layer norms")
    assert "trained with pre-norm layers" in proc.stderr and "use its _prenorm preset" in proc.stderr


def test_the_bpe_of_interactive_and_the_hub_splits_as_the_training_data(tmp_path):
    """--bpe subword_nmt_vocab applies subword-nmt's vocabulary filter, as
    bpe_binarize.sh does; fairseq's subword_nmt does not."""
    from fairseq.data.encoders import build_bpe
    from argparse import Namespace

    # "ab" is always merged on into abx, aby or abz: the filter undoes it elsewhere
    (tmp_path / "train").write_text("abx aby abz\n" * 20)
    subword_nmt = [str(BIN_DIR / "subword-nmt")]
    subprocess.run([*subword_nmt, "learn-joint-bpe-and-vocab", "--input", tmp_path / "train", "-s", "4",
                    "-o", tmp_path / "codes", "--write-vocabulary", tmp_path / "vocab"], check=True,
                   capture_output=True)
    sentence = "abq abx"
    applied = subprocess.run([*subword_nmt, "apply-bpe", "-c", tmp_path / "codes", "--vocabulary",
                              tmp_path / "vocab", "--vocabulary-threshold", "1"], input=sentence + "\n",
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = build_bpe(Namespace(bpe="subword_nmt_vocab", bpe_codes=str(tmp_path / "codes"),
                               bpe_vocabulary=str(tmp_path / "vocab"), bpe_vocabulary_threshold=1,
                               bpe_separator="@@"))
    fairseqs = build_bpe(Namespace(bpe="subword_nmt", bpe_codes=str(tmp_path / "codes"), bpe_separator="@@"))
    assert ours.encode(sentence) == applied == "a@@ b@@ q abx"
    assert fairseqs.encode(sentence) != applied  # the case the filter is for
    assert ours.decode(ours.encode(sentence)) == sentence


def test_quickstart_prints_the_error_of_a_failing_step(reorder_data, tmp_path):
    raw = reorder_data.parent / "raw"
    proc = subprocess.run(["bash", str(REPO / "examples" / "quickstart.sh"), str(raw), "src", "tgt",
                           str(tmp_path / "work")], env=tool_env(ARCH="transformer_hard_dec_smal", EPOCHS="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert re.search(r"quickstart.sh: training transformer_hard_dec_smal for 1 epochs \(\d+ warmup "
                     r"updates\) failed", proc.stderr), proc.stderr[-2000:]
    assert "fairseq-hardattn: error: unknown --arch 'transformer_hard_dec_smal'" in proc.stderr
    missing = subprocess.run(["bash", str(REPO / "examples" / "quickstart.sh"), str(raw), "src", "tgt",
                              str(tmp_path / "work2")], env=tool_env(VALID="val"),
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and f"missing {raw}/val.src" in missing.stderr


@pytest.mark.parametrize("flags, expected", [
    (["--beam", 0], "--beam must be >= 1, got 0"),
    (["--beam", -2], "--beam must be >= 1, got -2"),
    (["--max-tokens", 5, "--batch-size", 100], "--max-tokens 5 is smaller than a sentence of the data set"),
])
def test_impossible_decoding_settings_are_one_line(trained_checkpoints, reorder_data, flags, expected):
    one_error_line(generate(reorder_data, trained_checkpoints["hard"], *flags, check=False), expected)


def test_training_with_max_tokens_below_every_sentence_is_one_line(reorder_data, tmp_path):
    flags = [f for f in TRAIN_FLAGS]
    flags[flags.index("--max-tokens") + 1] = "3"
    proc = run_cli("fairseq-train", reorder_data, "--arch", "transformer_hard_dec", *flags,
                   *TINY_DIM_FLAGS, "--max-update", 1, "--save-dir", tmp_path, check=False)
    one_error_line(proc, "every sentence was left out")


def test_a_checkpoint_directory_names_its_best_and_last_checkpoints_first(trained_checkpoints, reorder_data,
                                                                        tmp_path):
    for name in ("checkpoint1.pt", "checkpoint2.pt", "checkpoint10.pt", "checkpoint_best.pt",
                 "checkpoint_last.pt"):
        (tmp_path / name).write_bytes(b"x")
    one_error_line(generate(reorder_data, tmp_path, check=False),
                   "(checkpoint_best.pt, checkpoint_last.pt, checkpoint1.pt, checkpoint2.pt, checkpoint10.pt)")


def test_train_help_lists_the_plugins_options_for_its_architectures(reorder_data):
    proc = run_cli("fairseq-train", reorder_data, "--user-dir", USER_DIR, "--arch",
                   "transformer_topk_dec_small", "--help")
    groups = re.split(r"\n(?=\S.*:\n)", proc.stdout)
    ours = next(g for g in groups if g.startswith("Model configuration (fairseq-hardattn, "
                                                  "transformer_topk_dec_small)"))
    fairseqs = next(g for g in groups if g.startswith("Model configuration (fairseq's Transformer)"))
    for option in ("--retrieval-k", "--dec-self-attn-kind", "--decoding-engine", "--int8-decoding",
                   "--decoding-workers", "--hard-train-retrieval"):
        assert option in ours and option not in fairseqs
    assert "--encoder-layers" in fairseqs and "--encoder-layers" not in ours


def test_generate_and_interactive_help_list_the_plugins_decoding_settings(reorder_data):
    """Where fairseq lists its generation options, as the --model-overrides
    keys they are (not options these commands would take)."""
    for tool in ("fairseq-generate", "fairseq-interactive"):
        proc = run_cli(tool, reorder_data, "--user-dir", USER_DIR, "--help")
        groups = re.split(r"\n(?=\S.*:\n)", proc.stdout)
        titles = [g.split(":\n", 1)[0] for g in groups]
        ours = titles.index("fairseq-hardattn decoding (with the plugin loaded)")
        assert titles[ours - 1] == "Generation"
        for key in ("'decoding_engine':", "'int8_decoding': True", "'decoding_workers': N", "'retrieval_k': K"):
            assert key in groups[ours], key
        assert "--model-overrides" in groups[ours]
    refused = run_cli("fairseq-generate", reorder_data, "--user-dir", USER_DIR, "--decoding-workers", "2",
                      check=False)
    one_error_line(refused, "unrecognized arguments: --decoding-workers 2")


def test_int8_decoding_says_so_and_a_soft_checkpoint_decoded_hard_warns_of_nothing(trained_checkpoints,
                                                                                reorder_data):
    soft = trained_checkpoints["soft"]
    int8 = generate(reorder_data, soft, "--model-overrides", "{'int8_decoding': True}")
    assert re.search(r"int8 decoding \(--int8-decoding\): \d+ Linear layers quantized", int8.stderr)
    hard = generate(reorder_data, soft, "--model-overrides", HARD_KINDS)
    assert "WARNING" not in hard.stderr, hard.stderr[-2000:]


def test_python_m_fairseq_hardattn_answers_help_and_version():
    run = lambda *args: subprocess.run([sys.executable, "-m", "fairseq_hardattn", *args], env=tool_env(),
                                       capture_output=True, text=True, cwd="/")
    assert re.fullmatch(r"fairseq-hardattn \S+\n", run("--version").stdout)
    assert "the value of fairseq's --user-dir" in run("--help").stdout
    assert run().stdout.strip() == USER_DIR
