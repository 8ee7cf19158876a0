"""Compiled CPU kernels: plain C, built on first use with the system's C
compiler and loaded with ctypes (no torch headers to compile, so a build
takes well under a second; no build step at install time): flexible
attention's band (``flexible_band.c``), the plugin's search's candidates
(``beam_candidates.c``) and attention steps over keys read in place: the
encoder's, and lineage caches (``step_attention.c``).

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
import os
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
    extra = tuple(os.environ.get("FAIRSEQ_HARDATTN_KERNEL_CFLAGS", "").split())
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


_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_FLEXIBLE_BAND_ARGS = [_ptr, _i64, _i64, _f32, _ptr, _ptr, _i64, _ptr, _i64, _i64,
                       _ptr, _ptr, _f32, _f32, _f32, _ptr, _ptr, _ptr]


def _function(library_name: str, name: str, argtypes, restype):
    """The C function ``name`` of the kernel library ``library_name`` with
    its signature set, or None (no library)."""
    library = load(library_name)
    if library is None:
        return None
    function = getattr(library, name)
    if function.argtypes is None:
        function.argtypes = argtypes
        function.restype = restype
    return function


def flexible_band_function():
    """The C function ``flexible_band_step``, or None."""
    return _function("flexible_band", "flexible_band_step", _FLEXIBLE_BAND_ARGS, ctypes.c_int)


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
    status = flexible_band_function()(
        q.data_ptr(), rows, head_dim, scaling, k.data_ptr(), v.data_ptr(), src_len,
        None if padding is None else padding.data_ptr(), beam, heads,
        centre.data_ptr(), gate.data_ptr(), sigma, 2.0 * threshold, -0.5 / sigma ** 2,
        out.data_ptr(), new_centre.data_ptr(), scored.data_ptr())
    if status != 0:
        raise MemoryError("flexible_band_step: could not allocate its scratch memory")
    return out, new_centre, scored


_BEAM_CANDIDATES_ARGS = [_ptr, _i64, _i64, _i64, _ptr, _ptr, _i64, _i64, _ptr, _ptr, _ptr]


def beam_candidates_function():
    """The C function ``beam_candidates``, or None."""
    return _function("beam_candidates", "beam_candidates", _BEAM_CANDIDATES_ARGS, None)


def can_run_beam_candidates(logits: Tensor) -> bool:
    """Whether ``beam_candidates`` applies: CPU float32 logits whose rows are
    contiguous, no gradient needed."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.stride(1) == 1 and not torch.is_grad_enabled()
            and beam_candidates_function() is not None)


def beam_candidates(logits: Tensor, special_columns: Tensor, special_adds: Tensor,
                    k: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(see beam_candidates.c) logits (rows, vocab) float32; special_columns
    (S,) int64 and special_adds (S,) float32 (NaN: never chosen). Returns the
    best ``k`` adjusted values and their tokens (rows, k), descending, and
    each row's log-normaliser of the raw logits (rows, 1)."""
    rows, vocab = logits.shape
    top_vals = logits.new_empty(rows, k)
    top_idx = torch.empty(rows, k, dtype=torch.int64)
    lse = logits.new_empty(rows, 1)
    beam_candidates_function()(
        logits.data_ptr(), rows, vocab, logits.stride(0), special_columns.data_ptr(),
        special_adds.data_ptr(), special_columns.numel(), k, top_vals.data_ptr(),
        top_idx.data_ptr(), lse.data_ptr())
    return top_vals, top_idx, lse


def ensemble_log_probs_function():
    """The C function ``ensemble_log_probs`` (in beam_candidates.c), or None."""
    return _function("beam_candidates", "ensemble_log_probs", [_ptr, _ptr, _i64, _i64, _i64, _ptr],
                     ctypes.c_int)


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
    ensemble_log_probs_function()(addresses.data_ptr(), strides.data_ptr(), len(logits), rows, vocab,
                                  out.data_ptr())
    return out


_STEP_ATTENTION_ARGS = [_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _i64, _i64, _i64, _ptr, _i64, _i64,
                        _ptr, _ptr, _ptr, _i64, _i64, _i64, _f32, ctypes.c_int, _i64, _ptr, _f32,
                        _f32, _ptr]


def step_attention_function():
    """The C function ``step_attention``, or None."""
    return _function("step_attention", "step_attention", _STEP_ATTENTION_ARGS, ctypes.c_int)


def step_attention(q: Tensor, scale: float, mode: int, k: int, out: Tensor,
                   source: Optional[Tuple[Tensor, Tensor, Optional[Tensor], int]] = None,
                   lineage: Optional[Tuple[Tensor, Tensor, Tensor, int]] = None,
                   local: Optional[Tuple[Tensor, float, float]] = None):
    """(see step_attention.c) q, out (rows, heads, dim) contiguous float32.
    ``source``: (keys, keys_t, values, padding, group): keys and values
    (sentences, heads, src_len, dim), dim contiguous; keys_t the keys as
    ``transposed_keys`` lays them out; padding (sentences, src_len) bool or
    None; ``group`` hypotheses per sentence. ``lineage``: (keys, values,
    ancestors, length): keys and values (capacity, rows0, heads, dim)
    contiguous, ancestors (>= rows, >= length) int64; positions
    0..length-1 are attended. One of the two at least. ``local`` (mode
    LOCAL, source only): (centres (rows, heads) float32 contiguous, window,
    gaussian)."""
    rows, heads, dim = q.shape
    src_keys = keys_t = src_values = padding = None
    src_len = group = 0
    strides = (0, 0, 0)
    if source is not None:
        src_keys, keys_t, src_values, padding, group = source
        if src_keys.stride() != src_values.stride() or src_keys.stride(3) != 1:
            src_keys, src_values = src_keys.contiguous(), src_values.contiguous()
        src_len, strides = src_keys.size(2), src_keys.stride()[:3]
        if padding is not None:
            padding = padding.contiguous()
    keys = values = ancestors = None
    anc_stride = rows0 = length = 0
    if lineage is not None:
        keys, values, ancestors, length = lineage
        rows0, anc_stride = keys.size(1), ancestors.stride(0)
    status = step_attention_function()(
        q.data_ptr(), rows, heads, dim,
        _address(src_keys), _address(keys_t), _address(src_values), *strides, _address(padding), src_len, group,
        _address(keys), _address(values), _address(ancestors), anc_stride, rows0, length,
        scale, mode, k, *((_address(local[0]), local[1], local[2]) if local else (None, 0.0, 1.0)),
        out.data_ptr())
    if status == 2:
        raise MemoryError("step_attention: could not allocate its scratch memory")
    if status != 0:
        raise ValueError(f"step_attention: k <= {STEP_MAX_K} and at least one position to attend")


def step_attention_threads(rows: int, heads: int, dim: int, positions: int) -> int:
    """The threads ``step_attention`` splits such a step over (torch's
    intra-op threads where the step is large enough; 1 without OpenMP)."""
    function = _function("step_attention", "step_attention_threads", [_i64] * 4, ctypes.c_int)
    return function(rows, heads, dim, positions)


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
