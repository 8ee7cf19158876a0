"""decoding/heap.py: a process whose heap keeps large blocks gives its free
pages back to the system, at most once every GIVE_BACK_EVERY_SECONDS."""

import platform
import subprocess
import sys

import pytest

from conftest import REPO, tool_env

# in a process of its own: the allocator's settings are the whole process's
PROGRAM = """
import time
import torch
from fairseq_hardattn.decoding import heap

def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2 ** 20

assert not heap.keeps_large_blocks() and not heap.give_back_free_memory(now=time.monotonic() + 1e6)
heap.keep_large_blocks_in_the_heap()
assert heap.keeps_large_blocks()
start = time.monotonic()
# 1 MB blocks, every other one freed: 300 MB of free pages between blocks in
# use, which glibc's own trimming (at the heap's top) cannot return
blocks = [torch.ones(256 * 1024) for _ in range(600)]
del blocks[::2]
held = resident_mb()
assert not heap.give_back_free_memory(now=start + heap.GIVE_BACK_EVERY_SECONDS / 2)  # too soon
assert resident_mb() > held - 50
assert heap.give_back_free_memory(now=start + heap.GIVE_BACK_EVERY_SECONDS)
print(held, resident_mb())
assert not heap.give_back_free_memory(now=start + 1.5 * heap.GIVE_BACK_EVERY_SECONDS)  # since the last
"""


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc",
                    reason="glibc's allocator")
def test_free_pages_inside_the_heap_go_back_to_the_system_at_most_every_few_seconds():
    proc = subprocess.run([sys.executable, "-c", PROGRAM], cwd=REPO, env=tool_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    held, after = map(float, proc.stdout.split())
    assert after < held - 200, (held, after)  # of the 300 MB freed
