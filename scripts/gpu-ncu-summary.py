#!/usr/bin/env python3
"""Summarises an `ncu --csv --metrics gpu__time_duration.sum` log: time per kernel name over the given number of
decode steps (the profile of one step that docs/BENCHMARKS.md shows). usage: gpu-ncu-summary.py LOG STEPS"""
import csv
import sys
from collections import defaultdict

path, steps = sys.argv[1], int(sys.argv[2])
total = defaultdict(float)
count = defaultdict(int)
with open(path, newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = row["Kernel Name"].split("(")[0]
    value = float(row["Metric Value"].replace(",", ""))
    unit = row.get("Metric Unit", "nsecond")
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
    total[name] += value * scale
    count[name] += 1
grand = sum(total.values()) / steps
print(f"| kernel | launches per step | µs per step | share |")
print(f"| --- | ---: | ---: | ---: |")
for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"| {name} | {count[name] / steps:.0f} | {us / steps:.1f} | {100 * us / steps / grand:.1f}% |")
print(f"| total | {sum(count.values()) / steps:.0f} | {grand:.1f} | |")
