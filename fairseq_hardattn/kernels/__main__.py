"""``python -m fairseq_hardattn.kernels``: build the native library now (as
``make venv`` does) and print where it is cached."""

import sys

from . import build

if __name__ == "__main__":
    try:
        print(build.build())
    except RuntimeError as error:
        sys.exit(f"fairseq-hardattn: error: the native kernels did not build: {error}")
