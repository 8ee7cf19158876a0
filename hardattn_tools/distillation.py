"""Sequence-level knowledge distillation (Kim and Rush, 2016) for any fairseq
data-bin: its training targets replaced by a trained teacher's beam-search
translations of the training sources. The validation and test sets are kept,
so models trained on the distilled corpus are still selected and scored on
real references.

Usage: python -m hardattn_tools.distillation DATA_BIN TEACHER OUT_DIR
           [--beam 4] [--max-tokens 8000] [--workers 1]
           [-- extra fairseq-generate flags, e.g. --cpu or --fp16]

Writes OUT_DIR/train.gen (the teacher's fairseq-generate output),
OUT_DIR/text/train.SRC, train.TGT (BPE text, one sentence per line, in the
training set's order) and OUT_DIR/data-bin: the distilled training set
binarized with DATA_BIN's dictionaries, beside DATA_BIN's other subsets.
Train on OUT_DIR/data-bin as on DATA_BIN. A finished OUT_DIR is kept.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
from typing import List, Tuple

from fairseq_hardattn import USER_DIR
from .scoring import read_generate_lines


def language_pair(data_bin: str) -> Tuple[str, str]:
    """(source, target) language of ``data_bin``'s training set, from its file
    names (``train.SRC-TGT.SRC.idx``), as fairseq infers them."""
    names = sorted(glob.glob(os.path.join(data_bin, "train.*-*.*.idx")))
    if not names:
        raise ValueError(f"{data_bin}: no binarized training set (train.SRC-TGT.SRC.idx)")
    source, target = os.path.basename(names[0]).split(".")[1].split("-")
    return source, target


def distilled_pairs(generate_output: str) -> Tuple[List[str], List[str]]:
    """The sources and the teacher's best hypotheses of ``fairseq-generate``
    output (run without ``--remove-bpe``: both keep their subword units), in
    the data set's order."""
    sources = read_generate_lines(generate_output, "S")
    hypotheses = read_generate_lines(generate_output, "H")
    if len(sources) != len(hypotheses):
        raise ValueError(f"{len(sources)} sources but {len(hypotheses)} hypotheses in the "
                         "fairseq-generate output")
    return sources, hypotheses


def _run(command: List[str], stdout_path: str, log_path: str, what: str):
    """Runs ``command``; its stdout is written to ``stdout_path`` only when it
    succeeds (a cut-off run leaves no half output behind)."""
    with open(stdout_path + ".tmp", "w", encoding="utf-8") as out, \
            open(log_path, "w", encoding="utf-8") as log:
        status = subprocess.run(command, stdout=out, stderr=log).returncode
    if status != 0:
        with open(log_path, encoding="utf-8") as log:
            lines = [line.strip() for line in log if line.strip()]
        raise RuntimeError(f"{what} failed (exit {status}; {log_path}): "
                           f"{lines[-1] if lines else 'no output'}")
    os.replace(stdout_path + ".tmp", stdout_path)


def distill(data_bin: str, teacher: str, out_dir: str, beam: int, max_tokens: int,
            workers: int, generate_flags: List[str]) -> str:
    """Builds ``out_dir``/data-bin (see the module's docstring); returns its path."""
    destination = os.path.join(out_dir, "data-bin")
    if os.path.exists(os.path.join(destination, ".done")):
        print(f"distilled data ready in {destination}", file=sys.stderr)
        return destination
    source, target = language_pair(data_bin)
    if not os.path.isfile(teacher):
        raise ValueError(f"no teacher checkpoint at {teacher}")
    os.makedirs(os.path.join(out_dir, "text"), exist_ok=True)

    generated = os.path.join(out_dir, "train.gen")
    if not os.path.exists(generated):
        print(f"translating the training set with {teacher} (beam {beam}; "
              f"progress: {out_dir}/generate.log)", file=sys.stderr)
        _run(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", teacher,
              "--gen-subset", "train", "--beam", str(beam), "--nbest", "1",
              "--max-tokens", str(max_tokens), *generate_flags],
             generated, os.path.join(out_dir, "generate.log"), "fairseq-generate")
    with open(generated, encoding="utf-8") as f:
        sources, hypotheses = distilled_pairs(f.read())
    prefix = os.path.join(out_dir, "text", "train")
    for lang, lines in ((source, sources), (target, hypotheses)):
        with open(f"{prefix}.{lang}", "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)

    print(f"binarizing {len(sources)} distilled pairs", file=sys.stderr)
    if os.path.exists(destination):  # a cut-off earlier try
        shutil.rmtree(destination)
    _run(["fairseq-preprocess", "--source-lang", source, "--target-lang", target,
          "--srcdict", os.path.join(data_bin, f"dict.{source}.txt"),
          "--tgtdict", os.path.join(data_bin, f"dict.{target}.txt"),
          "--trainpref", prefix, "--destdir", destination, "--workers", str(workers)],
         os.path.join(out_dir, "preprocess.out"), os.path.join(out_dir, "preprocess.log"),
         "fairseq-preprocess")
    # the other subsets (valid, test, ...) as they are: real references
    for path in glob.glob(os.path.join(data_bin, "*.bin")) + glob.glob(os.path.join(data_bin, "*.idx")):
        if not os.path.basename(path).startswith("train."):
            shutil.copy2(path, destination)
    open(os.path.join(destination, ".done"), "w").close()
    print(f"distilled data ready in {destination}", file=sys.stderr)
    return destination


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Sequence-level distillation: a data-bin whose training targets are "
                    "a teacher's translations.",
        epilog="Arguments after -- go to fairseq-generate (e.g. --cpu, --fp16, --max-len-b 50); "
               "without a GPU it translates on the CPU.")
    parser.add_argument("data_bin", help="the binarized data (fairseq-preprocess --destdir)")
    parser.add_argument("teacher", help="the teacher's checkpoint (e.g. RUN/checkpoint_avg.pt)")
    parser.add_argument("out_dir", help="where the distilled data-bin is written")
    parser.add_argument("--beam", type=int, default=4, help="the teacher's beam (default 4)")
    parser.add_argument("--max-tokens", type=int, default=8000,
                        help="tokens per translated batch (default 8000)")
    parser.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    argv = sys.argv[1:] if argv is None else list(argv)
    generate_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.beam < 1 or args.max_tokens < 1 or args.workers < 1:
        parser.error("--beam, --max-tokens and --workers must be positive")
    try:
        distill(args.data_bin, args.teacher, args.out_dir, args.beam, args.max_tokens,
                args.workers, generate_flags)
    except (OSError, ValueError, RuntimeError) as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
