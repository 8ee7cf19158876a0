#!/usr/bin/env python
"""Argmax mass and effective keys of a model's hard retrieval heads; see
hardattn_tools/attention_sharpness.py."""
import sys

from hardattn_tools.attention_sharpness import main

if __name__ == "__main__":
    sys.exit(main())
