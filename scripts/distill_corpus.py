#!/usr/bin/env python
"""Sequence-level distillation: a data-bin whose training targets are a
teacher's translations; see hardattn_tools/distillation.py."""
import sys

from hardattn_tools.distillation import main

if __name__ == "__main__":
    sys.exit(main())
