#!/usr/bin/env python3
"""Paired comparison of two perplexity runs over the same chunks of the same text.

Usage: scripts/ppl-paired.py A.txt B.txt

Each file holds the JSON of `kvant perplexity --json --chunk-nll` (saved as it prints it: a line "{...}", paired with
the other file's), or lines "CONFIG<TAB>{json}" as scripts/gpu-perplexity prints them, paired by CONFIG. A file with
neither is an error. For each pair it prints B's
perplexity against A's, exp(mean over chunks of (nll_B - nll_A)) - 1 (every chunk scores the same number of
tokens, so this is exactly ppl_B / ppl_A - 1), and the 95% interval of that difference from the spread of the
per-chunk differences (Student's t(n - 1) standard errors of their mean). Chunk to chunk, the two runs see the same tokens, so
this interval is far narrower than either perplexity's own error: a difference outside it is systematic, one
inside it is what the chunks' sampling allows.
"""
import json
import math
import sys


def read(path):
    runs = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.lstrip().startswith("{"):
                config, rest = "run", line.strip()   # kvant perplexity --json's own line
            elif "\t" in line:
                config, _, rest = line.partition("\t")
                rest = rest.strip()
                if not rest.startswith("{"):
                    continue
            else:
                continue
            runs[config.strip()] = json.loads(rest)
    if not runs:
        sys.exit(f"{path}: no perplexity JSON (kvant perplexity --json --chunk-nll) and no CONFIG<TAB>JSON lines")
    return runs


# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom: the interval of a mean of n paired
# differences is t(n - 1)·sd/sqrt(n); 1.96 (the normal's) is too narrow for few chunks (6.5x at 2, 8% at 16).
T975 = [float("nan"), 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


def t975(df):
    if df < len(T975):
        return T975[df]
    # beyond 30 degrees of freedom: the normal quantile with the first term of the expansion in 1/df
    return 1.959964 + 2.372 / df


def fmt(ppl):
    return "NaN" if ppl is None else f"{ppl:.4f}"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = read(sys.argv[1]), read(sys.argv[2])
    print("| config | A | B | B vs A | 95% interval | chunks |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for config, ra in a.items():
        rb = b.get(config)
        if rb is None:
            continue
        ca, cb = ra.get("chunk_nll"), rb.get("chunk_nll")
        if not ca or not cb or len(ca) != len(cb) or ra["ctx"] != rb["ctx"]:
            print(f"| {config} | {fmt(ra['ppl'])} | {fmt(rb['ppl'])} | (no paired chunks) | | |")
            continue
        n = len(ca)
        if any(v is None or v != v for v in ca + cb):   # a NaN chunk (written as null)
            print(f"| {config} | {fmt(ra['ppl'])} | {fmt(rb['ppl'])} | (a chunk's NLL is not a number) | | {n} |")
            continue
        d = [y - x for x, y in zip(ca, cb)]
        mean = sum(d) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1)) if n > 1 else float("nan")
        half = t975(n - 1) * sd / math.sqrt(n)
        lo, hi = math.expm1(mean - half) * 100, math.expm1(mean + half) * 100
        print(f"| {config} | {ra['ppl']:.4f} | {rb['ppl']:.4f} | {math.expm1(mean) * 100:+.3f}% "
              f"| {lo:+.3f}% .. {hi:+.3f}% | {n} |")


if __name__ == "__main__":
    main()
