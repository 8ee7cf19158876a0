"""Compiled CPU kernels: plain C, built on first use with the system's C
compiler and loaded with ctypes (no torch headers to compile, so a build
takes well under a second; no build step at install time): flexible
attention's band (``flexible_band.c``), the plugin's search's candidates
(``beam_candidates.c``), attention steps over keys read in place: the
encoder's, and lineage caches (``step_attention.c``), a decoder layer's
sublayers as one call each (``decoder_sublayers.c``: its products through
the BLAS functions of PyTorch's own library, found by ``torch_blas``), and
sampling's draws, a generator per sentence (``sentence_draws.c``), and
PyTorch's LayerNorm operation for operation (``layer_norm.c``), with which
a decoder step's layers are one call (``decoder_sublayers.c``'s
``decoder_step``).

A build is cached under ``$FAIRSEQ_HARDATTN_KERNEL_DIR`` (default
``~/.cache/fairseq_hardattn/kernels``), keyed by the source, the compiler,
its flags and the CPU (``-march=native``). Kernels split their rows over
torch's intra-op threads with OpenMP (``parallel_rows.h``: torch's own
runtime, one thread pool for the process); where the compiler has no
OpenMP they are built without it and run on one thread. Where no kernel can be built (no
compiler, a failed build) the callers fall back to their PyTorch ops, with
one warning; ``FAIRSEQ_HARDATTN_KERNELS=0`` turns the kernels off.
``FAIRSEQ_HARDATTN_KERNEL_CFLAGS`` adds compiler flags (part of the cache
key): ``scripts/sanitize_kernels.sh`` builds them with AddressSanitizer and
UndefinedBehaviorSanitizer so.
"""

import ctypes
import hashlib
import logging
import operator
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
# reassociated float sums (vectorised reductions) but IEEE infinities and NaN
# kept, and no -ffast-math: gcc < 13 would link crtfastmath.o into the
# library, flushing denormals to zero in the whole process
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math",
         "-fassociative-math", "-fno-signed-zeros", "-std=c99", "-shared", "-fPIC")
# OpenMP's threads where the compiler has it, else its simd pragmas only
THREADING = (("-fopenmp",), ("-fopenmp-simd",))
# kernels that repeat PyTorch's float sums operation for operation: no reassociation, no contraction
IN_ORDER = {"layer_norm": ("-fno-associative-math", "-ffp-contract=off")}
_loaded: Dict[str, Optional[ctypes.CDLL]] = {}


def enabled() -> bool:
    return os.environ.get("FAIRSEQ_HARDATTN_KERNELS", "1") != "0"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "fairseq_hardattn" / "kernels"
    return Path(os.environ.get("FAIRSEQ_HARDATTN_KERNEL_DIR") or default)


def compiler() -> Optional[str]:
    """$CC where set (only it), else the first of cc, gcc, clang found."""
    if os.environ.get("CC"):
        return os.environ["CC"] if shutil.which(os.environ["CC"]) else None
    return next((cc for cc in ("cc", "gcc", "clang") if shutil.which(cc)), None)


def _cpu_signature() -> bytes:
    """What -march=native depends on: the CPU's flags (Linux), else its name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    import platform
    return (platform.machine() + platform.processor()).encode()


def build(name: str, cached: bool = True) -> Path:
    """Compile ``<name>.c`` (cached; ``cached=False``: into a directory of this
    process's own) and return the shared library's path; raises RuntimeError
    naming the problem."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (CC={!r}; install gcc or set CC)".format(os.environ.get("CC", "")))
    extra = IN_ORDER.get(name, ()) + tuple(os.environ.get("FAIRSEQ_HARDATTN_KERNEL_CFLAGS", "").split())
    for threading in THREADING[:-1]:
        try:
            return _build(name, cc, FLAGS + threading + extra, cached)
        except RuntimeError:
            pass
    return _build(name, cc, FLAGS + THREADING[-1] + extra, cached)


def _build(name: str, cc: str, flags, cached: bool) -> Path:
    source = SOURCE_DIR / f"{name}.c"
    headers = [path.read_bytes() for path in sorted(SOURCE_DIR.glob("*.h"))]  # what sources include
    key = hashlib.sha256(b"\0".join(
        [source.read_bytes(), *headers, cc.encode(), " ".join(flags).encode(), _cpu_signature()]
    )).hexdigest()[:16]
    target = (cache_dir() if cached else _private_dir()) / f"{name}-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return _compile(cc, flags, source, target)
    except OSError as error:  # a cache directory this process cannot write
        if not cached:
            raise
        logger.warning("fairseq-hardattn: cannot write the kernel cache %s (%s); building the C "
                       "kernels in a directory of this process's own", target.parent, error)
        return _build(name, cc, flags, cached=False)


def _compile(cc: str, flags, source: Path, target: Path) -> Path:
    # build beside the target, then rename: concurrent processes (test
    # workers, distributed ranks) never load a half-written library
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        result = subprocess.run([cc, *flags, "-o", str(partial), str(source), "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{cc} failed on {source.name}: {result.stderr.strip()[-2000:]}")
        os.replace(partial, target)
    return target


def _private_dir() -> Path:
    """A kernel directory of this process's own (removed at its exit)."""
    if not hasattr(_private_dir, "path"):
        import atexit

        _private_dir.path = Path(tempfile.mkdtemp(prefix="fairseq_hardattn_kernels-"))
        atexit.register(shutil.rmtree, _private_dir.path, ignore_errors=True)
    return _private_dir.path


def load(name: str) -> Optional[ctypes.CDLL]:
    """The kernel library ``name``, or None (kernels off, or the build failed:
    warned once per process). A cached library that does not load (truncated,
    damaged) is built again, in this process's own directory."""
    if not enabled():
        return None
    if name not in _loaded:
        try:
            try:
                _loaded[name] = ctypes.CDLL(str(build(name)))
            except OSError as error:
                logger.warning("fairseq-hardattn: the cached C kernel %s does not load (%s); "
                               "building it again", name, error)
                _loaded[name] = ctypes.CDLL(str(build(name, cached=False)))
        except (RuntimeError, OSError) as error:
            logger.warning("fairseq-hardattn: the C kernel %s is unavailable (%s); "
                           "using PyTorch ops instead (slower decoding)", name, error)
            _loaded[name] = None
    return _loaded[name]


_i64, _f32, _int, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
# C parameter types -> ctypes (any pointer: an address)
_C_TYPES = {"int64_t": _i64, "float": _f32, "int": _int}


class Kernel:
    """A C function of a kernel library, called by its parameters' names
    (``kernel(q=..., rows=...)``): ``parameters`` are (name, ctypes type) in
    the C order. At load its prototype is read from the C source and must
    agree, name for name and type for type (``check_signature``), so that
    Python and C never disagree on an argument's place or type."""

    def __init__(self, library: str, name: str, parameters, returns):
        self.library, self.name, self.returns = library, name, returns
        self.parameters = tuple(parameters)
        names = [name for name, _ in self.parameters]
        self._names = set(names)
        # the arguments in the C order, as a tuple (itemgetter of one name returns the value)
        self._in_order = operator.itemgetter(*names) if len(names) > 1 else lambda a: (a[names[0]],)
        self._bound = self._function = None  # the library it was bound in, and its function

    def function(self):
        """The loaded, checked C function, or None (no library)."""
        library = load(self.library)
        if library is None:
            return None
        if self._bound is not library:
            check_signature(self, SOURCE_DIR / f"{self.library}.c")
            function = getattr(library, self.name)
            function.argtypes = [kind for _, kind in self.parameters]
            function.restype = self.returns
            self._bound, self._function = library, function
        return self._function

    def __call__(self, **arguments):
        if arguments.keys() != self._names:
            missing, extra = sorted(self._names - arguments.keys()), sorted(arguments.keys() - self._names)
            raise TypeError(f"{self.name}: missing {missing}, unknown {extra}")
        # (its callers checked that it is available: bound once, it is called as bound)
        bound = self._function if self._bound is not None and _loaded.get(self.library) is self._bound else None
        return (bound or self.function())(*self._in_order(arguments))


def c_prototype(source: str, name: str):
    """(name, ctypes type) of each parameter of the C function ``name`` as
    ``source`` defines it (object-like macros expanded)."""
    macros = {m.group(1): m.group(2).replace("\\\n", " ")
              for m in re.finditer(r"^#define (\w+)[ \t]+((?:.*\\\n)*.*)$", source, flags=re.M)}
    match = re.search(rf"^\w+\s+{name}\s*\(([^)]*)\)\s*{{", source, flags=re.M)
    if match is None:
        raise RuntimeError(f"no definition of {name} in the kernel source")
    text = match.group(1)
    for _ in range(4):  # macros within macros
        text = re.sub(r"\b(\w+)\b", lambda m: macros.get(m.group(1), m.group(1)), text)
    found = []
    for parameter in text.split(","):
        words = parameter.replace("*", " * ").split()
        pointer = "*" in words
        words = [w for w in words if w not in ("*", "const")]
        found.append((words[-1], _ptr if pointer else _C_TYPES[words[-2]]))
    return found


def c_enum(source: str, name: str) -> Dict[str, int]:
    """The constants of the C enum ``name`` in ``source`` and their values
    (each the one before plus one, from 0)."""
    match = re.search(rf"enum {name}\s*{{([^}}]*)}}", source)
    if match is None:
        raise RuntimeError(f"no enum {name} in the kernel source")
    return {constant.strip(): value for value, constant in enumerate(match.group(1).split(",")) if constant.strip()}


def check_signature(kernel: Kernel, source_path: Path):
    """Raise RuntimeError where ``kernel`` disagrees with its C prototype."""
    declared = c_prototype(source_path.read_text(), kernel.name)
    if list(kernel.parameters) != declared:
        raise RuntimeError(f"the Python binding of {kernel.name} disagrees with {source_path.name}: "
                           f"{[(n, t.__name__) for n, t in kernel.parameters]} against "
                           f"{[(n, t.__name__) for n, t in declared]}")


FLEXIBLE_BAND = Kernel("flexible_band", "flexible_band_step", [
    ("q", _ptr), ("rows", _i64), ("head_dim", _i64), ("scaling", _f32), ("k", _ptr), ("v", _ptr),
    ("src_len", _i64), ("padding", _ptr), ("beam", _i64), ("heads", _i64), ("centre", _ptr),
    ("gate", _ptr), ("sigma", _f32), ("two_tau", _f32), ("penalty_coef", _f32), ("out", _ptr),
    ("new_centre", _ptr), ("scored", _ptr)], _int)
BEAM_CANDIDATES = Kernel("beam_candidates", "beam_candidates", [
    ("logits", _ptr), ("rows", _i64), ("vocab", _i64), ("stride", _i64), ("cols", _ptr), ("adds", _ptr),
    ("nspecial", _i64), ("k", _i64), ("top_vals", _ptr), ("top_idx", _ptr), ("lse", _ptr)], None)
ENSEMBLE_LOG_PROBS = Kernel("beam_candidates", "ensemble_log_probs", [
    ("logits", _ptr), ("strides", _ptr), ("models", _i64), ("rows", _i64), ("vocab", _i64),
    ("out", _ptr)], _int)
READ_BACK = Kernel("beam_candidates", "read_back", [
    ("step_tokens", _ptr), ("step_scores", _ptr), ("step_parents", _ptr), ("stride", _i64), ("rows", _ptr),
    ("n", _i64), ("step", _i64), ("tokens", _ptr), ("scores", _ptr)], None)
STEP_ATTENTION = Kernel("step_attention", "step_attention", [
    ("q", _ptr), ("rows", _i64), ("heads", _i64), ("dim", _i64), ("src_keys", _ptr), ("src_keys_t", _ptr),
    ("src_values", _ptr), ("sentence_stride", _i64), ("head_stride", _i64), ("src_position_stride", _i64),
    ("src_padding", _ptr), ("src_len", _i64), ("group", _i64), ("src_sentences", _ptr), ("keys", _ptr),
    ("values", _ptr),
    ("ancestors", _ptr), ("anc_stride", _i64), ("rows0", _i64), ("length", _i64), ("scale", _f32),
    ("mode", _int), ("k", _i64), ("centres", _ptr), ("window", _f32), ("gaussian", _f32),
    ("out", _ptr)], _int)
STEP_ATTENTION_THREADS = Kernel("step_attention", "step_attention_threads", [
    ("rows", _i64), ("heads", _i64), ("dim", _i64), ("positions", _i64)], _int)
_SUBLAYER_INPUTS = [("x", _ptr), ("residual", _ptr), ("out", _ptr), ("rows", _i64), ("embed", _i64)]
_BLAS = [("gemm", _ptr), ("gemv", _ptr)]
SELF_ATTENTION_SUBLAYER = Kernel("decoder_sublayers", "self_attention_sublayer", _SUBLAYER_INPUTS + [
    ("q_weight", _ptr), ("q_bias", _ptr), ("k_weight", _ptr), ("k_bias", _ptr), ("v_weight", _ptr),
    ("v_bias", _ptr), ("out_weight", _ptr), ("out_bias", _ptr), ("heads", _i64), ("head_dim", _i64),
    ("scale", _f32), ("mode", _int), ("k", _i64), ("keys", _ptr), ("values", _ptr), ("ancestors", _ptr),
    ("anc_stride", _i64), ("rows0", _i64), ("length", _i64)] + _BLAS + [("attention", _ptr)], _int)
CROSS_ATTENTION_SUBLAYER = Kernel("decoder_sublayers", "cross_attention_sublayer", _SUBLAYER_INPUTS + [
    ("q_weight", _ptr), ("q_bias", _ptr), ("out_weight", _ptr), ("out_bias", _ptr), ("heads", _i64),
    ("head_dim", _i64), ("scale", _f32), ("mode", _int), ("k", _i64), ("src_keys", _ptr), ("src_keys_t", _ptr),
    ("src_values", _ptr), ("sentence_stride", _i64), ("head_stride", _i64), ("src_position_stride", _i64),
    ("src_padding", _ptr), ("src_len", _i64), ("group", _i64), ("src_sentences", _ptr)] + _BLAS
    + [("attention", _ptr)], _int)
FEED_FORWARD_SUBLAYER = Kernel("decoder_sublayers", "feed_forward_sublayer", _SUBLAYER_INPUTS + [
    ("hidden", _i64), ("fc1_weight", _ptr), ("fc1_bias", _ptr), ("fc2_weight", _ptr), ("fc2_bias", _ptr)]
    + _BLAS, _int)
LINEAR_PRODUCT = Kernel("decoder_sublayers", "linear_product", [
    ("x", _ptr), ("rows", _i64), ("in_features", _i64), ("weight", _ptr), ("bias", _ptr), ("out_features", _i64),
    ("y", _ptr)]
    + _BLAS, None)
DECODER_STEP = Kernel("decoder_sublayers", "decoder_step", [
    ("features", _ptr), ("out", _ptr), ("rows", _i64), ("embed", _i64), ("n_layers", _i64), ("layers", _ptr),
    ("layer_scalars", _ptr), ("pre_norm", _int), ("ancestors", _ptr), ("anc_stride", _i64), ("rows0", _i64),
    ("length", _i64), ("last_norm_weight", _ptr), ("last_norm_bias", _ptr), ("last_norm_eps", _f32),
    ("norm_lanes", _int), ("norm_fused", _int)] + _BLAS + [("attention", _ptr), ("layer_norm", _ptr)], _int)
LAYER_NORM = Kernel("layer_norm", "layer_norm", [
    ("x", _ptr), ("rows", _i64), ("n", _i64), ("gamma", _ptr), ("beta", _ptr), ("eps", _f32), ("lanes", _int),
    ("fused", _int), ("y", _ptr)], _int)
SEED_GENERATORS = Kernel("sentence_draws", "seed_generators", [("seeds", _ptr), ("n", _i64), ("states", _ptr)],
                         None)
EXPONENTIAL_DRAWS = Kernel("sentence_draws", "exponential_draws", [
    ("states", _ptr), ("n", _i64), ("per", _i64), ("single", _int), ("out", _ptr)], None)
KERNELS = (FLEXIBLE_BAND, BEAM_CANDIDATES, ENSEMBLE_LOG_PROBS, READ_BACK, STEP_ATTENTION, STEP_ATTENTION_THREADS,
           SELF_ATTENTION_SUBLAYER, CROSS_ATTENTION_SUBLAYER, FEED_FORWARD_SUBLAYER, LINEAR_PRODUCT,
           DECODER_STEP, LAYER_NORM, SEED_GENERATORS, EXPONENTIAL_DRAWS)


def flexible_band_function():
    """The C function ``flexible_band_step``, or None."""
    return FLEXIBLE_BAND.function()


def can_run_flexible_band(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether ``flexible_band_step`` applies: CPU float32 tensors, the
    batch-major caches contiguous, no gradient needed."""
    return (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32
            and k.is_contiguous() and v.is_contiguous() and not torch.is_grad_enabled()
            and flexible_band_function() is not None)


def flexible_band_step(q: Tensor, k: Tensor, v: Tensor, padding: Optional[Tensor],
                       centre: Tensor, gate: Tensor, beam: int, heads: int, scaling: float,
                       sigma: float, threshold: float) -> Tuple[Tensor, Tensor, Tensor]:
    """One banded step (see flexible_band.c): q (rows, head_dim) unscaled;
    k, v (kv_bsz*heads, src_len, head_dim) contiguous; padding (kv_bsz,
    src_len) bool or None; centre and gate (rows,). Returns the output
    (rows, head_dim), the new centres (rows,) and the band sizes (rows,)."""
    rows, head_dim = q.shape
    src_len = k.size(1)
    q = q.contiguous()
    centre = centre.float().contiguous()
    gate = gate.float().contiguous()
    if padding is not None:
        padding = padding.contiguous()
    out = q.new_empty(rows, head_dim)
    new_centre = centre.new_empty(rows)
    scored = torch.empty(rows, dtype=torch.int64)
    status = FLEXIBLE_BAND(
        q=q.data_ptr(), rows=rows, head_dim=head_dim, scaling=scaling, k=k.data_ptr(), v=v.data_ptr(),
        src_len=src_len, padding=_address(padding), beam=beam, heads=heads, centre=centre.data_ptr(),
        gate=gate.data_ptr(), sigma=sigma, two_tau=2.0 * threshold, penalty_coef=-0.5 / sigma ** 2,
        out=out.data_ptr(), new_centre=new_centre.data_ptr(), scored=scored.data_ptr())
    if status != 0:
        raise MemoryError("flexible_band_step: could not allocate its scratch memory")
    return out, new_centre, scored


def beam_candidates_function():
    """The C function ``beam_candidates``, or None."""
    return BEAM_CANDIDATES.function()


def can_run_beam_candidates(logits: Tensor) -> bool:
    """Whether ``beam_candidates`` applies: CPU float32 logits whose rows are
    contiguous, no gradient needed."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.stride(1) == 1 and not torch.is_grad_enabled()
            and beam_candidates_function() is not None)


def beam_candidates(logits: Tensor, special_columns: Tensor, special_adds: Tensor, k: int,
                    out: Optional[Tuple[Tensor, Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(see beam_candidates.c) logits (rows, vocab) float32; special_columns
    (S,) int64 and special_adds (S,) float32 (NaN: never chosen). Returns the
    best ``k`` adjusted values and their tokens (rows, k), descending, and
    each row's log-normaliser of the raw logits (rows, 1); into ``out``
    (three such tensors, contiguous) where given."""
    rows, vocab = logits.shape
    if out is None:
        out = logits.new_empty(rows, k), torch.empty(rows, k, dtype=torch.int64), logits.new_empty(rows, 1)
    top_vals, top_idx, lse = out
    BEAM_CANDIDATES(
        logits=logits.data_ptr(), rows=rows, vocab=vocab, stride=logits.stride(0),
        cols=special_columns.data_ptr(), adds=special_adds.data_ptr(), nspecial=special_columns.numel(),
        k=k, top_vals=top_vals.data_ptr(), top_idx=top_idx.data_ptr(), lse=lse.data_ptr())
    return top_vals, top_idx, lse


GENERATOR_STATE_WORDS = 626  # sentence_draws.c's STATE_WORDS


def sentence_generators(seeds) -> Optional[Tensor]:
    """(see sentence_draws.c) a generator's state per seed, (len(seeds),
    GENERATOR_STATE_WORDS) int32, seeded as ``torch.Generator().manual_seed``
    seeds one; None without the kernel."""
    if SEED_GENERATORS.function() is None:
        return None
    low_bits = torch.tensor([int(seed) & 0xFFFFFFFF for seed in seeds], dtype=torch.int64)
    states = torch.empty(len(low_bits), GENERATOR_STATE_WORDS, dtype=torch.int32)
    SEED_GENERATORS(seeds=low_bits.data_ptr(), n=len(low_bits), states=states.data_ptr())
    return states


def exponential_draws(states: Tensor, out: Tensor):
    """Row i of ``out`` (n rows; float32 or float64, contiguous) filled as
    ``out[i].exponential_(generator=i's)`` fills it, from the states of
    ``sentence_generators`` (n, contiguous), which move on."""
    if out.dtype not in (torch.float32, torch.float64) or not out.is_contiguous() or not states.is_contiguous():
        raise ValueError("exponential_draws: contiguous float32 or float64 draws, contiguous states")
    n = states.size(0)
    EXPONENTIAL_DRAWS(states=states.data_ptr(), n=n, per=out.numel() // max(n, 1),
                      single=int(out.dtype == torch.float32), out=out.data_ptr())


def read_back(step_tokens: Tensor, step_scores: Tensor, step_parents: Tensor, rows: Tensor, step: int,
              tokens: Tensor, scores: Tensor) -> bool:
    """(see beam_candidates.c) positions 0..step-1 of ``tokens`` (n, step + 1)
    int64 and of ``scores`` (n, step + 1) float32, the latter's position
    ``step`` already the final score, for the hypotheses continuing ``rows``
    (n,) int64; False where the kernel does not apply (not CPU, float32 and
    contiguous, or no kernel) and nothing was written."""
    buffers = (step_tokens, step_scores, step_parents, rows, tokens, scores)
    if (any(b.device.type != "cpu" or not b.is_contiguous() for b in buffers)
            or step_scores.dtype != torch.float32 or scores.dtype != torch.float32
            or READ_BACK.function() is None):
        return False
    READ_BACK(step_tokens=step_tokens.data_ptr(), step_scores=step_scores.data_ptr(),
              step_parents=step_parents.data_ptr(), stride=step_tokens.stride(0), rows=rows.data_ptr(),
              n=rows.numel(), step=step, tokens=tokens.data_ptr(), scores=scores.data_ptr())
    return True


def ensemble_log_probs_function():
    """The C function ``ensemble_log_probs`` (in beam_candidates.c), or None."""
    return ENSEMBLE_LOG_PROBS.function()


def can_run_ensemble_log_probs(logits) -> bool:
    """Whether ``ensemble_log_probs`` applies to these models' logits."""
    return all(can_run_beam_candidates(x) for x in logits) and len({x.shape for x in logits}) == 1 \
        and ensemble_log_probs_function() is not None


def ensemble_log_probs(logits) -> Tensor:
    """(see beam_candidates.c) fairseq's EnsembleModel's log-probabilities of
    the models' float32 logits, each (rows, vocab) with contiguous rows: the
    log of the mean of their probabilities, (rows, vocab)."""
    rows, vocab = logits[0].shape
    out = logits[0].new_empty(rows, vocab)
    addresses = torch.tensor([x.data_ptr() for x in logits], dtype=torch.int64)
    strides = torch.tensor([x.stride(0) for x in logits], dtype=torch.int64)
    ENSEMBLE_LOG_PROBS(logits=addresses.data_ptr(), strides=strides.data_ptr(), models=len(logits),
                       rows=rows, vocab=vocab, out=out.data_ptr())
    return out


def step_attention_function():
    """The C function ``step_attention``, or None."""
    return STEP_ATTENTION.function()


def step_attention(q: Tensor, scale: float, mode: int, k: int, out: Tensor,
                   source: Optional[Tuple[Tensor, Tensor, Tensor, Optional[Tensor], int,
                                          Optional[Tensor]]] = None,
                   lineage: Optional[Tuple[Tensor, Tensor, Tensor, int]] = None,
                   local: Optional[Tuple[Tensor, float, float]] = None):
    """(see step_attention.c) q, out (rows, heads, dim) contiguous float32.
    ``source``: (keys, keys_t, values, padding, group, sentences): keys and
    values (sentences, heads, src_len, dim), dim contiguous; keys_t the keys
    as ``transposed_keys`` lays them out; padding (sentences, src_len) bool
    or None; ``group`` hypotheses per sentence; ``sentences`` (rows / group,)
    int64 contiguous, the cached sentence each group reads, or None (group
    g reads sentence g). ``lineage``: (keys, values,
    ancestors, length): keys and values (capacity, rows0, heads, dim)
    contiguous, ancestors (>= rows, >= length) int64; positions
    0..length-1 are attended. One of the two at least. ``local`` (mode
    LOCAL, source only): (centres (rows, heads) float32 contiguous, window,
    gaussian)."""
    rows, heads, dim = q.shape
    keys = values = ancestors = None
    anc_stride = rows0 = length = 0
    if lineage is not None:
        keys, values, ancestors, length = lineage
        rows0, anc_stride = keys.size(1), ancestors.stride(0)
    centres, window, gaussian = (_address(local[0]), local[1], local[2]) if local else (None, 0.0, 1.0)
    source_arguments, _kept = _source_arguments(source)
    status = STEP_ATTENTION(
        q=q.data_ptr(), rows=rows, heads=heads, dim=dim, **source_arguments, keys=_address(keys),
        values=_address(values), ancestors=_address(ancestors), anc_stride=anc_stride, rows0=rows0,
        length=length, scale=scale, mode=mode, k=k, centres=centres, window=window, gaussian=gaussian,
        out=out.data_ptr())
    _raise_for_status("step_attention", status)


def _raise_for_status(name: str, status: int):
    """The error of an attention kernel's status (step_attention.c's, the sublayers')."""
    if status == 2:
        raise MemoryError(f"{name}: could not allocate its scratch memory")
    if status != 0:
        raise ValueError(f"{name}: k <= {STEP_MAX_K} and at least one position to attend")


def _source_arguments(source) -> Tuple[dict, tuple]:
    """``step_attention``'s arguments of its source part (its ``source``, or
    None), and the tensors they point into (the caller keeps them until the call returns)."""
    if source is None:
        return dict(src_keys=None, src_keys_t=None, src_values=None, sentence_stride=0, head_stride=0,
                    src_position_stride=0, src_padding=None, src_len=0, group=0, src_sentences=None), ()
    src_keys, keys_t, src_values, padding, group, sentences = source
    if sentences is not None and (sentences.dtype != torch.int64 or not sentences.is_contiguous()):
        raise ValueError("step_attention: the sentences' table is a contiguous int64 tensor")
    if src_keys.stride() != src_values.stride() or src_keys.stride(3) != 1:
        src_keys, src_values = src_keys.contiguous(), src_values.contiguous()
    if padding is not None:
        padding = padding.contiguous()
    strides = src_keys.stride()
    return dict(src_keys=src_keys.data_ptr(), src_keys_t=_address(keys_t), src_values=src_values.data_ptr(),
                sentence_stride=strides[0], head_stride=strides[1], src_position_stride=strides[2],
                src_padding=_address(padding), src_len=src_keys.size(2), group=group,
                src_sentences=_address(sentences)), (src_keys, src_values, padding)


def step_attention_threads(rows: int, heads: int, dim: int, positions: int) -> int:
    """The threads ``step_attention`` splits such a step over (torch's
    intra-op threads where the step is large enough; 1 without OpenMP)."""
    return STEP_ATTENTION_THREADS(rows=rows, heads=heads, dim=dim, positions=positions)


SOURCE_BLOCK = 16  # step_attention.c's BLOCK
STEP_MAX_K = 64  # step_attention.c's MAX_K: top-k keeps its k best in a fixed array


def transposed_keys(keys: Tensor) -> Tensor:
    """Keys (sentences, heads, src_len, dim) as ``step_attention``'s source
    part reads them for soft and top-k attention: (sentences, heads, dim,
    src_len rounded up to SOURCE_BLOCK), contiguous, zeros beyond src_len."""
    sentences, heads, src_len, dim = keys.shape
    padded = -(-src_len // SOURCE_BLOCK) * SOURCE_BLOCK
    out = keys.new_zeros(sentences, heads, dim, padded)
    out[..., :src_len] = keys.transpose(2, 3)
    return out


def _address(tensor: Optional[Tensor]) -> Optional[int]:
    return None if tensor is None else tensor.data_ptr()


_torch_blas: Dict[str, Optional[Tuple[int, int]]] = {}


def torch_blas() -> Optional[Tuple[int, int]]:
    """The addresses of ``sgemm_`` and ``sgemv_`` in PyTorch's CPU library
    (the BLAS its float32 Linear calls on a CPU), or None where it exports none."""
    if "blas" not in _torch_blas:
        found = None
        for path in sorted((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.*")):
            try:
                library = ctypes.CDLL(str(path))
                found = tuple(ctypes.cast(getattr(library, name), ctypes.c_void_p).value
                              for name in ("sgemm_", "sgemv_"))
                break
            except (OSError, AttributeError):
                continue
        _torch_blas["blas"] = found
    return _torch_blas["blas"]


def sublayer_functions() -> Optional[dict]:
    """What the decoder's sublayer kernels call (``decoder_sublayers.c``):
    PyTorch's BLAS and the step attention, as addresses; None where one is missing."""
    sublayers, attention, blas = SELF_ATTENTION_SUBLAYER.function(), step_attention_function(), torch_blas()
    if sublayers is None or attention is None or blas is None:
        return None
    return dict(gemm=blas[0], gemv=blas[1], attention=ctypes.cast(attention, ctypes.c_void_p).value)


def linear_product(x: Tensor, weight: Tensor, bias: Optional[Tensor], functions: dict) -> Tensor:
    """``F.linear(x, weight, bias)`` (x (rows, in), weight (out, in), float32,
    contiguous) as the sublayer kernels compute it (``functions``:
    ``sublayer_functions()``)."""
    y = x.new_empty(x.size(0), weight.size(0))
    LINEAR_PRODUCT(x=x.data_ptr(), rows=x.size(0), in_features=x.size(1), weight=weight.data_ptr(),
                   bias=_address(bias), out_features=weight.size(0), y=y.data_ptr(), gemm=functions["gemm"],
                   gemv=functions["gemv"])
    return y


def self_attention_sublayer(x: Tensor, residual: Tensor, weights: dict, heads: int, head_dim: int,
                            scale: float, mode: int, k: int, keys: Tensor, values: Tensor,
                            ancestors: Tensor, length: int, functions: dict) -> Tensor:
    """``residual`` + self-attention of ``x`` (both (rows, embed) contiguous
    float32) over the lineage caches ``keys``, ``values`` (capacity, rows0,
    heads, head_dim), this step's written at position ``length - 1``;
    ``weights``: the addresses of q, k, v and out's (``sublayer_weights``)."""
    out = torch.empty_like(residual)
    rows, embed = x.shape
    status = SELF_ATTENTION_SUBLAYER(
        x=x.data_ptr(), residual=residual.data_ptr(), out=out.data_ptr(), rows=rows, embed=embed, **weights,
        heads=heads, head_dim=head_dim, scale=scale, mode=mode, k=k, keys=keys.data_ptr(),
        values=values.data_ptr(), ancestors=ancestors.data_ptr(), anc_stride=ancestors.stride(0),
        rows0=keys.size(1), length=length, **functions)
    _raise_for_status("self_attention_sublayer", status)
    return out


def cross_attention_sublayer(x: Tensor, residual: Tensor, weights: dict, heads: int, head_dim: int,
                             scale: float, mode: int, k: int, source, functions: dict) -> Tensor:
    """``residual`` + cross-attention of ``x`` over ``source`` (as
    ``step_attention``'s); ``weights``: q and out's addresses."""
    out = torch.empty_like(residual)
    rows, embed = x.shape
    source_arguments, _kept = _source_arguments(source)
    status = CROSS_ATTENTION_SUBLAYER(
        x=x.data_ptr(), residual=residual.data_ptr(), out=out.data_ptr(), rows=rows, embed=embed, **weights,
        heads=heads, head_dim=head_dim, scale=scale, mode=mode, k=k, **source_arguments, **functions)
    _raise_for_status("cross_attention_sublayer", status)
    return out


def feed_forward_sublayer(x: Tensor, residual: Tensor, weights: dict, hidden: int, functions: dict) -> Tensor:
    """``residual`` + fc2(relu(fc1(x))); ``weights``: fc1 and fc2's addresses."""
    out = torch.empty_like(residual)
    rows, embed = x.shape
    status = FEED_FORWARD_SUBLAYER(x=x.data_ptr(), residual=residual.data_ptr(), out=out.data_ptr(), rows=rows,
                                   embed=embed, hidden=hidden, **weights, gemm=functions["gemm"],
                                   gemv=functions["gemv"])
    _raise_for_status("feed_forward_sublayer", status)
    return out


def sublayer_weights(**linears) -> dict:
    """The kernels' weight arguments of the Linear layers named (``q=...``):
    ``<name>_weight`` and ``<name>_bias`` addresses."""
    found = {}
    for name, linear in linears.items():
        found[f"{name}_weight"], found[f"{name}_bias"] = linear.weight.data_ptr(), _address(linear.bias)
    return found


# decoder_step's table of a layer: its slots (int64) and scalars (float32), by name
_DECODER_SUBLAYERS_SOURCE = (SOURCE_DIR / "decoder_sublayers.c").read_text()
LAYER_SLOTS = c_enum(_DECODER_SUBLAYERS_SOURCE, "layer_slot")
LAYER_SCALARS = c_enum(_DECODER_SUBLAYERS_SOURCE, "layer_scalar")


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, lanes: int, fused: bool) -> Tensor:
    """``F.layer_norm(x, (n,), weight, bias, eps)`` of x (rows, n) as
    ``layer_norm.c`` computes it with ``lanes`` and ``fused`` (see there);
    float32, contiguous."""
    y = torch.empty_like(x)
    status = LAYER_NORM(x=x.data_ptr(), rows=x.size(0), n=x.size(1), gamma=weight.data_ptr(),
                        beta=bias.data_ptr(), eps=eps, lanes=lanes, fused=int(fused), y=y.data_ptr())
    if status != 0:
        raise ValueError(f"layer_norm: {lanes} lanes")
    return y


_norm_variants: Dict[tuple, Optional[Tuple[int, bool]]] = {}


def layer_norm_variant(n: int, eps: float) -> Optional[Tuple[int, bool]]:
    """(lanes, fused) with which ``layer_norm`` gives ``F.layer_norm``'s
    bits on rows of ``n`` here, or None (no kernel, or no pair does): tried
    once per process, row size and eps, on rows of different means and
    scales. Only rows of whole vectors at either width (``n`` a multiple of
    16): PyTorch's sums over a row's scalar tail are not repeated here bit
    for bit."""
    key = (n, eps)
    if key not in _norm_variants:
        _norm_variants[key] = None
        if n % 16 == 0 and LAYER_NORM.function() is not None:
            generator = torch.Generator().manual_seed(0)  # (the process's own generator untouched)
            x = (torch.randn(64, n, generator=generator) * torch.rand(64, 1, generator=generator) * 10
                 + torch.randn(64, 1, generator=generator) * 10)
            weight, bias = torch.randn(n, generator=generator), torch.randn(n, generator=generator)
            expected = torch.nn.functional.layer_norm(x, (n,), weight, bias, eps)
            _norm_variants[key] = next(((lanes, fused) for lanes in (8, 16) for fused in (True, False)
                                        if torch.equal(layer_norm(x, weight, bias, eps, lanes, fused), expected)),
                                       None)
    return _norm_variants[key]


def decoder_step_functions(functions: Optional[dict]) -> Optional[dict]:
    """``functions`` (``sublayer_functions()``) and ``layer_norm``'s address,
    what ``decoder_step`` calls; None where a kernel is missing."""
    norm = LAYER_NORM.function()
    if functions is None or norm is None or DECODER_STEP.function() is None:
        return None
    return dict(functions, layer_norm=ctypes.cast(norm, ctypes.c_void_p).value)


def decoder_step(features: Tensor, records, caches, sources, scalars: Tensor, pre_norm: bool,
                 ancestors: Tensor, length: int, last_norm, norm_variant: Tuple[int, bool],
                 functions: dict) -> Tensor:
    """The decoder's layers for one step (``decoder_sublayers.c``'s
    ``decoder_step``) of ``features`` (rows, embed), float32, contiguous.
    ``records``: each layer's ``LAYER_SLOTS`` as a list, its weights, sizes
    and modes filled (this call fills the rest); ``caches``: each layer's
    lineage keys and values (capacity, rows0, heads, head_dim); ``sources``:
    each layer's source part as ``step_attention`` takes it; ``scalars``:
    (layers, ``LAYER_SCALARS``) float32; ``last_norm``: (weight, bias, eps)
    or None; ``norm_variant``: ``layer_norm_variant``'s; ``functions``:
    ``decoder_step_functions()``."""
    table, kept = [], []
    keys_slot, values_slot = LAYER_SLOTS["KEYS"], LAYER_SLOTS["VALUES"]
    for record, (keys, values), source in zip(records, caches, sources):
        arguments, held = _source_arguments(source)
        kept.append(held)
        record[keys_slot], record[values_slot] = keys.data_ptr(), values.data_ptr()
        for name, value in arguments.items():
            record[LAYER_SLOTS[name.upper()]] = value or 0
        table += record
    layers = torch.tensor(table, dtype=torch.int64)
    out = torch.empty_like(features)
    rows, embed = features.shape
    weight, bias, eps = last_norm if last_norm is not None else (None, None, 0.0)
    status = DECODER_STEP(
        features=features.data_ptr(), out=out.data_ptr(), rows=rows, embed=embed, n_layers=len(records),
        layers=layers.data_ptr(), layer_scalars=scalars.data_ptr(), pre_norm=int(pre_norm),
        ancestors=ancestors.data_ptr(), anc_stride=ancestors.stride(0), rows0=caches[0][0].size(1), length=length,
        last_norm_weight=_address(weight), last_norm_bias=_address(bias), last_norm_eps=eps,
        norm_lanes=norm_variant[0], norm_fused=int(norm_variant[1]), **functions)
    _raise_for_status("decoder_step", status)
    return out
