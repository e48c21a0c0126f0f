#!/usr/bin/env python3
"""Summary of an ncu source-page export per SASS instruction (`ncu --import R.ncu-rep --page source --csv
--print-source sass`, as scripts/gpu-ncu-kernel writes it): executed warp instructions and stall samples by opcode,
stall samples by reason, and with --ranges, by address range (the last 5 hex digits of the addresses; e.g. the parts
of a kernel's main loop found in --hot's listing).

usage: ncu-sass-summary.py SASS.csv [--per N] [--hot MIN] [--ranges NAME=LO-HI,...]
  --per N     also print counts divided by N (e.g. the warp-tiles a launch runs: instructions a tile)
  --hot MIN   list every instruction executed at least MIN times (address, count, stall samples, SASS)
"""
import argparse
import collections
import csv
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--per", type=float, default=0)
    ap.add_argument("--hot", type=int, default=0)
    ap.add_argument("--ranges", default="")
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr = rows[start]
    ix = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    ops, op_samples, stalls = collections.Counter(), collections.Counter(), collections.Counter()
    total = samples = 0
    listing = []
    for r in rows[start + 1:]:
        if len(r) < len(hdr):
            continue
        src = r[ix["Source"]].strip()
        ex = int(r[ix["Instructions Executed"]] or 0)
        s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        words = src.split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0] if words else "")
        op = op.split(".")[0]
        ops[op] += ex
        op_samples[op] += s
        total += ex
        samples += s
        for c in stall_cols:
            stalls[c] += int(r[ix[c]] or 0)
        listing.append((int(r[ix["Address"]], 16) & 0xFFFFF, src, ex, s))
    per = f", {total / a.per:.1f} per unit" if a.per else ""
    print(f"executed warp instructions {total:,}{per}; stall samples {samples:,}")
    for op, n in ops.most_common(25):
        print(f"  {op:10s} {n:14,d} {100 * n / max(total, 1):5.1f}%   samples {100 * op_samples[op] / max(samples, 1):5.1f}%")
    print("stall reasons (share of samples):")
    for c, n in stalls.most_common(12):
        print(f"  {c:24s} {100 * n / max(samples, 1):5.1f}%")
    if a.ranges:
        print("by address range:")
        for spec in a.ranges.split(","):
            name, span = spec.split("=")
            lo, hi = (int(x, 16) for x in span.split("-"))
            ex = sum(e for ad, _, e, _ in listing if lo <= ad < hi)
            s = sum(v for ad, _, _, v in listing if lo <= ad < hi)
            unit = f" {ex / a.per:8.1f} per unit" if a.per else ""
            print(f"  {name:20s} {ex:14,d}{unit} {100 * ex / max(total, 1):5.1f}%   samples {100 * s / max(samples, 1):5.1f}%")
    if a.hot:
        for ad, src, ex, s in listing:
            if ex >= a.hot:
                print(f"{ad:05x} {ex:10d} {s:6d}  {src}")


if __name__ == "__main__":
    sys.exit(main())
