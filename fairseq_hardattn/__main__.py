"""``python -m fairseq_hardattn`` prints the plugin's directory, the value of
fairseq's ``--user-dir`` from any working directory::

    fairseq-train data-bin --user-dir "$(python -m fairseq_hardattn)" ...
"""

import argparse

from . import USER_DIR


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fairseq-hardattn")
    except metadata.PackageNotFoundError:  # imported from a checkout, not installed
        return "unknown (not installed)"


parser = argparse.ArgumentParser(
    prog="python -m fairseq_hardattn",
    description="Prints the plugin's directory: the value of fairseq's --user-dir (and the hub's "
                "user_dir=), e.g. fairseq-train data-bin --user-dir \"$(python -m fairseq_hardattn)\"")
parser.add_argument("--version", action="version", version=f"fairseq-hardattn {version()}")
parser.add_argument("--install-startup-hook", action="store_true",
                    help="let fairseq's own commands and hub read fairseq checkpoints under torch >= 2.6 "
                         "in this Python environment, without --user-dir (a .pth file in its "
                         "site-packages; see fairseq_hardattn/startup_hook.py), and print its path")
if parser.parse_args().install_startup_hook:
    from .startup_hook import install

    print(install())
else:
    print(USER_DIR)
