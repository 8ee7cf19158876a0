"""matplotlib for the plotting scripts: file output only, and quiet (fairseq's
logging setup would otherwise print matplotlib's font search at DEBUG)."""

import logging


def pyplot():
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
