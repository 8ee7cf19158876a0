"""The corpus command's input: a text file read as numbered chunks of lines,
streamed (one chunk in memory at a time), and each launcher rank's share of
the chunks."""

import os
import sys
from typing import Iterator, List, Tuple

from ..errors import ConfigError

_BLOCK = 1 << 20


def count_lines(path: str) -> int:
    """Lines in ``path``: its newlines, and a last line without one."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def decoded(raw: bytes, number: int, path: str) -> str:
    """A line's text: invalid UTF-8 is replaced (U+FFFD), with one warning
    naming the line, so that the line is translated and the files stay
    aligned."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        print(f"fairseq-hardattn: warning: {path} line {number} is not valid UTF-8 (byte "
              f"0x{raw[error.start]:02x} at byte {error.start + 1}): translated with U+FFFD in its place",
              file=sys.stderr, flush=True)
        return raw.decode("utf-8", errors="replace")


def chunks(path: str, chunk_lines: int, wanted) -> Iterator[Tuple[int, int, List[str]]]:
    """(chunk index, its first line's index, its lines stripped) for each
    chunk of ``chunk_lines`` lines that ``wanted(index)`` asks for; the others
    are read past, not decoded."""
    index, first, lines = 0, 0, []
    keep = wanted(0)
    with open(path, "rb") as f:
        for number, raw in enumerate(f):
            if keep:
                lines.append(decoded(raw, number + 1, path).strip())
            if number + 1 - first == chunk_lines:
                if keep:
                    yield index, first, lines
                index, first, lines = index + 1, number + 1, []
                keep = wanted(index)
        if keep and lines:
            yield index, first, lines


def launcher_rank() -> Tuple[int, int]:
    """(this process's rank, the number of ranks) under torchrun (RANK,
    WORLD_SIZE) or SLURM (SLURM_PROCID, SLURM_NTASKS); (0, 1) alone."""
    for rank_name, world_name in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_name in os.environ and world_name in os.environ:
            try:
                rank, world = int(os.environ[rank_name]), int(os.environ[world_name])
            except ValueError:
                raise ConfigError(f"{rank_name}={os.environ[rank_name]!r} and {world_name}="
                                  f"{os.environ[world_name]!r} are not numbers") from None
            if not 0 <= rank < world:
                raise ConfigError(f"{rank_name}={rank} is not below {world_name}={world}")
            return rank, world
    return 0, 1
