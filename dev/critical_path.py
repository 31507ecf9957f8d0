#!/usr/bin/env python3
"""Where a CUDA graph's time goes, from a dev/kernel_trace.cpp CSV.

Kernels of one graph launch run in stream order, and with programmatic
dependent launch a kernel starts before the one before it ends, so a kernel's
own duration says little. What it adds to the step is how much later it ends
than the kernel before it: end_i - end_(i-1). This sums that per kernel name
over the launches of each graph of 50 kernels or more (a decode step), per
kernel name and the kernel before it (so a layer's GEMVs come apart), and
prints the mean per launch and per occurrence, the largest first.

    python3 dev/critical_path.py trace.csv [graph launches to skip, default 3]
"""
import collections
import csv
import re
import sys


def short(name):
    """the kernel's name without namespaces and template arguments' namespaces"""
    return re.sub(r"\w+_detail::", "", name.replace("void ", ""))[:60]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    by_graph = collections.defaultdict(list)
    with open(sys.argv[1]) as f:
        for r in csv.DictReader(f):
            if r["graph"] != "0":
                by_graph[r["graph"]].append((int(r["start_ns"]), int(r["end_ns"]), r["name"]))
    if not by_graph:
        sys.exit("no kernels of a CUDA graph in " + sys.argv[1])
    for graph, kernels in sorted(by_graph.items(), key=lambda g: -len(g[1])):
        if len(kernels) < 50:
            continue
        kernels.sort()
        # a launch starts where the first kernel's name comes round again after a gap of 5 us
        first = kernels[0][2]
        launches, cur = [], []
        for k in kernels:
            if cur and k[2] == first and k[0] - cur[-1][1] > 5000:
                launches.append(cur)
                cur = []
            cur.append(k)
        launches.append(cur)
        used = launches[skip:] if len(launches) > skip else launches
        path = collections.defaultdict(float)
        count = collections.Counter()
        step = 0.0
        for run in used:
            step += (max(k[1] for k in run) - run[0][0]) / 1e3
            prev_end, prev = run[0][0], "start"
            for start, end, name in run:
                key = f"{short(name)} (after {short(prev)})"
                path[key] += max(0, end - prev_end) / 1e3
                count[key] += 1
                prev_end, prev = max(prev_end, end), name
        n = len(used)
        print(f"graph {graph}: {len(kernels)} kernels, {len(launches)} launches, mean of {n}: "
              f"{step / n:.1f} us per launch ({len(used[0])} kernels)")
        print(f"{'us/launch':>10} {'us each':>8} {'count':>6}  kernel")
        for name, us in sorted(path.items(), key=lambda p: -p[1]):
            print(f"{us / n:10.1f} {us / count[name]:8.2f} {count[name] // n:6d}  {name}")


if __name__ == "__main__":
    main()
