"""Hard retrieval attention toward parity with soft attention, trained from
scratch (results/hard_parity.md, HARD_PARITY.md): the parity
recipe's presets and every from-scratch change tried (sampling vs argmax,
curricula, dropout, heads, distillation, bigger models), each beside its soft
counterpart trained alike, and their Table-4 switches."""

from dataclasses import replace

from .manifest import RETIRED_OPTIONS_COMMIT, Decode, Run, decoded_with, reseeded

# the entropy penalty's one measured weight (it did not help)
ENTROPY_WEIGHT = 0.003
ENTROPY_PENALTY = f"--hard-entropy-penalty {ENTROPY_WEIGHT:g}"

# the parity recipe's presets: pre-norm layers, hard and its soft counterpart
SOFT_PRE = Run("soft_pre", "transformer_soft_prenorm_small", "", "soft baseline with pre-norm layers")
HARD_PRE_ARGMAX = Run("hard_pre_argmax", "transformer_hard_dec_prenorm_small", "",
                      "hard retrieval attention (decoder self- and cross-), the parity recipe: "
                      "pre-norm layers, straight-through argmax in training")

# the parity recipe at dropout 0.1: at 0.2 (HARD_PRE_ARGMAX_DROP02) hard retrieval
# gained more than soft on both seeds
HARD_PRE_ARGMAX_DROP01 = replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_drop01", flags="--dropout 0.1",
                                 what="the parity recipe with dropout 0.1 (the recipe: 0.3)")
SOFT_PRE_DROP01 = replace(SOFT_PRE, name="soft_pre_drop01", flags="--dropout 0.1",
                          what="soft_pre with dropout 0.1 (hard_pre_argmax_drop01's soft counterpart)")
# heads with the best recipe: 8 decoder heads retrieve twice the tokens per
# layer (at Base dims, 8 heads of 64, hard's validation loss matched soft's)
EIGHT_DECODER_HEADS = "--decoder-attention-heads 8"
HARD_PRE_ARGMAX_DROP01_H8 = replace(HARD_PRE_ARGMAX_DROP01, name="hard_pre_argmax_drop01_h8",
                                    flags=f"{HARD_PRE_ARGMAX_DROP01.flags} {EIGHT_DECODER_HEADS}",
                                    what="the parity recipe with dropout 0.1 and 8 decoder heads (of 16 dims)")
# the soft counterpart's preset: transformer_soft_prenorm_small with 8 decoder
# heads (the same model: tests/unit/test_models.py)
SOFT_PRE_DROP01_H8 = Run("soft_pre_drop01_h8", "transformer_soft_prenorm_h8_small", SOFT_PRE_DROP01.flags,
                         "soft_pre with dropout 0.1 and 8 decoder heads (the soft counterpart of "
                         "hard_pre_argmax_drop01_h8 and of the curriculum)")
HARD_PRE_ARGMAX_DROP01_H8_S2 = reseeded(HARD_PRE_ARGMAX_DROP01_H8, 2)
SOFT_PRE_DROP01_H8_S2 = reseeded(SOFT_PRE_DROP01_H8, 2)
# the soft-to-hard curriculum, the from-scratch change that helped most at
# dropout 0.3 (hard_pre_anneal over hard_pre: +0.28 valid / +0.57 test2016), on
# the recipe closest to parity; the soft counterparts are the 8-head runs. Its
# preset is hard_pre_argmax_drop01_h8's with the curriculum over the first
# 1500 updates (the same model: tests/unit/test_models.py)
CURRICULUM_UPDATES = 1500
CURRICULUM = f"--hard-anneal-updates {CURRICULUM_UPDATES}"
HARD_PRE_ARGMAX_DROP01_H8_ANNEAL = Run(
    "hard_pre_argmax_drop01_h8_anneal", "transformer_hard_dec_anneal_small", HARD_PRE_ARGMAX_DROP01.flags,
    "the parity recipe with dropout 0.1, 8 decoder heads and the soft-to-hard curriculum "
    f"over the first {CURRICULUM_UPDATES} updates (~half): the nearest to soft")
HARD_PRE_ARGMAX_DROP01_H8_ANNEAL_S2 = reseeded(HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, 2)
# the seeds trained only for the curriculum's pair, each (hard, soft): seed 3,
# as two seeds met the parity target only in their mean, and seed 4, the last,
# as three left the validation gap at -0.32, by the seeds' spread (0.4)
# undecided against the 0.3 bound
CURRICULUM_RESEEDS = tuple((reseeded(HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, seed), reseeded(SOFT_PRE_DROP01_H8, seed))
                           for seed in (3, 4))
# the curriculum's seeds, each with the soft run of its seed, by name
CURRICULUM_PAIRS = tuple((hard.name, soft.name) for hard, soft in (
    (HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, SOFT_PRE_DROP01_H8),
    (HARD_PRE_ARGMAX_DROP01_H8_ANNEAL_S2, SOFT_PRE_DROP01_H8_S2),
    *CURRICULUM_RESEEDS))

# the ablation toward hard/soft parity: trained with the same
# budget as every run; hard and soft variants side by side. The _prenorm
# presets are the plain ones with --encoder-normalize-before
# --decoder-normalize-before (the same models: tests/unit/test_models.py)
HARD_PRE_COOL = Run("hard_pre_cool", "transformer_hard_dec_prenorm_small", "--hard-cooling-updates 1500",
                    "hard, pre-norm, sampling cooled into the argmax over the first 1500 updates (~half)",
                    retired=RETIRED_OPTIONS_COMMIT)
HARD_PRE_ARGMAX_DROP02 = replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_drop02", flags="--dropout 0.2",
                                 what="the parity recipe with dropout 0.2 (the recipe: 0.3)")
SOFT_PRE_DROP02 = replace(SOFT_PRE, name="soft_pre_drop02", flags="--dropout 0.2",
                          what="soft_pre with dropout 0.2 (hard_pre_argmax_drop02's soft counterpart)")
# the curriculum with 8 heads at dropout 0.2, the dropout at which soft is best
# on validation: does the curriculum's gain carry to the soft recipe one would choose?
HARD_PRE_ARGMAX_DROP02_H8_ANNEAL = replace(
    HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, name="hard_pre_argmax_drop02_h8_anneal", flags=HARD_PRE_ARGMAX_DROP02.flags,
    what="the parity recipe with dropout 0.2, 8 decoder heads and the soft-to-hard curriculum "
         f"over the first {CURRICULUM_UPDATES} updates (~half)")
SOFT_PRE_DROP02_H8 = replace(SOFT_PRE_DROP01_H8, name="soft_pre_drop02_h8", flags=SOFT_PRE_DROP02.flags,
                             what="soft_pre with dropout 0.2 and 8 decoder heads "
                                  "(hard_pre_argmax_drop02_h8_anneal's soft counterpart)")
SOFT_PRE_DROP01_S2 = reseeded(SOFT_PRE_DROP01, 2)
SOFT_PRE_DROP01_S3 = reseeded(SOFT_PRE_DROP01, 3)
# the hard-trained heads keep only ~0.6 of their softmax mass on the key they
# retrieve (teacher-forced, validation): the straight-through gradient assumes
# P·V where the forward takes V[argmax]. An entropy penalty sharpens P
HARD_PRE_ARGMAX_DROP02_ENTROPY = replace(
    HARD_PRE_ARGMAX_DROP02, name="hard_pre_argmax_drop02_entropy0003",
    flags=f"{HARD_PRE_ARGMAX_DROP02.flags} {ENTROPY_PENALTY}",
    what=f"the parity recipe with dropout 0.2 and an entropy penalty of {ENTROPY_WEIGHT:g} on its "
         "hard heads' training distributions", retired=RETIRED_OPTIONS_COMMIT)  # 0.01: stopped after 6 epochs, learning slower still
# where the gap comes from, trained from scratch: hard retrieval in decoder
# self-attention only (the conversion closest to parity), cross-attention soft
HARD_PRE_SELF = replace(HARD_PRE_ARGMAX, name="hard_pre_self", flags="--dec-cross-attn-kind soft",
                        what="the parity recipe with hard retrieval in decoder self-attention only "
                             "(cross-attention soft)")
# bigger models than the small preset (trained on a GPU): is the hard-decoding
# cost a property of 4 heads of 32 dims? d = 256 keeps 4 heads, now of 64 dims;
# Base dims (6+6 layers, d = 512, 8 heads of 64: the paper's) take a peak lr
# for their size, and save no optimizer state (4x smaller epoch checkpoints)
WIDE_HEADS = ("--encoder-embed-dim 256 --decoder-embed-dim 256 "
              "--encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024")
BASE_RUN_FLAGS = "--lr 0.001 --no-save-optimizer-state"
HARD_PRE_ARGMAX_D256 = replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_d256", flags=WIDE_HEADS,
                               what="the parity recipe at d = 256 (4 heads of 64 dims, FFN 1024)")
SOFT_PRE_D256 = replace(SOFT_PRE, name="soft_pre_d256", flags=WIDE_HEADS,
                        what="soft_pre at d = 256 (hard_pre_argmax_d256's soft counterpart)")
HARD_PRE_ARGMAX_BASE = Run("hard_pre_argmax_base", "transformer_hard_dec_prenorm", BASE_RUN_FLAGS,
                           "the parity recipe at Transformer Base dims (6+6 layers, d = 512, "
                           "8 heads of 64), peak lr 0.001")
SOFT_PRE_BASE = Run("soft_pre_base", "transformer_soft_prenorm", BASE_RUN_FLAGS,
                    "soft_pre at Base dims (hard_pre_argmax_base's soft counterpart)")
# trained from scratch for this study (the main table's parity rows: architectures.py)
RUNS = (
    Run("hard_pre", "transformer_hard_dec_prenorm_small", "--hard-train-retrieval sample",
        "hard, pre-norm, keys sampled in training (the paper's)"),
    Run("hard_pre_anneal", "transformer_hard_dec_prenorm_small",
        f"--hard-train-retrieval sample {CURRICULUM}",
        f"hard, pre-norm, soft-to-hard curriculum over the first {CURRICULUM_UPDATES} updates (~half)"),
    HARD_PRE_COOL,
    reseeded(HARD_PRE_COOL, 2),
    Run("hard_pre_h8", "transformer_hard_dec_prenorm_small",
        "--hard-train-retrieval sample --decoder-attention-heads 8",
        "hard, pre-norm, 8 decoder heads (of 16 dims)"),
    Run("soft_pre_h8", "transformer_soft_prenorm_small", "--decoder-attention-heads 8",
        "soft, pre-norm, 8 decoder heads"),
    # the recipe and its soft counterpart with a second training seed: the gap's noise
    reseeded(HARD_PRE_ARGMAX, 2),
    reseeded(SOFT_PRE, 2),
    # is hard retrieval held back by the recipe's regularisation? (its training
    # loss stays above soft's)
    HARD_PRE_ARGMAX_DROP02,
    SOFT_PRE_DROP02,
    reseeded(HARD_PRE_ARGMAX_DROP02, 2),
    reseeded(SOFT_PRE_DROP02, 2),
    HARD_PRE_SELF,
    reseeded(HARD_PRE_SELF, 2),
    HARD_PRE_ARGMAX_DROP01,
    SOFT_PRE_DROP01,
    reseeded(HARD_PRE_ARGMAX_DROP01, 2),
    SOFT_PRE_DROP01_S2,
    HARD_PRE_ARGMAX_DROP01_H8,
    HARD_PRE_ARGMAX_DROP01_H8_S2,
    SOFT_PRE_DROP01_H8_S2,
    HARD_PRE_ARGMAX_DROP01_H8_ANNEAL_S2,
    *(run for pair in CURRICULUM_RESEEDS for run in pair),
    HARD_PRE_ARGMAX_DROP02_H8_ANNEAL,
    SOFT_PRE_DROP02_H8,
    SOFT_PRE_DROP01_S3,
    HARD_PRE_ARGMAX_DROP02_ENTROPY,
    HARD_PRE_ARGMAX_D256,
    SOFT_PRE_D256,
    HARD_PRE_ARGMAX_BASE,
    SOFT_PRE_BASE,
    # sequence-level distillation (Kim and Rush, 2016): soft_pre's beam
    # translations of the training sources replace the references, for the
    # hard recipe and its soft counterpart alike
    replace(HARD_PRE_ARGMAX, name="hard_pre_argmax_seqkd", corpus="soft_pre",
            what="the parity recipe trained on soft_pre's translations of the training set "
                 "(sequence-level distillation)"),
    replace(SOFT_PRE, name="soft_pre_seqkd", corpus="soft_pre",
            what="soft_pre's recipe trained on soft_pre's translations of the training set "
                 "(hard_pre_argmax_seqkd's soft counterpart)"),
)

# the paper's Table 4 for this study's runs: decoded with the other attention kind
DECODES = (
    # the curriculum's soft counterpart decoded by fairseq's own transformer (the peer of its speed benchmark)
    Decode("fairseq_h8", SOFT_PRE_DROP01_H8.name, {"_name": "transformer"},
           f"the {SOFT_PRE_DROP01_H8.name} checkpoint decoded by fairseq's own transformer (the peer)"),
    *(decoded_with(run, "hard") for run in ("soft_pre", "soft_pre_drop01", "soft_pre_drop01_s2",
                                            *(soft for _, soft in CURRICULUM_PAIRS), "soft_pre_drop02_h8")),
    *(decoded_with(run, "soft") for run in ("hard_pre", "hard_pre_argmax", "hard_pre_argmax_drop01",
                                            "hard_pre_argmax_drop01_s2", "hard_pre_argmax_drop01_h8",
                                            HARD_PRE_ARGMAX_DROP01_H8_S2.name,
                                            *(hard for hard, _ in CURRICULUM_PAIRS),
                                            "hard_pre_argmax_drop02_h8_anneal",
                                            "hard_pre_argmax_drop02_entropy0003")),
    # which of the two hard attentions costs the hard-trained model its BLEU
    *(Decode(f"hard_pre_argmax_drop01_hard_{hard}_only", "hard_pre_argmax_drop01", {f"dec_{soft}_attn_kind": "soft"},
             f"hard_pre_argmax_drop01 decoded with hard {hard}-attention, soft {soft}-attention")
      for hard, soft in (("self", "cross"), ("cross", "self"))),
)
