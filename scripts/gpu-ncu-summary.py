#!/usr/bin/env python3
"""Summarises an `ncu --csv --metrics gpu__time_duration.sum` log: time per kernel name over the given number of
decode steps (the profile of one step that docs/BENCHMARKS.md shows). usage: gpu-ncu-summary.py LOG STEPS|auto; auto
counts the steps as the token embeddings (the first launch of a step) and leaves out every launch before the first
one (the depth fill, one-off set-up)."""
import csv
import sys
from collections import defaultdict

path, steps_arg = sys.argv[1], sys.argv[2]
total = defaultdict(float)
count = defaultdict(int)
with open(path, newline="") as f:
    lines = [l for l in f if l.startswith('"')]
started = sys.argv[2] != "auto"
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = row["Kernel Name"].split("(")[0]
    started = started or name.startswith("kvant_embed_")
    if not started:
        continue
    value = float(row["Metric Value"].replace(",", ""))
    unit = row.get("Metric Unit", "nsecond")
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
    total[name] += value * scale
    count[name] += 1
if steps_arg == "auto":
    steps = sum(n for name, n in count.items() if name.startswith("kvant_embed_"))
    if steps == 0:
        sys.exit(f"{path}: no kvant_embed_ launch, so no decode step to count")
else:
    steps = int(steps_arg)
grand = sum(total.values()) / steps
print(f"| kernel | launches per step | µs per step | share |")
print(f"| --- | ---: | ---: | ---: |")
for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"| {name} | {count[name] / steps:.0f} | {us / steps:.1f} | {100 * us / steps / grand:.1f}% |")
print(f"| total | {sum(count.values()) / steps:.0f} | {grand:.1f} | |")
