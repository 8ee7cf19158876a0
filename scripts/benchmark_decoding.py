#!/usr/bin/env python
"""Side-by-side decoding (and training) speed; see hardattn_tools/benchmark.py."""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported
from hardattn_tools.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
