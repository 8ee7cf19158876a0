"""Building the native library: the C kernels (``*.c``) and the Python
module around them (``*.cpp``, against PyTorch's headers, as a PyTorch C++
extension is built) compiled and linked into one extension module,
``_native``, cached under ``$FAIRSEQ_HARDATTN_KERNEL_DIR`` (default
``~/.cache/fairseq_hardattn/kernels``) and keyed by the sources, the
compilers, their flags, the CPU (``-march=native``), PyTorch and Python.
``make venv`` builds it (``python -m fairseq_hardattn.kernels``); otherwise
its first use does, once per machine (about half a minute).

The C files are compiled with the kernels' flags: reassociated float sums
(vectorised reductions) but IEEE infinities and NaN kept, and no
-ffast-math (gcc < 13 would link crtfastmath.o, flushing denormals to zero
in the whole process); those that repeat PyTorch's sums operation for
operation without reassociation or contraction (``FILE_FLAGS``), as the
C++ files. OpenMP where the compiler has it (torch's own runtime, the
``libgomp.so.1`` it loads first), else its simd pragmas only.
``FAIRSEQ_HARDATTN_KERNEL_CFLAGS`` adds flags to every step (part of the
key): ``scripts/sanitize_kernels.sh`` builds with the sanitizers so. Each
file's object is kept in the cache (``objects/``, by its source, the
headers, the compiler, its flags, the CPU, PyTorch and Python): a build after a change recompiles the
files it touched, and links (a build in a directory of the process's own, too).
"""

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

SOURCE_DIR = Path(__file__).resolve().parent
MODULE = "fairseq_hardattn.kernels._native"
COMMON = ("-O3", "-march=native", "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math")
C_FLAGS = COMMON + ("-std=c99", "-fassociative-math", "-fno-signed-zeros")
# per file: whose float sums repeat PyTorch's operation for operation (no
# reassociation, no contraction), or whose float steps PyTorch's ops repeat
IN_ORDER = ("-fno-associative-math", "-ffp-contract=off")
FILE_FLAGS = {"layer_norm.c": IN_ORDER, "int8_linear.c": IN_ORDER, "panel_linear.c": IN_ORDER}
CXX_FLAGS = COMMON + ("-std=c++20", "-ffp-contract=off", "-w")
THREADING = (("-fopenmp",), ("-fopenmp-simd",))
# the cache's folder of compiled objects, by source, headers, compiler and flags
OBJECTS = "objects"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "fairseq_hardattn" / "kernels"
    return Path(os.environ.get("FAIRSEQ_HARDATTN_KERNEL_DIR") or default)


def _found(variable: str, names: Sequence[str]) -> Optional[str]:
    """$variable where set (only it), else the first of ``names`` found."""
    if os.environ.get(variable):
        return os.environ[variable] if shutil.which(os.environ[variable]) else None
    return next((name for name in names if shutil.which(name)), None)


def compilers():
    """(the C compiler, the C++ compiler); raises RuntimeError naming what is missing."""
    cc = _found("CC", ("cc", "gcc", "clang"))
    cxx = _found("CXX", ("c++", "g++", "clang++"))
    if cc is None or cxx is None:
        raise RuntimeError("no C compiler found (CC={!r}, CXX={!r}; install gcc and g++ or set CC and CXX)".format(
            os.environ.get("CC", ""), os.environ.get("CXX", "")))
    return cc, cxx


def _cpu_signature() -> bytes:
    """What -march=native depends on: the CPU's flags (Linux), else its name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    return (platform.machine() + platform.processor()).encode()


def _torch_flags():
    """(compile flags, link flags) of a PyTorch C++ extension for this
    process's PyTorch and Python: the include and library folders
    ``torch.utils.cpp_extension`` names (not imported: it imports setuptools)."""
    import torch

    root = Path(torch.__file__).resolve().parent
    includes = [f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
                f"-I{sysconfig.get_paths()['include']}"]
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    libraries = root / "lib"
    link = [f"-L{libraries}", f"-Wl,-rpath,{libraries}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    return includes + [f"-D_GLIBCXX_USE_CXX11_ABI={abi}"], link


def _sources() -> List[Path]:
    return sorted(SOURCE_DIR.glob("*.c")) + sorted(SOURCE_DIR.glob("*.cpp"))


def _extra_flags():
    return tuple(os.environ.get("FAIRSEQ_HARDATTN_KERNEL_CFLAGS", "").split())


def _platform() -> bytes:
    """What a library or an object was built for beyond its sources and
    flags: the CPU (-march=native), PyTorch (its headers and libraries) and
    Python."""
    import torch

    return b"\0".join([_cpu_signature(), torch.__version__.encode(),
                        sysconfig.get_config_var("EXT_SUFFIX").encode()])


def library_path(cached: bool = True) -> Path:
    """Where the library built from these sources, compilers, flags, CPU,
    PyTorch and Python is (or would be) cached; raises RuntimeError where a
    compiler is missing."""
    cc, cxx = compilers()
    compile_flags, link_flags = _torch_flags()
    files = _sources() + sorted(SOURCE_DIR.glob("*.h"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    key = hashlib.sha256(b"\0".join(
        [path.name.encode() + path.read_bytes() for path in files]
        + [cc.encode(), cxx.encode(), " ".join(C_FLAGS + CXX_FLAGS + _extra_flags()).encode(), repr(FILE_FLAGS).encode(),
           _platform(), " ".join(compile_flags + link_flags).encode()])).hexdigest()
    return (cache_dir() if cached else _private_dir()) / f"_native-{key[:16]}{suffix}"


def build(cached: bool = True) -> Path:
    """Compile the library (cached; ``cached=False``: into a directory of
    this process's own) and return its path; raises RuntimeError naming the
    problem."""
    target = library_path(cached)
    if target.exists():
        return target
    cc, cxx = compilers()
    extra = _extra_flags()
    compile_flags, link_flags = _torch_flags()
    sources = _sources()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            for threading in THREADING:
                try:
                    _compile_and_link(cc, cxx, sources, Path(tmp), threading, extra, compile_flags, link_flags,
                                      partial, cache_dir() / OBJECTS)
                    break
                except RuntimeError:
                    if threading is THREADING[-1]:
                        raise
            # built beside the target, then renamed: concurrent processes (test
            # workers, distributed ranks) never load a half-written library
            os.replace(partial, target)
        return target
    except OSError as error:  # a cache directory this process cannot write
        if not cached:
            raise
        import logging

        logging.getLogger(__name__).warning(
            "fairseq-hardattn: cannot write the kernel cache %s (%s); building the native kernels in a "
            "directory of this process's own", target.parent, error)
        return build(cached=False)


def _compile_and_link(cc, cxx, sources, tmp: Path, threading, extra, compile_flags, link_flags, target: Path,
                      objects_dir: Path):
    objects, commands, made = [], [], []
    headers = b"\0".join([path.read_bytes() for path in sorted(SOURCE_DIR.glob("*.h"))] + [_platform()])
    for source in sources:
        if source.suffix == ".c":
            flags = [cc, *C_FLAGS, *threading, *FILE_FLAGS.get(source.name, ()), *extra]
        else:
            flags = [cxx, *CXX_FLAGS, *threading, *extra, *compile_flags]
        # an object compiled before from the same source, headers, compiler, flags and platform
        key = hashlib.sha256(b"\0".join([source.read_bytes(), headers, " ".join(flags).encode()])).hexdigest()
        kept = objects_dir / f"{source.name}-{key[:16]}.o"
        if kept.exists():
            objects.append(kept)
            continue
        obj = tmp / (source.name + ".o")
        objects.append(obj)
        made.append((obj, kept))
        commands.append((source.name, [*flags, "-c", str(source), "-o", str(obj)]))
    _run_all(commands, os.cpu_count() or 1)
    _run_all([("the link", [cxx, "-shared", *threading, *extra, *map(str, objects), *link_flags, "-o",
                            str(target)])], 1)
    for obj, kept in made:  # kept for the next build (a changed kernel recompiles that file alone)
        try:
            objects_dir.mkdir(parents=True, exist_ok=True)
            partial = kept.with_name(f".{kept.name}.{os.getpid()}")
            shutil.copyfile(obj, partial)
            os.replace(partial, kept)
        except OSError:
            pass


def _run_all(commands, parallel: int):
    """Run the (name, command) pairs ``commands``, ``parallel`` at a time (C
    files first: they are quick, and a broken C compiler fails at once);
    RuntimeError with the first failure's output."""
    pending, running = list(commands), []
    while pending or running:
        while pending and len(running) < parallel:
            name, command = pending.pop(0)
            running.append((name, command[0], subprocess.Popen(command, stdout=subprocess.PIPE,
                                                                stderr=subprocess.STDOUT, text=True)))
        name, program, process = running.pop(0)
        output = process.communicate()[0]
        if process.returncode != 0:
            for _, _, other in running:  # the first failure is the answer
                other.kill()
                other.wait()
            raise RuntimeError(f"{Path(program).name} failed on {name}: {output.strip()[-2000:]}")


def _private_dir() -> Path:
    """A kernel directory of this process's own (removed at its exit)."""
    if not hasattr(_private_dir, "path"):
        import atexit

        _private_dir.path = Path(tempfile.mkdtemp(prefix="fairseq_hardattn_kernels-"))
        atexit.register(shutil.rmtree, _private_dir.path, ignore_errors=True)
    return _private_dir.path


def load_module(path: Path):
    """The extension module at ``path`` (ImportError where it does not load)."""
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules.setdefault(MODULE, module)
    return module
