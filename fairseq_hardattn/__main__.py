"""``python -m fairseq_hardattn`` prints the plugin's directory, the value of
fairseq's ``--user-dir`` from any working directory::

    fairseq-train data-bin --user-dir "$(python -m fairseq_hardattn)" ...

``python -m fairseq_hardattn translate DATA_BIN --path CKPT --input FILE
--output FILE ...`` translates a text file (``corpus``; docs/corpus.md);
``python -m fairseq_hardattn shortlist DATA_BIN -o FILE`` makes a vocabulary
shortlist's table (``fairseq_hardattn/shortlist_table.py``).
"""

import argparse
import sys

from . import USER_DIR

COMMANDS = {"translate": "translate a text file line by line, resumable (docs/corpus.md)",
            "shortlist": "a vocabulary shortlist's table from a binarized training set "
                         "(docs/decoding_engine.md)"}


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("fairseq-hardattn")
    except metadata.PackageNotFoundError:  # imported from a checkout, not installed
        return "unknown (not installed)"


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_hardattn",
        description="Prints the plugin's directory: the value of fairseq's --user-dir (and the hub's "
                    "user_dir=), e.g. fairseq-train data-bin --user-dir \"$(python -m fairseq_hardattn)\". "
                    "Commands: " + "; ".join(f"{name}: {what}" for name, what in COMMANDS.items())
                    + " (python -m fairseq_hardattn COMMAND --help)")
    parser.add_argument("--version", action="version", version=f"fairseq-hardattn {version()}")
    parser.add_argument("--install-startup-hook", action="store_true",
                        help="let fairseq's own commands and hub read fairseq checkpoints under torch >= 2.6 "
                             "in this Python environment, without --user-dir (a .pth file in its "
                             "site-packages; see fairseq_hardattn/startup_hook.py), and print its path")
    return parser


def run_command(name, argv):
    from . import load

    load()  # (``python -m fairseq_hardattn`` imports the package without it)
    if name == "translate":
        from .corpus.command import main as translate

        translate(argv)
    elif name == "shortlist":
        from . import compat
        from .shortlist_table import main as shortlist

        compat.install_for_command_line()  # one-line errors
        shortlist(argv)


def main(argv):
    if argv and argv[0] in COMMANDS:
        from .compat.command_line import end_finished_command

        run_command(argv[0], argv[1:])
        end_finished_command()
    if build_parser().parse_args(argv).install_startup_hook:
        from .startup_hook import install

        print(install())
    else:
        print(USER_DIR)


main(sys.argv[1:])
