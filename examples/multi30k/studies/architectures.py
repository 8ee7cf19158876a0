"""Every architecture of the plugin trained with one recipe (common.sh):
the runs of the main table (results/README.md), the peers decoded by
fairseq's own models, and the rows the README's headline table picks."""

from .hard_parity import HARD_PRE_ARGMAX, HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, SOFT_PRE, SOFT_PRE_DROP01_H8
from .manifest import Decode, Run, decoded_with

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
