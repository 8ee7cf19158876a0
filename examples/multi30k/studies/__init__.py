"""The Multi30k experiments, one study per module (gathered by ../experiments.py)."""
