#!/usr/bin/env python3
"""The table of docs/BENCHMARKS.md's side-by-side measurements from a gpu-ab run (its run.txt): per KV format and
test, each build's t/s in every round (in round order), and the last build against the first by the means of their
rounds. usage: gpu-ab-table.py RUN.txt [BASE [OTHER]] — BASE and OTHER name builds as gpu-ab prints them ("base",
"this", a variant's name); by default the first and the last build the run names."""
import re
import sys
from collections import OrderedDict

ROUND = re.compile(r"^== (\S+) (\d+)\s*$")
# `kvant bench`'s Markdown rows: | model | backend | threads | kv | test | t/s ± sd (or median (q1 - q3)) |; not the
# GPU's fraction-of-limit rows that follow them (| kv | test | depth | t/s | limit | % |)
ROW = re.compile(r"^\|[^|]+\|[^|]+\|\s*\d+\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*([0-9.]+)\s*(?:±|\()")


def read(path):
    """{(kv, test): {build: [t/s per round]}} in the order the rows first appear, and the builds in run order."""
    values = OrderedDict()
    builds = []
    build = None
    with open(path) as f:
        for line in f:
            m = ROUND.match(line)
            if m:
                build = m.group(1)
                if build not in builds:
                    builds.append(build)
                continue
            m = ROW.match(line)
            if m and build is not None:
                key = (m.group(1), m.group(2))
                values.setdefault(key, OrderedDict()).setdefault(build, []).append(float(m.group(3)))
    return values, builds


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    values, builds = read(sys.argv[1])
    if len(builds) < 2:
        sys.exit("gpu-ab-table: fewer than two builds in " + sys.argv[1])
    base = sys.argv[2] if len(sys.argv) > 2 else builds[0]
    other = sys.argv[3] if len(sys.argv) > 3 else builds[-1]
    for b in (base, other):
        if b not in builds:
            sys.exit("gpu-ab-table: no build '%s' (the run has %s)" % (b, ", ".join(builds)))
    print("| kv | test | " + " | ".join(builds) + " | %s vs %s |" % (other, base))
    print("| --- | --- | " + " | ".join("---:" for _ in builds) + " | ---: |")
    for (kv, test), per in values.items():
        cells = [", ".join("%.2f" % v for v in per.get(b, [])) for b in builds]
        if base in per and other in per:
            a = sum(per[base]) / len(per[base])
            b = sum(per[other]) / len(per[other])
            ratio = "%+.1f%%" % (100.0 * (b / a - 1.0))
        else:
            ratio = ""
        print("| %s | %s | %s | %s |" % (kv, test, " | ".join(cells), ratio))


if __name__ == "__main__":
    main()
