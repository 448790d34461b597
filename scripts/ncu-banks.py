#!/usr/bin/env python3
"""The square tensor-core kernels' shared-memory loads as ncu counts them, beside the kernel emulator's
count (docs/gpu.md, ESPER_CUDA_TC_SPACED): from ncu CSV logs taken with

    --metrics gpu__time_duration.sum,smsp__inst_executed_op_shared_ld.sum,
              l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,
              l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum --csv --print-units base

one log per side (spaced tiles, packed), a row per kernel and side: launches, µs, warp-level shared
load instructions, wavefronts and wavefronts per instruction. These count every shared load of the
kernel (the K loop's, and also the landing's 16-byte reads of the cp.async buffer, at least four
wavefronts each, the row offsets and the epilogue's sums), so a conflict-free kernel reads a little
above 1.0; the emulator counts the K loops' alone.

    python3 scripts/ncu-banks.py SPACED.csv PACKED.csv
"""
import csv
import sys
from collections import defaultdict

METRICS = {
    "gpu__time_duration.sum": "ns",
    "smsp__inst_executed_op_shared_ld.sum": "loads",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "wavefronts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "conflicts",
}
NS_PER = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}


def read(path):
    """{kernel: {"launches": n, metric short name: sum}} from the CSV lines of an ncu log."""
    kernels = defaultdict(lambda: defaultdict(float))
    launches = defaultdict(set)
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    header = None
    for row in csv.reader(lines):
        if header is None or row[:2] == ["ID", "Process ID"]:
            header = {name: i for i, name in enumerate(row)}
            continue
        try:
            short = METRICS.get(row[header["Metric Name"]])
            if short is None:
                continue
            kernel = row[header["Kernel Name"]].split("(")[0].strip()
            value = float(row[header["Metric Value"]].replace(",", ""))
            launch = row[header["ID"]]
        except (KeyError, IndexError, ValueError):
            continue
        if short == "ns":
            value *= NS_PER.get(row[header["Metric Unit"]] if "Metric Unit" in header else "ns", 1.0)
        kernels[kernel][short] += value
        launches[kernel].add(launch)
    for kernel, ids in launches.items():
        kernels[kernel]["launches"] = len(ids)
    return kernels


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    sides = [("spaced", read(sys.argv[1])), ("packed", read(sys.argv[2]))]
    names = sorted({k for _, side in sides for k in side})
    if not names:
        print("no metric rows in either log", file=sys.stderr)
        return 1
    print(f"{'kernel':42s} {'side':6s} {'launches':>8s} {'µs':>9s} {'shared loads':>13s} {'wavefronts':>12s} {'per load':>8s}")
    for kernel in names:
        for label, side in sides:
            m = side.get(kernel)
            if not m:
                continue
            per = m["wavefronts"] / m["loads"] if m["loads"] else float("nan")
            print(f"{kernel:42s} {label:6s} {int(m['launches']):8d} {m['ns'] / 1e3:9.1f} {m['loads']:13.0f} "
                  f"{m['wavefronts']:12.0f} {per:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
