"""The model options that choose how a checkpoint decodes: they may differ
from the ones it was trained with (``--model-overrides`` keys at decoding
time, keywords of the hub's ``from_pretrained``). The decoding package
(``fairseq_hardattn.decoding``) reads them; this module only declares and
checks them.
"""

from ..errors import ConfigError

# --decoding-engine: which search decodes, and how its steps run
# (fairseq_hardattn/decoding/engines.py says what each does)
ENGINES = ("auto", "search", "fairseq", "static", "graph")
# engine names checkpoints may carry from earlier versions -> today's
FORMER_ENGINE_NAMES = {"dynamic": "fairseq"}

# --decoding-workers: "auto" (one worker per thread the process may use) or a count
AUTO = "auto"

# the options a checkpoint may be decoded with other than it was trained
# (fairseq-generate --help lists them)
DECODING_OPTIONS = ("decoding_engine", "int8_decoding", "bf16_decoding", "shortlist", "shortlist_k",
                    "decoding_workers", "dec_self_attn_kind", "dec_cross_attn_kind", "retrieval_k")


def check_engine(value) -> str:
    """``--decoding-engine``, a former name mapped to today's."""
    value = FORMER_ENGINE_NAMES.get(value, value)
    if value not in ENGINES:
        raise ConfigError(f"--decoding-engine must be one of {', '.join(ENGINES)}, got {value!r}")
    return value


def check_workers(value):
    """``--decoding-workers``: ``auto`` or a number >= 1 (a string from the
    command line, an int from overrides); returns it normalised."""
    if value is None or value == AUTO:
        return AUTO
    try:
        workers = int(value)
    except (TypeError, ValueError):
        workers = 0
    if workers < 1 or str(value).strip() != str(workers):
        raise ConfigError(f"--decoding-workers must be 'auto' or a number >= 1, got {value!r}")
    return workers
