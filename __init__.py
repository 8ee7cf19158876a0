"""The repository root given as fairseq's --user-dir (``--user-dir .``): it
loads the plugin, ``fairseq_hardattn/``, which is the user dir to give."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairseq_hardattn  # noqa: E402,F401
