"""The corpus command's output while it is made: ``OUTPUT.parts/``, one
file per chunk of input lines, each written whole or not at all, and a
manifest naming the command that writes them.

A chunk's file is written under a temporary name, flushed to the disk
(``fsync``) and renamed: a command killed at any moment (SIGKILL, a machine
that goes down) leaves every chunk either done or absent, and the command
run again decodes the absent ones only. When every chunk is done, one
process (the one that takes ``MERGING``) writes them, in order, to a
temporary file beside the output, flushes it and renames it to the output:
the output is whole or absent, and the manifest is kept beside it
(``.OUTPUT.command.json``): the same command run again finds it complete. Processes on several machines (a launcher's
ranks) share the folder; each writes its own chunks.
"""

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from ..errors import ConfigError

MANIFEST = "manifest.json"
MERGING = "merging"  # held by the process that assembles the output
# how long a rank waits for rank 0 to replace another command's parts (--overwrite)
WAIT_FOR_RANK_0_SECONDS = 600


def _fsync_folder(folder: Path):
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_whole(path: Path, lines: Iterable[str]):
    """``lines`` to ``path`` (one per line), on the disk before the name
    appears: a temporary name in the same folder, fsync, rename."""
    temporary = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line)
            f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    _fsync_folder(path.parent)


class Parts:
    """``output``'s parts folder."""

    def __init__(self, output: Path):
        self.output = Path(output)
        self.folder = self.output.with_name(self.output.name + ".parts")
        # the command that assembled the output (its manifest, kept): a rerun is complete
        self.record = self.output.with_name(f".{self.output.name}.command.json")

    def chunk(self, index: int) -> Path:
        return self.folder / f"chunk-{index:09d}.txt"

    def done(self, index: int) -> bool:
        return self.chunk(index).exists()

    def commit(self, index: int, lines: List[str]):
        """Chunk ``index``'s output lines, done."""
        write_whole(self.chunk(index), lines)

    def made_by(self, command: Dict) -> bool:
        """Whether the output is there, assembled by ``command`` (its record)."""
        try:
            return self.output.exists() and json.loads(self.record.read_text()) == command
        except (FileNotFoundError, ValueError):
            return False

    def check(self, command: Dict, overwrite: bool):
        """Refuse (writing nothing) an output already there, or a folder of
        another command's parts, unless ``overwrite``."""
        if overwrite:
            return
        if self.output.exists() and not self.folder.exists():
            raise ConfigError(f"{self.output} exists, made by another command or by none "
                              f"(--overwrite to replace it)")
        found = self._manifest()
        if found is not None and found != command:
            differs = sorted(key for key in set(command) | set(found) if found.get(key) != command.get(key))
            raise ConfigError(f"{self.folder} holds the parts of another command (it differs in "
                              f"{', '.join(differs)}): run that command again to finish it, or "
                              f"--overwrite to start this one")

    def start(self, command: Dict, rank: int, overwrite: bool):
        """Make sure the parts are this ``command``'s (a JSON-able description
        of what decides the output): a folder of another command's, or an
        output already there, is refused unless ``overwrite``, where rank 0
        clears them and the others wait for its manifest."""
        self.check(command, overwrite)
        if rank == 0 or not overwrite:
            if overwrite and (self.output.exists() or self._manifest() not in (None, command)):
                self.clear()
            self.folder.mkdir(exist_ok=True)
            self._claim(command)
        found = self._manifest()
        if overwrite and rank != 0:
            deadline = time.monotonic() + WAIT_FOR_RANK_0_SECONDS
            while found != command or self.output.exists():
                if time.monotonic() > deadline:
                    raise ConfigError(f"rank 0 did not start {self.folder} for this command "
                                      f"within {WAIT_FOR_RANK_0_SECONDS} s (--overwrite)")
                time.sleep(1)
                found = self._manifest()
        if found != command:  # (another process claimed the folder meanwhile)
            self.check(command, overwrite=False)

    def _manifest(self) -> Optional[Dict]:
        try:
            return json.loads((self.folder / MANIFEST).read_text())
        except FileNotFoundError:
            return None

    def _claim(self, command: Dict):
        """Write the manifest unless one is there (one process wins: a link
        to a whole temporary file fails where the name exists)."""
        if (self.folder / MANIFEST).exists():
            return
        temporary = self.folder / f".{MANIFEST}.{socket.gethostname()}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(command, indent=1, sort_keys=True))
        try:
            os.link(temporary, self.folder / MANIFEST)
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
        _fsync_folder(self.folder)

    def clear(self):
        """Remove the parts and the output."""
        shutil.rmtree(self.folder, ignore_errors=True)
        for path in (self.output, self.record):
            if path.exists():
                path.unlink()

    def missing(self, chunks: int) -> List[int]:
        return [index for index in range(chunks) if not self.done(index)]

    def merge(self, chunks: int, force: bool = False) -> bool:
        """Assemble the output from every chunk (all done) and remove the
        parts; False where another process is doing so (unless ``force``:
        ``--merge`` after a merging process died)."""
        lock = self.folder / MERGING
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if not force:
                return False
            descriptor = os.open(lock, os.O_WRONLY)
        os.write(descriptor, f"{socket.gethostname()} {os.getpid()}\n".encode())
        os.close(descriptor)
        temporary = self.output.with_name(f".{self.output.name}.{os.getpid()}.tmp")
        with open(temporary, "wb") as out:
            for index in range(chunks):
                with open(self.chunk(index), "rb") as part:
                    shutil.copyfileobj(part, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(self.folder / MANIFEST, self.record)
        os.replace(temporary, self.output)
        _fsync_folder(self.output.parent)
        shutil.rmtree(self.folder, ignore_errors=True)
        return True
