#!/usr/bin/env python
"""The corpus command stopped again and again: runs ``python -m
fairseq_hardattn translate`` once to the end, then the same command into
another output, stopping it ``--kills`` times at random moments (SIGKILL and
SIGTERM in turn, each after a random delay from its start) and starting it
again each time, then once to the end. Counts the output lines lost and
repeated against the uninterrupted run (line by line, and byte for byte),
and the time the stops cost (the wall time of every start of the stopped
run, less the uninterrupted run's).

Example: research/corpus_resume.py --kills 20 --lines 5000 -- work/deen/data-bin
    --path work/deen/checkpoints/checkpoint_best.pt --source-lang de --target-lang en
    --tokenizer moses --bpe subword_nmt_vocab --bpe-codes work/deen/bpe/codes
    --bpe-vocabulary work/deen/bpe/vocab.de --beam 4 --input corpus.de
(the arguments after ``--`` are the corpus command's, without --output)
"""

import argparse
import random
import signal
import subprocess
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="stops before the run is let finish")
    p.add_argument("--max-delay", type=float, default=None,
                   help="stop each start after a random delay up to this (seconds; default: four "
                        "times the uninterrupted run's wall time over --kills, so that the stops "
                        "fall all along the run)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work-dir", help="where the outputs go (default: a temporary folder)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the corpus command's arguments")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("give the corpus command's arguments after --")
    return args


def start(command, output):
    return subprocess.Popen([sys.executable, "-m", "fairseq_hardattn", "translate", *command,
                             "--output", str(output), "--no-progress-bar"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def main(argv=None):
    args = parse_args(argv)
    from hardattn_tools.scratch import scratch_folder

    work = scratch_folder("corpus-resume-", keep=args.work_dir)
    whole, stopped = work / "whole.txt", work / "stopped.txt"
    for path in (whole, stopped):
        if path.exists():
            path.unlink()
    began = time.monotonic()
    process = start(args.command, whole)
    error = process.communicate()[1]
    if process.returncode != 0:
        raise SystemExit(f"corpus_resume: the uninterrupted run failed:\n{error[-2000:]}")
    uninterrupted = time.monotonic() - began
    print(f"[corpus_resume] uninterrupted: {uninterrupted:.1f} s", file=sys.stderr, flush=True)
    moments = random.Random(args.seed)
    spent, stops, finished_early = 0.0, [], 0
    for kill in range(args.kills):
        how = signal.SIGKILL if kill % 2 == 0 else signal.SIGTERM
        delay = moments.uniform(0.5, args.max_delay or 4 * uninterrupted / args.kills)
        began = time.monotonic()
        process = start(args.command, stopped)
        try:
            process.wait(timeout=delay)
            finished_early += 1  # it ended before the stop: the output is whole
            spent += time.monotonic() - began
            break
        except subprocess.TimeoutExpired:
            process.send_signal(how)
        process.communicate()
        spent += time.monotonic() - began
        parts = stopped.with_name(stopped.name + ".parts")
        done = len(list(parts.glob("chunk-*"))) if parts.exists() else 0
        stops.append((signal.Signals(how).name, round(delay, 2), process.returncode, done))
        print(f"[corpus_resume] stop {kill + 1}/{args.kills}: {signal.Signals(how).name} after {delay:.1f} s "
              f"(exit {process.returncode}; {done} chunks done)", file=sys.stderr, flush=True)
    began = time.monotonic()
    if not stopped.exists():
        process = start(args.command, stopped)
        error = process.communicate()[1]
        if process.returncode != 0:
            raise SystemExit(f"corpus_resume: the last run failed:\n{error[-2000:]}")
    spent += time.monotonic() - began
    expected, found = whole.read_text().split("\n"), stopped.read_text().split("\n")
    differing = sum(a != b for a, b in zip(expected, found)) + abs(len(expected) - len(found))
    print(f"stops: {len(stops)} ({sum(s[0] == 'SIGKILL' for s in stops)} SIGKILL, "
          f"{sum(s[0] == 'SIGTERM' for s in stops)} SIGTERM){' and the run ended before a stop' if finished_early else ''}")
    print(f"output lines: {len(found) - 1} of {len(expected) - 1}; lines that differ, missing or extra: "
          f"{differing}; byte for byte the same: {whole.read_bytes() == stopped.read_bytes()}")
    print(f"wall time: uninterrupted {uninterrupted:.1f} s, stopped {len(stops)} times and finished "
          f"{spent:.1f} s: {spent - uninterrupted:.1f} s lost, {(spent - uninterrupted) / max(len(stops), 1):.1f} s "
          f"a stop")
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
