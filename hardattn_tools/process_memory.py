"""The memory of a process and its children (Linux /proc): the
proportional set size summed over the tree, pages shared between processes
(forked workers and their parent) counted once."""

import os
import threading
import time
from typing import List, Tuple


def process_tree(pid: int) -> List[int]:
    """``pid`` and every process under it."""
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    pids += process_tree(int(child))
    except OSError:
        pass
    return pids


def pss_mb(pid: int) -> float:
    """The proportional set size of the process ``pid``, in MB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def tree_pss_mb(pid: int) -> float:
    """The proportional set size of ``pid``'s tree, in MB (0 once it is gone)."""
    return sum(pss_mb(p) for p in process_tree(pid))


class MemorySampler(threading.Thread):
    """Samples ``tree_pss_mb(pid)`` every ``seconds`` until ``stop``, with
    ``progress()`` (a number, e.g. the lines done) beside each sample."""

    def __init__(self, pid: int, seconds: float = 0.5, progress=lambda: None):
        super().__init__(daemon=True)
        self.pid, self.seconds, self.progress = pid, seconds, progress
        self.samples: List[Tuple[float, float, object]] = []  # (time, MB, progress)
        self._stopped = threading.Event()

    def run(self):
        started = time.monotonic()
        while not self._stopped.is_set():
            mb = tree_pss_mb(self.pid)
            if mb:
                self.samples.append((time.monotonic() - started, mb, self.progress()))
            self._stopped.wait(self.seconds)

    def stop(self) -> "MemorySampler":
        self._stopped.set()
        self.join()
        return self

    def peak_mb(self) -> float:
        return max((mb for _, mb, _ in self.samples), default=0.0)
