#!/usr/bin/env bash
# Compiles the kernel emulator (shim.hpp + emulate.cpp, which include the kernels' own .cu source) with
# g++ and runs its checks: a CPU check of kernels written in a session without a GPU. Not part of CI
# (it needs g++ and takes a minute); the device's selftest stays the check that counts.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/esper-kernel-emulator
mkdir -p "$out"
g++ -std=c++17 -O2 -ffp-contract=off -Wno-unknown-pragmas -pthread -o "$out/emulate" "$here/emulate.cpp"
"$out/emulate"
