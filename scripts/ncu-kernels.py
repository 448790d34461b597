#!/usr/bin/env python3
"""Per-kernel device time from an ncu run's CSV (`ncu --metrics gpu__time_duration.sum --csv --print-units
base ...`, the program's own output mixed in): launches, total µs and share of the run per kernel, the
largest first, then the families the docs name (convolutions, norms, slots, the rest).

    python3 scripts/ncu-kernels.py LOG [--top N]

With --banks, the shared-memory loads of two runs taken with
`--metrics gpu__time_duration.sum,smsp__inst_executed_op_shared_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum`
(the square tensor-core kernels with spaced tiles, then packed: ESPER_CUDA_TC_SPACED=0): a row per kernel
and side with its launches, µs, warp-level shared load instructions, wavefronts, and wavefronts per
instruction. These count every shared load of a kernel (the K loop's, and also the landing's 16-byte
reads of the cp.async buffer, at least four wavefronts each, the row offsets, the epilogue's sums), so a
conflict-free kernel reads a little above 1.0; the kernel emulator counts the K loops' alone.

    python3 scripts/ncu-kernels.py --banks SPACED_LOG PACKED_LOG
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
TIME = "gpu__time_duration.sum"
SHARED_LOADS = "smsp__inst_executed_op_shared_ld.sum"
SHARED_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"


def family(kernel):
    for name, test in FAMILIES:
        if test(kernel):
            return name
    return "the rest"


def read_metrics(path):
    """(launch ID, kernel, metric, value) for every metric row of the log's CSV lines; times in ns."""
    rows = []
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    header = None
    for row in csv.reader(lines):
        if header is None or row[:2] == ["ID", "Process ID"]:
            header = {name: i for i, name in enumerate(row)}
            continue
        try:
            metric = row[header["Metric Name"]]
            kernel = row[header["Kernel Name"]].split("(")[0].strip()
            value = float(row[header["Metric Value"]].replace(",", ""))
            launch = row[header["ID"]]
        except (KeyError, IndexError, ValueError):
            continue
        if metric == TIME:
            unit = row[header["Metric Unit"]] if "Metric Unit" in header else "nsecond"
            value *= NS_PER.get(unit, 1.0)
        rows.append((launch, kernel, metric, value))
    return rows


def read(path):
    """(kernel, ns) for every gpu__time_duration.sum row of the log's CSV lines."""
    return [(kernel, value) for _, kernel, metric, value in read_metrics(path) if metric == TIME]


def banks(spaced_path, packed_path):
    """The --banks table."""
    sides = []
    for label, path in (("spaced", spaced_path), ("packed", packed_path)):
        per_kernel = defaultdict(lambda: defaultdict(float))
        launches = defaultdict(set)
        for launch, kernel, metric, value in read_metrics(path):
            per_kernel[kernel][metric] += value
            launches[kernel].add(launch)
        sides.append((label, per_kernel, launches))
    names = sorted({kernel for _, per_kernel, _ in sides for kernel in per_kernel})
    if not names:
        print("no metric rows in either log", file=sys.stderr)
        return 1
    print(f"{'kernel':42s} {'side':6s} {'launches':>8s} {'µs':>9s} {'shared loads':>13s} {'wavefronts':>12s} {'per load':>8s}")
    for kernel in names:
        for label, per_kernel, launches in sides:
            if kernel not in per_kernel:
                continue
            m = per_kernel[kernel]
            loads, wavefronts = m[SHARED_LOADS], m[SHARED_WAVEFRONTS]
            per = wavefronts / loads if loads else float("nan")
            print(f"{kernel:42s} {label:6s} {len(launches[kernel]):8d} {m[TIME] / 1e3:9.1f} {loads:13.0f} "
                  f"{wavefronts:12.0f} {per:8.2f}")
    return 0


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if sys.argv[1] == "--banks":
        if len(sys.argv) != 4:
            print(__doc__.strip(), file=sys.stderr)
            return 2
        return banks(sys.argv[2], sys.argv[3])
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
