"""How the plugin's search uses glibc's allocator on a CPU.

glibc serves blocks over 128 KB-32 MB with fresh pages from the system and
returns them on free: an int8 Linear, like oneDNN's packed float32 one
(``packed_linear``), allocates its output on every call (no ``out=``), and
faulting the output projection's 10 MB back in on every step cost more than
its product saved. So a process that decodes with them keeps such blocks in
its heap (``keep_large_blocks_in_the_heap``).

A heap that keeps them grows: blocks of the sizes one batch needs are freed
between the blocks the next batch holds, and the free pages among them stay
the process's. Over a long run (the corpus command's workers) that was
hundreds of megabytes a process, growing batch after batch. So a process
that keeps them also gives its free pages back to the system, between
batches and at most once every ``GIVE_BACK_EVERY_SECONDS``
(``give_back_free_memory``): the steps after a give-back fault the pages
they use in again, which after every batch costs more than a rare one.

Elsewhere than glibc nothing changes.
"""

import ctypes
import time
from typing import Optional

GIVE_BACK_EVERY_SECONDS = 5.0

_libc = None  # glibc, once the heap keeps large blocks
_given_back_at = 0.0  # time.monotonic() of the last give-back


def _glibc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_large_blocks_in_the_heap():
    """Raise glibc's mmap and trim thresholds to its maximum, once per
    process (a forked worker inherits them)."""
    global _libc, _given_back_at
    if _libc is not None:
        return
    libc = _glibc()
    if libc is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    libc.mallopt(m_trim_threshold, 256 * 1024 * 1024)
    _libc, _given_back_at = libc, time.monotonic()


def keeps_large_blocks() -> bool:
    """Whether this process's heap keeps large blocks (and gives back its
    free pages now and then)."""
    return _libc is not None


def give_back_free_memory(now: Optional[float] = None) -> bool:
    """Between batches: the heap's free pages back to the system
    (``malloc_trim``), where this process keeps large blocks and the last
    time was at least ``GIVE_BACK_EVERY_SECONDS`` ago (``now``: the
    time.monotonic() to judge by). True where it gave them back."""
    global _given_back_at
    if _libc is None:
        return False
    now = time.monotonic() if now is None else now
    if now - _given_back_at < GIVE_BACK_EVERY_SECONDS:
        return False
    _libc.malloc_trim(0)
    _given_back_at = now
    return True
