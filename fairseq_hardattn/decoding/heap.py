"""glibc's heap kept for a decoding step's large outputs.

glibc serves blocks of 128 KB to 32 MB with fresh pages from the system and
returns them on free. An int8 Linear, like oneDNN's packed float32 one
(``packed_linear``), allocates its output on every call (no ``out=``), and
faulting the int8 output projection's 10 MB back in on every step cost more
than its int8 product saved (at the small preset: slower than float32). So
blocks up to glibc's maximum (32 MB) come from the heap, and as much may
stay free at its top before glibc gives it back (its trim threshold), once
per process; elsewhere (not glibc) nothing changes.

What stays free at the top is also what each worker process may hold beyond
its needs: a threshold of 256 MB let a worker's memory climb by that much
over its batches before glibc gave it back. One of 16 MB held a long run's
memory lower still, but slowed the int8 output projection at a 32k
vocabulary and the small preset's float32 runs by a few per cent.
"""

import ctypes

LARGEST_HEAP_BLOCK = 32 * 1024 * 1024  # glibc's largest mmap threshold

_done = False


def keep_large_blocks_in_the_heap():
    """Blocks up to ``LARGEST_HEAP_BLOCK`` from the heap, and as much kept
    free at its top (once per process)."""
    global _done
    if _done:
        return
    _done = True
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, LARGEST_HEAP_BLOCK)
    libc.mallopt(m_trim_threshold, LARGEST_HEAP_BLOCK)
