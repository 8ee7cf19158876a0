"""Every architecture of the plugin trained with one recipe (common.sh):
the runs of the main table (results/README.md), the peers decoded by
fairseq's own models, and the rows the README's headline table picks."""

from dataclasses import dataclass

from .hard_parity import HARD_PRE_ARGMAX, HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, SOFT_PRE, SOFT_PRE_DROP01_H8
from .manifest import Benchmark, Decode, Run, decoded_with
from .topk import PRESET_K as TOPK_PRESET_K, PRESET_RUN as TOPK_PRESET_RUN

RUNS = (
    Run("soft", "transformer_soft_small", "", "soft baseline: fairseq's Transformer, small preset"),
    Run("hard", "transformer_hard_dec_small", "",
        "hard retrieval attention in decoder self- and cross-attention"),
    SOFT_PRE,
    HARD_PRE_ARGMAX,
    SOFT_PRE_DROP01_H8,
    HARD_PRE_ARGMAX_DROP01_H8_ANNEAL,
    Run("cross_self", "transformer_cross_self_small", "",
        "cross+self attention over [final encoder; decoder] states"),
    Run("cross_self_layerwise", "transformer_cross_self_layerwise_small", "",
        "cross+self, decoder layer i attends to encoder layer i"),
    Run("cross_self_share_attn", "transformer_cross_self_small", "--enc-dec-sharing attention",
        "cross+self, encoder/decoder layers share attention"),
    Run("cross_self_share_ffn", "transformer_cross_self_small", "--enc-dec-sharing attention+ffn",
        "cross+self, sharing attention + feed-forward"),
    Run("cross_self_share_all", "transformer_cross_self_small",
        "--enc-dec-sharing attention+ffn+norm",
        "cross+self, sharing attention + feed-forward + layer norms"),
    Run("hard_cross_self", "transformer_hard_cross_self_small", "",
        "hard retrieval cross+self attention"),
    Run("aan", "transformer_aan_small", "", "average attention network replaces decoder self-attention"),
    Run("aan_no_ffn", "transformer_aan_small", "--aan-ffn-dim 0",
        "average attention network without its FFN (average + gate)"),
    Run("local", "transformer_local_small", "", "Luong local-p cross-attention (window D=10)"),
    Run("flexible", "transformer_flexible_small", "",
        "flexible cross-attention (tracked centre, gated penalty)"),
    Run("flexible_gate32", "transformer_flexible_small", "--flexible-gate-dim 32",
        "flexible cross-attention with a 32-unit gate network (d/4: a quarter of its per-step product)"),
    Run("hard_cross", "transformer_hard_cross_small", "",
        "ablation: hard retrieval in decoder cross-attention only"),
    Run("hard_all", "transformer_hard_all_small", "", "ablation: hard retrieval in encoder self-attention too"),
)

DECODES = (
    # what users have today: the soft checkpoint decoded by fairseq's own Transformer
    Decode("fairseq", "soft", {"_name": "transformer"},
           "the soft checkpoint decoded by fairseq's own transformer (the peer)"),
    # fairseq's own cross+self decodes the cross_self checkpoint (identical training)
    Decode("fairseq_cross_self", "cross_self", {"_name": "transformer"},
           "fairseq's own cross+self attention (the peer; same trained weights as cross_self)"),
    # the paper's Table 4: a model decoded with the other attention kind
    decoded_with("soft", "hard"),
    decoded_with("hard", "soft"),
)

# rows of the main table after the runs: fine-tunings and Table-4 switches, in this order
TABLE_EXTRA_ROWS = ("fairseq", "fairseq_h8", "hard_pre_argmax_from_soft", "hard_pre_argmax_from_soft_kd",
                    "hard_pre_from_soft", "soft_pre_more",
                    "soft_decoded_hard", "hard_decoded_soft", "soft_pre_decoded_hard",
                    "hard_pre_argmax_decoded_soft", "fairseq_cross_self",
                    "flexible_ft", "flexible_band_ft", "flexible_gate32_band_ft", "soft_ft",
                    "flexible_ce_ft", "flexible_band_5ep_ft")


@dataclass(frozen=True)
class Headline:
    """A row of the README's table: the preset a user picks, what it changes,
    the run whose test2016 BLEU it shows, and its model in the headline speed
    benchmark (fp32, and ``_int8``) and in the GPU table's benchmark."""
    preset: str
    what: str
    run: str
    gpu_model: str = ""


# the architectures a user would pick, at the small preset (the peers first)
HEADLINES = (
    Headline("transformer", "fairseq's own Transformer, fairseq's generator (the peer)", "fairseq", "fairseq"),
    Headline("ctranslate2", "CTranslate2 decoding the same weights (the peer users pick for speed)", ""),
    Headline("transformer_soft_small", "soft attention, the plugin's decoding engine", "soft", "soft"),
    Headline("transformer_soft_prenorm_small", "soft, pre-norm layers (the hard presets' counterpart)",
             SOFT_PRE.name),
    Headline("transformer_hard_dec_prenorm_small", "hard retrieval in decoder self- and cross-attention "
             "(pre-norm, straight-through argmax)", HARD_PRE_ARGMAX.name),
    Headline("transformer_hard_dec_anneal_small", "the same with 8 decoder heads and a soft-to-hard "
             "curriculum, at dropout 0.1", HARD_PRE_ARGMAX_DROP01_H8_ANNEAL.name),
    Headline("transformer_topk_dec_small",
             f"top-k retrieval (each head attends softly to its k = {TOPK_PRESET_K} best keys)",
             TOPK_PRESET_RUN),
    Headline("transformer_cross_self_small", "cross+self: one attention over [encoder; decoder]",
             "cross_self", "cross_self"),
    Headline("transformer_aan_small", "average attention network in decoder self-attention", "aan", "aan"),
    Headline("transformer_flexible_small", "flexible cross-attention (skips distant source positions)",
             "flexible", "flexible"),
    Headline("transformer_local_small", "Luong's local cross-attention (flexible's baseline)",
             "local", "local"),
)
HEADLINE_PEERS = ("transformer", "ctranslate2")


def _headline_models(int8=True) -> str:
    args = ["--arch transformer=transformer", "--ctranslate2 ctranslate2=transformer:float32"]
    if int8:
        args.append("--ctranslate2 ctranslate2_int8=transformer:int8")
    for preset in (h.preset for h in HEADLINES if h.preset not in HEADLINE_PEERS):
        # flexible attention's threshold rule reads the mean source length (the benchmark's sources)
        own = "'flexible_mean_source_length':30.0" if "flexible" in preset else ""
        args.append(f"--arch {preset}={preset}" + (f" --override {preset}={{{own}}}" if own else ""))
        if int8:
            args.append(f"--arch {preset}_int8={preset} --override {preset}_int8="
                        + "{" + ",".join(filter(None, (own, "'int8_decoding':True"))) + "}")
    return " ".join(args)


# the table's CPU columns: every headline preset (fp32 and int8) beside fairseq's
# transformer and CTranslate2 on the same weights (the small presets' dims, random
# weights: 30-token sources decoded to exactly 30 tokens, beam 4, one thread)
HEADLINE_SPEED = Benchmark(
    "speed_headline", "the README table's CPU columns: every preset a user would pick, fp32 and int8, "
    "beside fairseq's transformer and CTranslate2 (small preset, random weights, 30 tokens)",
    f"{_headline_models()} --dims small --vocab 10000 --src-len 30 --num-sentences 256 --batch-size 64 "
    "--fixed-output-len 30 --beam 4 --reps 3 --threads 1 --baseline transformer")
# the same presets (fp32) on all the cores, as fairseq-generate decodes by default
# (--decoding-workers auto), each system in a process of its own: whether each
# keeps its one-thread ratio to soft there
HEADLINE_SPEED_CORES = Benchmark(
    "speed_headline_cores", "speed_headline's fp32 presets on all the cores (each system in its own "
    "process; the plugin's with its default decoding workers)",
    f"{_headline_models(int8=False)} --dims small --vocab 10000 --src-len 30 --num-sentences 256 "
    "--batch-size 64 --fixed-output-len 30 --beam 4 --reps 3 --threads all --baseline transformer")
