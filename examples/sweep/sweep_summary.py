#!/usr/bin/env python
"""Summarise a Hydra multirun sweep of fairseq-hydra-train (examples/sweep):
each run's overrides and its best (lowest) validation loss, best first.

Usage: examples/sweep/sweep_summary.py SWEEP_DIR [--json OUT]
"""

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

VALID = re.compile(r"valid on '\w+' subset \| loss ([\d.]+)")


def summarise(sweep_dir):
    rows = []
    for job in sorted(Path(sweep_dir).iterdir(), key=lambda p: p.name):
        overrides_file = job / ".hydra" / "overrides.yaml"
        if not overrides_file.is_file():
            continue
        overrides = yaml.safe_load(overrides_file.read_text()) or []
        losses = [float(m.group(1)) for log in job.glob("*.log")
                  for m in VALID.finditer(log.read_text())]
        rows.append({"run": job.name, "overrides": " ".join(overrides),
                     "best_valid_loss": min(losses) if losses else None,
                     "epochs_validated": len(losses)})
    # show only what the sweep varies
    varying = {o for r in rows for o in r["overrides"].split()} - set.intersection(
        *[set(r["overrides"].split()) for r in rows]) if rows else set()
    for r in rows:
        r["overrides"] = " ".join(o for o in r["overrides"].split() if o in varying)
    return sorted(rows, key=lambda r: (r["best_valid_loss"] is None, r["best_valid_loss"] or 0))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if not Path(args.sweep_dir).is_dir():
        p.error(f"{args.sweep_dir} is not a folder")
    rows = summarise(args.sweep_dir)
    if not rows:
        p.error(f"no Hydra runs (.hydra/overrides.yaml) under {args.sweep_dir}")
    print("| run | overrides | best valid loss | epochs |\n|---|---|---|---|")
    for r in rows:
        loss = "—" if r["best_valid_loss"] is None else f"{r['best_valid_loss']:.3f}"
        print(f"| {r['run']} | {r['overrides']} | {loss} | {r['epochs_validated']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
