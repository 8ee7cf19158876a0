"""Benchmark results as JSON and Markdown: the rows of a side-by-side run
(``report``, ``markdown_table``) and the one writer every script uses
(``write_outputs``)."""

import sys
from typing import Optional

from .profiling import decoder_attention_shares, free_limit
from .provenance import write_json
from .timing import median


def write_outputs(result, markdown: str, json_path: Optional[str] = None,
                  markdown_path: Optional[str] = None, echo: bool = True):
    """The table on stdout (``echo``), the result as JSON (with its
    provenance) and the table as Markdown where paths are given."""
    if echo:
        print(markdown)
    if json_path:
        write_json(json_path, result)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(markdown + "\n")
    sys.stdout.flush()


def report(decode_timings, train_timings, baseline, param_counts, settings, shares=None):
    rows = []
    limit = core_limit = None
    if shares and decode_timings:
        # the baseline's speed if its decoder attention cost nothing, and if
        # all of it but the projections did (the most a mechanism keeping them can gain)
        base = decode_timings[baseline]
        base_rate = base.rate(base.sentences, median)
        decoder_share, core_share = decoder_attention_shares(shares[baseline])
        limit, core_limit = free_limit(base_rate, decoder_share), free_limit(base_rate, core_share)
    base_decode = median(decode_timings[baseline].seconds) if decode_timings else None
    base_train = median(train_timings[baseline].seconds) if train_timings else None
    for name in param_counts:
        row = {"model": name, "params": param_counts[name]}
        if decode_timings:
            t = decode_timings[name]
            row.update(t.summary(t.sentences, "sentences_per_s"))
            row.update(t.summary(t.tokens, "tokens_per_s"))
            row["generated_tokens"] = t.tokens
            row["decode_speedup"] = round(base_decode / median(t.seconds), 3)
            if limit and name in shares:  # (peers are not profiled)
                rate = t.rate(t.sentences, median)
                row["attention_share"] = {k: round(v, 4) for k, v in shares[name].items()}
                row["pct_of_attention_free_limit"] = round(100 * rate / limit, 1)
                row["pct_of_core_free_limit"] = round(100 * rate / core_limit, 1)
        if train_timings and name in train_timings:  # (peers decode only)
            t = train_timings[name]
            row.update(t.summary(t.tokens, "train_target_tokens_per_s"))
            row["train_speed_ratio"] = round(base_train / median(t.seconds), 3)
        rows.append(row)
    result = {"settings": settings, "baseline": baseline, "results": rows}
    if limit:
        result["attention_free_limit_sentences_per_s"] = round(limit, 2)
        result["core_free_limit_sentences_per_s"] = round(core_limit, 2)
    return result


def markdown_table(result):
    rows = result["results"]
    has_decode = "sentences_per_s_median" in rows[0]
    has_train = "train_target_tokens_per_s_median" in rows[0]
    header = ["model", "params"]
    if has_decode:
        header += ["sent/s (median [min, max])", "tok/s (median)", "decode speed vs " + result["baseline"]]
    has_share = "attention_share" in rows[0]
    if has_share:
        header += ["attention share of decoding", "% of attention-free limit", "% of core-free limit"]
    if has_train:
        header += ["train tgt tok/s (median)", "train speed vs " + result["baseline"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["model"], f"{r['params']:,}"]
        if has_decode:
            cells += [
                f"{r['sentences_per_s_median']:.1f} [{r['sentences_per_s_min']:.1f}, {r['sentences_per_s_max']:.1f}]",
                f"{r['tokens_per_s_median']:.0f}",
                f"{r['decode_speedup']:.2f}x",
            ]
        if has_share:
            cells += [", ".join(f"{k.replace('-attention', '')} {100 * v:.0f}%"
                                for k, v in r["attention_share"].items()),
                      f"{r['pct_of_attention_free_limit']:.0f}%",
                      f"{r['pct_of_core_free_limit']:.0f}%"] if "attention_share" in r else ["—", "—", "—"]
        if has_train:
            cells += [f"{r['train_target_tokens_per_s_median']:.0f}", f"{r['train_speed_ratio']:.2f}x"] \
                if "train_speed_ratio" in r else ["—", "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [caption(result["settings"])])


def caption(settings) -> str:
    """The machine and the cores a table was measured on, under it."""
    where = settings.get("device_name") or settings.get("device", "")
    if settings.get("device", "cpu") != "cpu":
        return f"\n{where}."
    threads = settings.get("threads", 1)
    how = (f"{threads} threads, each system in a process of its own" if threads > 1
           else "one thread, side by side in one process")
    workers = settings.get("workers")
    if workers is not None:
        how += f", the plugin's models with --decoding-workers {workers}"
    return f"\n{where}, {how}."
