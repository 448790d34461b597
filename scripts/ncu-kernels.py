#!/usr/bin/env python3
"""Per-kernel device time from an ncu run's CSV (`ncu --metrics gpu__time_duration.sum --csv --print-units
base ...`, the program's own output mixed in): launches, total µs and share of the run per kernel, the
largest first, then the families the docs name (convolutions, norms, slots, the rest).

    python3 scripts/ncu-kernels.py LOG [--top N]
"""
import csv
import sys
from collections import defaultdict

FAMILIES = [
    ("3x3 tensor-core forward / input gradient", lambda k: k.startswith("conv3x3_tc_")),
    ("3x3 tensor-core weight gradient", lambda k: k.startswith("conv3x3_wgrad_tc_")),
    ("other convolutions", lambda k: k.startswith("conv") or k.startswith("im2col") or k.startswith("col2im")),
    ("batch norm", lambda k: "batch_norm" in k or k.startswith("relu_bn")),
    ("group norm", lambda k: k.startswith("group_norm")),
    ("slots (blends, splits, passthroughs)", lambda k: k.startswith("slot_")),
    ("pools", lambda k: "pool" in k),
]


NS_PER = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}


def family(kernel):
    for name, test in FAMILIES:
        if test(kernel):
            return name
    return "the rest"


def read(path):
    """(kernel, ns) for every gpu__time_duration.sum row of the log's CSV lines."""
    rows = []
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    reader = csv.reader(lines)
    header = None
    for row in reader:
        if header is None or row[:2] == ["ID", "Process ID"]:
            header = {name: i for i, name in enumerate(row)}
            continue
        try:
            if row[header["Metric Name"]] != "gpu__time_duration.sum":
                continue
            kernel = row[header["Kernel Name"]].split("(")[0].strip()
            value = float(row[header["Metric Value"]].replace(",", ""))
        except (KeyError, IndexError, ValueError):
            continue
        unit = row[header["Metric Unit"]] if "Metric Unit" in header else "nsecond"
        rows.append((kernel, value * NS_PER.get(unit, 1.0)))
    return rows


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    top = 20
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
    rows = read(sys.argv[1])
    if not rows:
        print(f"{sys.argv[1]}: no gpu__time_duration.sum rows", file=sys.stderr)
        return 1
    total = sum(ns for _, ns in rows)
    per_kernel = defaultdict(lambda: [0, 0.0])
    per_family = defaultdict(float)
    for kernel, ns in rows:
        per_kernel[kernel][0] += 1
        per_kernel[kernel][1] += ns
        per_family[family(kernel)] += ns
    print(f"{len(rows)} launches, {total / 1e6:.3f} ms of kernels (ncu: serialised, caches flushed, clocks locked)")
    print(f"{'kernel':48s} {'launches':>8s} {'µs':>10s} {'share':>7s}")
    for kernel, (count, ns) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{kernel:48s} {count:8d} {ns / 1e3:10.1f} {100 * ns / total:6.1f}%")
    print(f"{'family':48s} {'':8s} {'µs':>10s} {'share':>7s}")
    for name, ns in sorted(per_family.items(), key=lambda kv: -kv[1]):
        print(f"{name:48s} {'':8s} {ns / 1e3:10.1f} {100 * ns / total:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
