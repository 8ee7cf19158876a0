"""matplotlib for the plotting scripts: file output only, and quiet (fairseq's
logging setup would otherwise print matplotlib's font search at DEBUG)."""

import logging


def pyplot():
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_line_plot(fig, ax, path):
    """Grid, legend, tight layout, written to ``path`` (PNG), and say so."""
    import sys

    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    print(f"wrote {path}", file=sys.stderr)
