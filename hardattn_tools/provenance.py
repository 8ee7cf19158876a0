"""Where a result was measured: every JSON a script writes into results/
names the commit, the CPU (its model name and the instruction sets that
change the kernels), torch's and CTranslate2's versions and the command,
with paths relative to the repository (or to the folder above it, where the
data and the trained models live): a committed result holds no path of the
machine that made it."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
# the CPU flags that decide which kernels run (lscpu's names)
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def cpu() -> str:
    """lscpu's model name and the kernel-deciding flags it has."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return f"{name} ({', '.join(flag for flag in KERNEL_FLAGS if flag in flags) or 'none of ' + '/'.join(KERNEL_FLAGS[:2])})"


def commit() -> str:
    """The checkout's commit, ``+changes`` where files differ from it."""
    def git(*args):
        return subprocess.run(["git", "-C", str(REPOSITORY), *args], capture_output=True, text=True,
                              timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if changed else "")


def relative(value):
    """``value`` (a JSON-able object) with each absolute path made relative:
    to the repository where it lies inside it, else to the folder above it
    (``../data/...``); a path elsewhere keeps its last two parts."""
    if isinstance(value, dict):
        return {key: relative(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative(item) for item in value]
    if not isinstance(value, str) or "/" not in value:
        return value
    return " ".join(_relative_word(word) for word in value.split(" ")) if " " in value else _relative_word(value)


def _relative_word(word: str) -> str:
    prefix, _, path = word.rpartition("=") if "=" in word else ("", "", word)
    if not path.startswith("/"):
        return word
    inside = os.path.relpath(path, REPOSITORY)
    if not inside.startswith(".."):
        path = inside
    elif os.path.commonpath([path, str(REPOSITORY.parent)]) != "/":
        path = os.path.relpath(path, REPOSITORY)
    else:
        path = os.path.join("...", *Path(path).parts[-2:])
    return f"{prefix}={path}" if prefix else path


def provenance(argv=None) -> dict:
    try:
        from importlib import metadata

        ctranslate2 = metadata.version("ctranslate2")
    except Exception:  # not installed: the peer was not measured
        ctranslate2 = None
    import torch

    return {"commit": commit(), "cpu": cpu(), "torch": torch.__version__, "ctranslate2": ctranslate2,
            "command": relative(" ".join(str(word) for word in (sys.argv if argv is None else argv)))}


def stamped(result):
    """``result`` with its paths relative and, where it is a mapping, its ``provenance``."""
    result = relative(result)
    if isinstance(result, dict):
        result = {**result, "provenance": provenance()}
    return result


def write_json(path, result):
    with open(path, "w") as f:
        json.dump(stamped(result), f, indent=2)
        f.write("\n")
