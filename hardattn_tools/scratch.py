"""Scratch folders of the benchmarks and research scripts (converted peer
models, random checkpoints, corpora, outputs): made under the system's
temporary folder and removed when the process ends, normally or by an
exception, so that a run leaves nothing behind (a Base model and its
CTranslate2 copy are some 400 MB a run)."""

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Optional


def scratch_folder(prefix: str, keep: Optional[str] = None) -> Path:
    """A new temporary folder named ``prefix...``, removed at the process's
    end; or ``keep`` (a user's ``--work-dir``), created where missing and
    left in place."""
    if keep:
        folder = Path(keep)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
