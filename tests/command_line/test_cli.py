"""End to end through fairseq's own command-line tools with ``--user-dir``."""

import logging
import re

import pytest
import torch

import fairseq_hardattn
from fairseq_hardattn.modules import HardRetrievalAttention, TopKAttention

from conftest import (
    MAX_LEN_B,
    TEST_SENTENCES,
    TINY_DIM_FLAGS,
    TRAIN_FLAGS,
    USER_DIR,
    generate,
    hypotheses,
    interactive,
    load_with_overrides,
    one_error_line,
    run_cli,
    tool_env,
    train,
)



# an empty line, a blank one, unknown words
ODD_LINES = ["s1 s2 s3", "", "   \t ", "s4 ∂∂ ünknöwn s5", "s7 s8"]


def decoder_kinds(model):
    layer = model.decoder.layers[0]
    return tuple(
        "hard" if isinstance(m, HardRetrievalAttention) else "soft"
        for m in (layer.self_attn, layer.encoder_attn)
    )


def test_plain_fairseq_transformer_checkpoint_decodes_hard(trained_checkpoints, reorder_data):
    overrides = "{'_name': 'transformer_hard_dec'}"
    model = load_with_overrides(trained_checkpoints["soft"], eval(overrides))
    assert decoder_kinds(model) == ("hard", "hard")
    out = generate(reorder_data, trained_checkpoints["soft"], "--model-overrides", overrides)
    assert len(hypotheses(out.stdout)) == TEST_SENTENCES


def test_hard_trained_checkpoint_decodes_soft(trained_checkpoints, reorder_data):
    overrides = "{'dec_self_attn_kind': 'soft', 'dec_cross_attn_kind': 'soft'}"
    assert decoder_kinds(load_with_overrides(trained_checkpoints["hard"], {})) == ("hard", "hard")
    model = load_with_overrides(trained_checkpoints["hard"], eval(overrides))
    assert decoder_kinds(model) == ("soft", "soft")
    out = generate(reorder_data, trained_checkpoints["hard"], "--model-overrides", overrides)
    assert len(hypotheses(out.stdout)) == TEST_SENTENCES


def test_print_alignment_with_hard_cross_attention(trained_checkpoints, reorder_data):
    out = generate(reorder_data, trained_checkpoints["hard"], "--print-alignment").stdout
    alignments = re.findall(r"^A-\d+\t(.*)$", out, flags=re.M)
    assert len(alignments) == TEST_SENTENCES
    assert all(re.fullmatch(r"(\d+-\d+ ?)+", a) for a in alignments if a)


def test_resume_and_eval_bleu_checkpoints_load_without_env_vars(reorder_data, tmp_path):
    """torch >= 2.6 refuses fairseq checkpoints unless the plugin allows their types."""
    bleu_flags = ["--eval-bleu", "--best-checkpoint-metric", "bleu",
                  "--maximize-best-checkpoint-metric", "--eval-bleu-args", '{"beam": 1}']
    train(reorder_data, tmp_path, "transformer_hard_dec", *bleu_flags, updates=2)
    resumed = train(reorder_data, tmp_path, "transformer_hard_dec", *bleu_flags, updates=4)
    assert "Loaded checkpoint" in resumed.stdout + resumed.stderr
    assert re.search(r"num_updates 4\b", resumed.stdout + resumed.stderr)
    out = generate(reorder_data, tmp_path / "checkpoint_best.pt")
    assert len(hypotheses(out.stdout)) == TEST_SENTENCES


def test_unknown_attention_kind_on_the_command_line(reorder_data, tmp_path):
    proc = run_cli(
        "fairseq-train", reorder_data, "--arch", "transformer_hard_dec", *TRAIN_FLAGS,
        "--dec-self-attn-kind", "fuzzy", "--save-dir", tmp_path, check=False,
    )
    one_error_line(proc, "unknown --dec-self-attn-kind 'fuzzy'; choose one of: hard, soft, topk")


def test_unknown_attention_kind_in_model_overrides_is_one_line(trained_checkpoints, reorder_data):
    proc = generate(reorder_data, trained_checkpoints["hard"], "--model-overrides",
                    "{'dec_cross_attn_kind': 'fuzzy'}", check=False)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "error: unknown --dec-cross-attn-kind 'fuzzy'; choose one of: soft, hard" in proc.stderr


def test_sharing_rows_print_their_parameter_counts(reorder_data, tmp_path):
    """fairseq prints the parameter count at start; sharing must lower it."""
    counts = {}
    for level in ("none", "attention", "attention+ffn", "attention+ffn+norm"):
        proc = train(reorder_data, tmp_path / level, "transformer_cross_self",
                     "--enc-dec-sharing", level, updates=1)
        found = re.search(r"num\. shared model params: ([\d,]+)", proc.stdout + proc.stderr)
        counts[level] = int(found.group(1).replace(",", ""))
    values = list(counts.values())
    assert values == sorted(values, reverse=True) and len(set(values)) == 4, counts
    out = generate(reorder_data, tmp_path / "attention+ffn+norm" / "checkpoint_last.pt")
    assert len(hypotheses(out.stdout)) == TEST_SENTENCES


def test_layerwise_with_unequal_depths_is_one_clear_line(reorder_data, tmp_path):
    proc = run_cli(
        "fairseq-train", reorder_data, "--arch", "transformer_cross_self_layerwise",
        *TRAIN_FLAGS, *TINY_DIM_FLAGS, "--encoder-layers", 3, "--save-dir", tmp_path,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert ("error: --cross-self-source layerwise pairs encoder layer i with decoder "
            "layer i: --encoder-layers (3) must equal --decoder-layers (2)") in proc.stderr


def test_finetune_soft_checkpoint_into_flexible_with_gate_loss(trained_checkpoints, reorder_data,
                                                               tmp_path):
    """Fine-tuning a soft baseline: the gate starts fresh, the criterion logs it,
    generation reports the score computations it skipped."""
    proc = train(reorder_data, tmp_path, "transformer_flexible",
                 "--finetune-from-model", trained_checkpoints["soft"],
                 "--criterion", "label_smoothed_cross_entropy_with_gate", "--gate-beta", 0.1,
                 updates=2)
    log = proc.stdout + proc.stderr
    assert re.search(r"\bgate[ =]0\.\d+", log), "the criterion logs mean(g)"
    assert "validation mean source length" in log  # for --flexible-threshold auto
    out = generate(reorder_data, tmp_path / "checkpoint_last.pt",
                   "--model-overrides", "{'print_cps': True, 'flexible_threshold': 0.5}")
    assert len(hypotheses(out.stdout)) == TEST_SENTENCES
    found = re.search(r"CPS ([\d.]+) \(global attention ([\d.]+)\)", out.stderr)
    assert found and float(found.group(1)) < float(found.group(2))


def test_soft_to_hard_conversion_workflow(trained_checkpoints, reorder_data, tmp_path):
    """README's conversion: fairseq's own soft transformer checkpoint
    fine-tuned with hard retrieval (--finetune-from-model) starts from the soft
    weights and saves a hard model; a pre-norm preset from a post-norm
    checkpoint is one line naming the missing final layer norms."""
    train(reorder_data, tmp_path / "hard", "transformer_hard_dec",
          "--finetune-from-model", trained_checkpoints["soft"], updates=1)
    soft = torch.load(trained_checkpoints["soft"], map_location="cpu", weights_only=False)
    hard = torch.load(tmp_path / "hard" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert hard["cfg"]["model"].dec_cross_attn_kind == "hard"
    assert hard["model"].keys() == soft["model"].keys()
    out = generate(reorder_data, tmp_path / "hard" / "checkpoint_last.pt")
    assert len(hypotheses(out.stdout)) == TEST_SENTENCES
    proc = run_cli("fairseq-train", reorder_data, "--arch", "transformer_hard_dec_prenorm", *TRAIN_FLAGS,
                   *TINY_DIM_FLAGS, "--finetune-from-model", trained_checkpoints["soft"],
                   "--save-dir", tmp_path / "prenorm", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "fairseq-hardattn: error: the checkpoint does not fit transformer_hard_dec_prenorm: it has no final layer norms" in proc.stderr
    assert "use the preset without _prenorm" in proc.stderr


def test_flexible_threshold_must_be_positive(reorder_data, tmp_path):
    proc = run_cli(
        "fairseq-train", reorder_data, "--arch", "transformer_flexible", *TRAIN_FLAGS,
        *TINY_DIM_FLAGS, "--flexible-threshold", "0", "--save-dir", tmp_path, check=False,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "error: --flexible-threshold must be > 0, got 0.0" in proc.stderr


def test_checkpoint_of_another_family_is_one_clear_line(trained_checkpoints, reorder_data):
    """A plain transformer checkpoint has no average-attention parameters."""
    proc = generate(reorder_data, trained_checkpoints["soft"],
                    "--model-overrides", "{'_name': 'transformer_aan'}", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert re.search(r"error: the checkpoint does not fit transformer_aan: \d+ parameters missing",
                     proc.stderr)


def test_preset_name_does_not_silently_override_a_checkpoints_own_kinds(reorder_data, tmp_path):
    train(reorder_data, tmp_path, "transformer_soft_small", updates=1)
    out = generate(reorder_data, tmp_path / "checkpoint_last.pt",
                   "--model-overrides", "{'_name': 'transformer_hard_dec_small'}")
    assert "which the preset transformer_hard_dec_small does not change" in out.stderr
    assert "'dec_self_attn_kind': 'hard'" in out.stderr  # how to switch instead


def test_console_scripts_in_the_forkserver_behave_as_fresh_processes(trained_checkpoints,
                                                                    reorder_data, tmp_path):
    """The tests run fairseq's console scripts in children of one process that
    imported torch and fairseq (``cli_forkserver``); a fresh process (any
    ``env`` makes ``run_cli`` start one) prints the same translations, the same
    log lines on the same stream (timings aside) and the same one-line error."""
    def normalized(text):
        return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text).splitlines()

    commands = [
        ("fairseq-generate", reorder_data, "--user-dir", USER_DIR, "--path",
         trained_checkpoints["hard"], "--beam", 4, "--cpu", "--print-alignment",
         "--max-len-b", MAX_LEN_B),
        ("fairseq-interactive", reorder_data, "--user-dir", USER_DIR, "--path",
         trained_checkpoints["soft"], "--beam", 2, "--cpu", "--source-lang", "src",
         "--target-lang", "tgt", "--max-len-b", MAX_LEN_B),
        ("fairseq-train", reorder_data, "--arch", "transformer_hard_dec", *TRAIN_FLAGS,
         *TINY_DIM_FLAGS, "--max-update", 1, "--save-dir", tmp_path, "--no-save"),
        ("fairseq-train", reorder_data, "--arch", "transformer_hard_dec", *TRAIN_FLAGS,
         "--dec-self-attn-kind", "fuzzy", "--save-dir", tmp_path),
        ("fairseq-generate", reorder_data, "--user-dir", USER_DIR, "--path",
         trained_checkpoints["hard"], "--cpu", "--model-overrides",
         "{'dec_cross_attn_kind': 'fuzzy'}"),
    ]
    for tool, *args in commands:
        forked = run_cli(tool, *args, check=False, input="s1 s2 s3\ns4\n")
        fresh = run_cli(tool, *args, check=False, input="s1 s2 s3\ns4\n", env=tool_env())
        assert forked.returncode == fresh.returncode, tool
        assert normalized(forked.stdout) == normalized(fresh.stdout), tool
        assert normalized(forked.stderr) == normalized(fresh.stderr), tool
    assert forked.returncode != 0 and "Traceback" not in forked.stderr
    assert "fairseq-hardattn: error: unknown --dec-cross-attn-kind 'fuzzy'" in forked.stderr


def test_int8_decoding_through_generate_interactive_and_the_hub(trained_checkpoints, reorder_data):
    """--int8-decoding as a decoding-time override (generate, interactive,
    also on a fairseq transformer checkpoint) and a hub argument: the Linear
    layers become the plugin's int8 ones, every sentence is translated."""
    from fairseq.models.transformer import TransformerModel

    from fairseq_hardattn.decoding.int8 import Int8Linear

    from conftest import interactive

    for kind in ("hard", "soft"):
        out = generate(reorder_data, trained_checkpoints[kind], "--model-overrides", "{'int8_decoding': True}")
        assert len(hypotheses(out.stdout)) == TEST_SENTENCES
    proc = interactive(reorder_data, trained_checkpoints["hard"], ["s1 s2 s3", "s4"], "--model-overrides",
                       "{'int8_decoding': True}")
    assert proc.returncode == 0 and len(hypotheses(proc.stdout)) == 2, proc.stderr[-2000:]
    checkpoint = trained_checkpoints["hard"]
    hub = TransformerModel.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                                           data_name_or_path=str(reorder_data), user_dir=USER_DIR,
                                           int8_decoding=True)
    assert isinstance(hub.models[0].decoder.output_projection, Int8Linear)
    assert hub.translate(["s1 s2 s3", "s4 s5"], beam=4)


def test_int8_quantizes_every_linear_layer_and_leaves_the_process_as_it_was():
    """quantize_for_decoding makes every Linear layer an Int8Linear (the
    output projection too), changes nothing of the process (torch's
    quantized engine, its threads) and stays within int8 rounding of
    float32."""
    from fairseq_hardattn.decoding.int8 import Int8Linear, quantize_for_decoding

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(64, 256)
            self.output_projection = torch.nn.Linear(256, 1000)

        def forward(self, x):
            return self.output_projection(torch.relu(self.layer(x)))

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.decoder = Decoder()
    x = torch.randn(32, 64)
    with torch.no_grad():
        expected = model.decoder(x)
    before = (torch.backends.quantized.engine, torch.get_num_threads())
    quantize_for_decoding(model)
    assert (torch.backends.quantized.engine, torch.get_num_threads()) == before
    assert all(isinstance(m, Int8Linear) for m in (model.decoder.layer, model.decoder.output_projection))
    with torch.no_grad():
        error = (model.decoder(x) - expected).norm() / expected.norm()
    assert error < 0.05


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_interactive_survives_empty_blank_and_unknown_input(trained_checkpoints, reorder_data, kind):
    proc = interactive(reorder_data, trained_checkpoints[kind], ODD_LINES)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    # one hypothesis per input line, the unknown words as <unk>
    assert sorted(map(int, re.findall(r"^H-(\d+)", proc.stdout, flags=re.M))) == list(range(5))
    assert re.search(r"^S-3\ts4 <unk> <unk> s5$", proc.stdout, flags=re.M)


def test_decoding_is_byte_identical_across_runs_and_has_the_same_text_across_batch_sizes(
        trained_checkpoints, reorder_data):
    runs = [generate(reorder_data, trained_checkpoints["hard"], "--batch-size", bs).stdout
            for bs in (8, 8, 1, 20)]
    assert runs[0] == runs[1]  # same input, same batch size: byte-identical

    def texts(out):
        return sorted(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M))

    # other batch sizes: the same translations (scores differ in the last
    # float bits: batched matrix products round differently)
    assert texts(runs[0]) == texts(runs[2]) == texts(runs[3])


def test_a_fairseq_checkpoint_decodes_with_the_engine_by_default(trained_checkpoints, reorder_data):
    soft = trained_checkpoints["soft"]  # fairseq's own transformer
    default = generate(reorder_data, soft)
    assert "decoding the fairseq transformer checkpoint as the plugin's transformer_soft" in default.stderr
    fairseqs = generate(reorder_data, soft, "--model-overrides", "{'decoding_engine': 'fairseq'}")
    assert "H-0" in default.stdout and "H-0" in fairseqs.stdout


def test_an_ensemble_decodes_with_the_engine_through_generate(trained_checkpoints, reorder_data, caplog):
    """--path a.pt:b.pt (fairseq's published WMT models are used so): the
    plugin's search, not fairseq's generator; and through the hub."""
    ensemble = f"{trained_checkpoints['soft']}:{trained_checkpoints['hard']}"
    proc = generate(reorder_data, ensemble)
    assert "does not run" not in proc.stderr and len(re.findall(r"^H-", proc.stdout, re.M)) == 20
    hub = fairseq_hardattn.from_pretrained(
        str(trained_checkpoints["soft"].parent.parent), data_name_or_path=str(reorder_data), user_dir=USER_DIR,
        checkpoint_file="soft/checkpoint_last.pt:hard/checkpoint_last.pt")
    assert len(hub.models) == 2
    with caplog.at_level(logging.INFO):
        assert hub.translate("s1 s2 s3", beam=2)
    assert not any("does not run" in r.message for r in caplog.records)


def test_decoding_time_k_on_soft_and_topk_checkpoints(trained_checkpoints, reorder_data):
    """A soft checkpoint decoded with top-k retrieval (fairseq-generate and the
    loader), and the k of a topk model switched back to soft."""
    topk = {"dec_self_attn_kind": "topk", "dec_cross_attn_kind": "topk", "retrieval_k": 2}
    model = load_with_overrides(trained_checkpoints["soft"], topk)
    assert all(m.k == 2 for m in model.modules() if isinstance(m, TopKAttention))
    assert sum(isinstance(m, TopKAttention) for m in model.modules()) == 2 * len(model.decoder.layers)
    out = generate(reorder_data, trained_checkpoints["soft"], "--model-overrides", repr(topk))
    assert out.returncode == 0 and hypotheses(out.stdout)
    # k alone, on a model with no topk sublayer: one line
    refused = generate(reorder_data, trained_checkpoints["soft"], "--model-overrides",
                       "{'retrieval_k': 2}", check=False)
    assert refused.returncode != 0
    assert "fairseq-hardattn: error: --retrieval-k 2 has no topk sublayer" in refused.stderr
    assert "Traceback" not in refused.stderr
