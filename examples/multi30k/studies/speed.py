"""The speed benchmarks (scripts/benchmark_decoding.py, on a CPU and on a
GPU), which models each compares, the columns of the main table they fill,
and what every other output of scripts/results.sh shows."""

from .architectures import RUNS
from .hard_parity import HARD_PRE_ARGMAX_DROP01, HARD_PRE_ARGMAX_DROP01_H8_ANNEAL, SOFT_PRE_DROP01, SOFT_PRE_DROP01_H8
from .manifest import Benchmark, Decode
from .topk import PRESET_K, SEED1_RUNS as TOPK_SEED1_RUNS

_TRAINED = ("fairseq",) + tuple(run.name for run in RUNS) + (
    "flexible_ft", "flexible_band_ft", "flexible_gate32_band_ft", "fairseq_cross_self")
_SMALL_TEST = "--beam 4 --batch-size 64 --max-sentences 384 --fixed-output-len 20 --reps 5 --threads 1"


def _base_test(reps=3):
    """The Base-dims benchmarks' decoding settings: 128 test sources, 20 output tokens."""
    return (f"--beam 4 --batch-size 64 --max-sentences 128 --fixed-output-len 20 --reps {reps} "
            "--threads 1 --sublayer-times")


# the Base-dims benchmarks' baseline and fairseq's own model beside it
_BASE_PEERS = "--arch soft=transformer_soft --arch fairseq=transformer"
_BASE_PARITY_ARCHS = (f"{_BASE_PEERS} --arch hard=transformer_hard_dec "
                      "--arch soft_pre=transformer_soft_prenorm "
                      "--arch hard_pre_argmax=transformer_hard_dec_prenorm")
_BASE_WINDOWED = f"{_BASE_PEERS} --arch local=transformer_local --arch flexible=transformer_flexible"
BENCHMARKS = (
    # the trained checkpoints, the test set, 20 output tokens for every model:
    # the cost of the mechanisms, not of how long each model's translations are
    Benchmark("speed_small", "decoding and training speed, small preset, the trained checkpoints",
              f"--baseline soft {_SMALL_TEST} --train-batches 6 --sublayer-times", _TRAINED, True),
    Benchmark("speed_small_flexible",
              "the flexible family at the small preset, Multi30k test, the trained checkpoints "
              "(the band-trained ones also at τ = 0.75)",
              f"--baseline soft {_SMALL_TEST} --sublayer-times",
              ("soft", "fairseq", "soft_ft", "local", "flexible", "flexible_ft", "flexible_band_ft",
               "flexible_gate32", "flexible_gate32_band_ft", "flexible_band_ft_tau075",
               "flexible_gate32_band_ft_tau075"), True),
    # the parity recipe's presets, trained after speed_small was measured,
    # with the same settings beside soft, fairseq and hard
    Benchmark("speed_small_parity", "speed_small's settings for the parity presets beside soft, "
              "fairseq and hard (trained later)",
              f"--baseline soft {_SMALL_TEST} --train-batches 6 --sublayer-times",
              ("soft", "fairseq", "hard", "soft_pre", "hard_pre_argmax"), True),
    # the curriculum (8 heads) beside its soft counterpart, that checkpoint in
    # fairseq's own transformer, and the 4-head parity presets at the same dropout
    Benchmark("speed_small_curriculum", "speed_small's settings for the curriculum's 8-head "
              "presets beside fairseq and the 4-head parity presets (trained later)",
              f"--baseline {SOFT_PRE_DROP01_H8.name} {_SMALL_TEST} --train-batches 6 --sublayer-times",
              (SOFT_PRE_DROP01_H8.name, "fairseq_h8", HARD_PRE_ARGMAX_DROP01_H8_ANNEAL.name,
               SOFT_PRE_DROP01.name, HARD_PRE_ARGMAX_DROP01.name), True),
    # hard retrieval in decoder self-attention only: what it keeps of the recipe's speed
    Benchmark("speed_small_self_only", "speed_small's settings: hard retrieval in decoder "
              "self-attention only beside the parity recipe and soft_pre",
              f"--baseline soft_pre {_SMALL_TEST} --train-batches 6 --sublayer-times",
              ("soft_pre", "hard_pre_argmax", "hard_pre_self"), True),
    # trained gates and centres on 100-token sources: where skipping can pay
    Benchmark("speed_small_long_sources", "small preset, the trained checkpoints, 100-token sources",
              "--baseline soft --src-len 100 --num-sentences 128 --batch-size 64 "
              "--fixed-output-len 20 --beam 4 --reps 5 --threads 1 --sublayer-times",
              ("soft", "fairseq", "local", "flexible", "flexible_ft", "flexible_band_ft",
               "flexible_gate32_band_ft", "hard"), True),
    # Transformer Base dims, random weights, the test sources, 20 generated tokens each
    Benchmark("speed_base", "decoding speed at Transformer Base dims (random weights)",
              f"{_BASE_PEERS} --arch hard=transformer_hard_dec "
              "--arch cross_self=transformer_cross_self --arch fairseq_cross_self=transformer "
              "--override fairseq_cross_self={'cross_self_attention':True,'no_cross_attention':True} "
              "--arch hard_cross_self=transformer_hard_cross_self --arch aan=transformer_aan "
              "--arch aan_no_ffn=transformer_aan --override aan_no_ffn={'aan_ffn_dim':0} "
              "--arch local=transformer_local --arch flexible=transformer_flexible "
              "--override flexible={'flexible_mean_source_length':14.4} "
              f"--baseline soft {_base_test()}", data=True),
    # the parity recipe's presets at Base dims (8 heads there, as the curriculum's),
    # measured later, with the same settings beside soft, fairseq and hard
    Benchmark("speed_base_parity", "speed_base's settings for the parity presets (pre-norm) beside "
              "soft, fairseq and hard (measured later)",
              f"{_BASE_PARITY_ARCHS} --baseline soft {_base_test()}", data=True),
    # its 3 repetitions left the pre-norm pair inside this VM's noise (min-max overlapping)
    Benchmark("speed_base_parity_7reps", "speed_base_parity with 7 repetitions instead of 3",
              f"{_BASE_PARITY_ARCHS} --baseline soft {_base_test(reps=7)}", data=True),
    # Base dims with long sources: where skipping source positions matters
    Benchmark("speed_base_long_sources",
              "Base dims, 100-token sources: where skipping source positions pays",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':100.0}} "
              "--arch flexible_gate128=transformer_flexible "
              "--override flexible_gate128={'flexible_mean_source_length':100.0,'flexible_gate_dim':128} "
              "--arch hard=transformer_hard_dec --vocab 10000 --src-len 100 --num-sentences 64 "
              "--batch-size 32 --fixed-output-len 20 --baseline soft --beam 4 --reps 5 --threads 1 "
              "--sublayer-times"),
    # the per-step cost of soft cross-attention grows with the source, the bands' does not
    Benchmark("speed_base_200_token_sources", "Base dims, 200-token sources, 40 output tokens",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':200.0}} "
              "--arch hard=transformer_hard_dec --vocab 10000 --src-len 200 --num-sentences 32 "
              "--batch-size 32 --fixed-output-len 40 --baseline soft --beam 4 --reps 3 --threads 1 "
              "--sublayer-times"),
    # outputs as long as translations of such sources: the per-step cost outweighs caching
    Benchmark("speed_base_200_token_sources_160_outputs",
              "Base dims, 200-token sources, 160 output tokens",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':200.0}} "
              "--vocab 10000 --src-len 200 --num-sentences 32 --batch-size 32 "
              "--fixed-output-len 160 --baseline soft --beam 4 --reps 3 --threads 1 --sublayer-times"),
    Benchmark("speed_base_400_token_sources", "Base dims, 400-token sources, 100 output tokens",
              f"{_BASE_WINDOWED} --override flexible={{'flexible_mean_source_length':400.0}} "
              "--vocab 10000 --src-len 400 --num-sentences 16 --batch-size 16 "
              "--fixed-output-len 100 --baseline soft --beam 4 --reps 3 --threads 1 --sublayer-times"),
    # self-attention's cost grows with the target prefix, the average attention network's not
    Benchmark("speed_base_long_outputs",
              "Base dims, 60 output tokens: where a constant-cost decoder step pays",
              f"{_BASE_PEERS} --arch aan=transformer_aan "
              "--arch aan_no_ffn=transformer_aan "
              "--override aan_no_ffn={'aan_ffn_dim':0} --arch cross_self=transformer_cross_self "
              "--arch hard=transformer_hard_dec --baseline soft --beam 4 --batch-size 64 "
              "--max-sentences 64 --fixed-output-len 60 --reps 3 --threads 1 --sublayer-times",
              data=True),
)


# the decoding engine: fairseq's transformer with fairseq's generator
# (the baseline), the same weights through the plugin's search (soft, hard and
# top-k attention, fp32 and int8 Linear layers) and through CTranslate2 (fp32,
# int8): random weights, sources of SRC tokens decoded to exactly SRC tokens,
# beam 4, one thread, interleaved repetitions in one process
def engine_benchmark(name: str, what: str, dims: str, src_len: int, sentences: int, batch: int,
                     reps: int, extra: str = "", baseline: str = "fairseq", threads="1") -> Benchmark:
    int8 = "'int8_decoding':True"
    models = ("--arch fairseq=transformer --arch soft=transformer_soft --arch hard=transformer_hard_dec "
              f"--arch soft_int8=transformer_soft --override soft_int8={{{int8}}} "
              f"--arch hard_int8=transformer_hard_dec --override hard_int8={{{int8}}} "
              "--ctranslate2 ct2_fp32=fairseq:float32 --ctranslate2 ct2_int8=fairseq:int8")
    return Benchmark(name, what, f"{models} {extra} --dims {dims} --vocab 10000 --src-len {src_len} "
                     f"--num-sentences {sentences} --batch-size {batch} --fixed-output-len {src_len} "
                     f"--beam 4 --reps {reps} --threads {threads} --baseline {baseline}")


ENGINE_BENCHMARKS = (
    engine_benchmark("speed_engine_small", "the decoding engine at the small preset's dims, 30 tokens, "
                     "beside fairseq and CTranslate2", "small", 30, 256, 64, 5),
    engine_benchmark("speed_engine_base", "the decoding engine at Transformer Base dims, 30 tokens, "
                     "beside fairseq and CTranslate2", "preset", 30, 64, 32, 3),
    engine_benchmark("speed_engine_small_100tok", "the decoding engine at the small preset's dims, "
                     "100 tokens", "small", 100, 128, 64, 3),
    engine_benchmark("speed_engine_base_100tok", "the decoding engine at Transformer Base dims, 100 tokens",
                     "preset", 100, 32, 32, 3),
)
# where a step's time goes on the engine, against soft: the attention sublayers'
# shares, their projections' (what hard retrieval and top-k keep), and the top-k
# preset's k beside hard retrieval (30 tokens at the small dims, 100 at Base)
_SHARES = (f"--arch top{PRESET_K}=transformer_topk_dec --override top{PRESET_K}={{'retrieval_k':{PRESET_K}}} "
           "--sublayer-times")
ENGINE_BENCHMARKS += (
    engine_benchmark("speed_engine_shares_small", "the decoding engine's time per sublayer against soft, "
                     "small dims, 30 tokens", "small", 30, 256, 64, 5, _SHARES, "soft"),
    engine_benchmark("speed_engine_shares_base_100tok", "the decoding engine's time per sublayer against "
                     "soft, Base dims, 100 tokens", "preset", 100, 32, 32, 3, _SHARES, "soft"),
)

# the same on every core this machine gives a process: the plugin's
# models as fairseq-generate runs them by default (--decoding-workers auto),
# fairseq's generator on all the threads, CTranslate2 in both of its
# configurations (intra-op threads; a batch per thread), each system in a
# process of its own; at least four batches per run
ENGINE_BENCHMARKS += tuple(
    engine_benchmark(f"speed_engine_cores_{name}", f"the decoding engine on all the cores, {what}, beside "
                     "fairseq and CTranslate2's two configurations", dims, src_len, sentences, batch, 3,
                     threads="all")
    for name, what, dims, src_len, sentences, batch in (
        ("small", "small dims, 30 tokens", "small", 30, 512, 64),
        ("base", "Base dims, 30 tokens", "preset", 30, 128, 32),
        ("small_100tok", "small dims, 100 tokens", "small", 100, 256, 64),
        ("base_100tok", "Base dims, 100 tokens", "preset", 100, 64, 16)))

# fairseq-generate's decoding on trained checkpoints (test2016, natural lengths,
# beam 4, batch 64, one thread): each architecture with the plugin's search and,
# the same checkpoint, with fairseq's generator (the decodes below: their BLEU is
# the engine's, the same hypotheses). Runs missing from a work dir are left out;
# the first present run's generator is the ratios' baseline (a short-budget work
# dir serves: the ratio is the generator's, not the model's)
GENERATE_TRAINED_RUNS = ("soft", "hard", "soft_pre", "hard_pre_argmax", *TOPK_SEED1_RUNS, "cross_self",
                         "hard_cross_self", "aan", "aan_no_ffn", "flexible", "local")
DECODES = tuple(Decode(f"{run}_fairseq_generator", run, {"decoding_engine": "fairseq"},
                       f"the `{run}` checkpoint decoded by fairseq's generator (the engine's peer)")
                for run in GENERATE_TRAINED_RUNS)
# int8 Linear layers on the trained parity pair and each trained k's top-k run
# (within 0.2 BLEU of fp32)
INT8_RUNS = ("soft_pre", "hard_pre_argmax", *TOPK_SEED1_RUNS)
DECODES += tuple(Decode(f"{run}_int8", run, {"int8_decoding": True},
                        f"the `{run}` checkpoint decoded with int8 Linear layers (CPU)")
                 for run in INT8_RUNS)
GENERATE_TRAINED = Benchmark(
    "speed_generate_trained", "fairseq-generate's decoding of test2016 with the trained checkpoints: the "
    "plugin's search against fairseq's generator on the same checkpoint, per architecture",
    "--beam 4 --batch-size 64 --reps 3 --threads 1",
    tuple(name for run in GENERATE_TRAINED_RUNS for name in (f"{run}_fairseq_generator", run)), data=True)

# the main table's speed columns: each row from the first of these that measured it
TABLE_SPEED_BENCHMARKS = ("speed_small", "speed_small_parity", "speed_small_curriculum")
# and its Base-dims column
TABLE_BASE_SPEED_BENCHMARKS = ("speed_base", "speed_base_parity")


def _gpu_models(src_len):
    """fairseq's own transformer and ours at Base dims; ours with the
    engine's captured step, soft and hard also as fairseq decodes them."""
    graph = "'decoding_engine':'graph'"
    ours = {"soft": ("transformer_soft", ""), "hard": ("transformer_hard_dec", ""),
            "cross_self": ("transformer_cross_self", ""),
            "hard_cross_self": ("transformer_hard_cross_self", ""),
            "aan": ("transformer_aan", ""), "aan_no_ffn": ("transformer_aan", ",'aan_ffn_dim':0"),
            "local": ("transformer_local", ""),
            "flexible": ("transformer_flexible", f",'flexible_mean_source_length':{src_len}.0")}
    args = ["--arch fairseq=transformer", "--arch fairseq_cross_self=transformer",
            "--override fairseq_cross_self={'cross_self_attention':True,'no_cross_attention':True}"]
    for name, (arch, extra) in ours.items():
        args += [f"--arch {name}={arch}", f"--override {name}={{{graph}{extra}}}"]
    for name in ("soft", "hard"):  # the same models, decoded step by step as fairseq does
        args += [f"--arch {name}_dynamic={ours[name][0]}",
                 f"--override {name}_dynamic={{'decoding_engine':'dynamic'}}"]
    return " ".join(args)


# the GPU matrix (scripts/gpu_results.sh): Base dims, random weights, beam 4,
# every sentence decoded to exactly its source length, ratios to fairseq's transformer
GPU_BENCHMARKS = tuple(
    Benchmark(f"speed_gpu_{src_len}tok_batch{batch}_{dtype}",
              f"GPU, Base dims, {src_len}-token sources and outputs, batch {batch}, {dtype}",
              f"{_gpu_models(src_len)} --device cuda --dtype {dtype} --vocab 10000 "
              f"--src-len {src_len} --num-sentences {2 * batch} --batch-size {batch} "
              f"--fixed-output-len {src_len} --beam 4 --reps 5 --baseline fairseq")
    for src_len in (30, 100, 200) for batch in (64, 128, 256) for dtype in ("fp32", "fp16"))
# the main table's GPU column: one cell of that matrix (ratios to fairseq's transformer)
TABLE_GPU_BENCHMARK = "speed_gpu_100tok_batch128_fp16"

# what each other output of scripts/results.sh shows (results/README.md's file list)
OUTPUTS = {
    **{b.name: b.what for b in BENCHMARKS + ENGINE_BENCHMARKS + GPU_BENCHMARKS},
    "hard_parity": "hard retrieval attention against soft attention trained the same way: "
                   "the ablation toward parity",
    "short_budget": "every architecture at the short budget (5 epochs): the earlier headline table",
    "op_counts": "operations and host syncs of one beam search per architecture, beside "
                 "fairseq's transformer (what a GPU pays per step)",
    "attention_step_costs": "one decoding step of cross-attention alone, per mechanism, Base dims "
                            "(flexible_small_gate: a d/4 gate network)",
    "attention_step_costs_small": "the same at the small preset's dims (d = 128, 4 heads)",
    "op_costs_cpu": "per-operation costs of one decoding step (the hard-attention paper's Table 2)",
    "linear_engines": "the Linear layer on each CPU kernel (float32 on MKL and packed for oneDNN, int8 per "
                      "quantized engine) at a decoding step's shapes (research/linear_engines.py: which "
                      "layers the search packs for oneDNN)",
    "memory": "peak memory of training and decoding",
    "speed_vs_length": "decoding speed against source length",
    "bleu_vs_cps": "flexible attention: BLEU against score computations per step over τ",
    "bleu_vs_cps_gate32": "the same for flexible_gate32_band_ft (a d/4 gate network) at τ = 0.75 to 1.25",
    "attention_soft": "cross-attention heatmaps, soft baseline",
    "attention_hard": "chosen source positions of hard retrieval attention",
    "attention_flexible_ft": "cross-attention of flexible attention after fine-tuning",
    "flexible_gate": "flexible attention's gate g_t over the decoding steps of one sentence",
}
