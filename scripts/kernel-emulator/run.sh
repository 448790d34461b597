#!/usr/bin/env bash
# Compiles the kernel emulator (shim.hpp + emulate.cpp, which include the kernels' own .cu source) with
# g++ and runs its checks: a CPU check of kernels written in a session without a GPU. Not part of CI
# (it needs g++ and takes a minute); the device's selftest stays the check that counts.
#
# EMULATOR_SANITIZE=address builds it with AddressSanitizer and UndefinedBehaviorSanitizer (a kernel's
# read or write outside its buffers or its __shared__ arrays, as compute-sanitizer's memcheck would
# report on a GPU); EMULATOR_SANITIZE=thread with ThreadSanitizer (the block's threads are real threads
# and __syncthreads a pthread barrier, so a missing barrier between a __shared__ write and another
# thread's read is a reported race, as racecheck would). Both take far longer: about 15 minutes and an
# hour on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/esper-kernel-emulator
mkdir -p "$out"
flags=(-O2)
case "${EMULATOR_SANITIZE:-}" in
    "") ;;
    address) flags=(-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined)
             export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} ;;
    thread) flags=(-O1 -g -fsanitize=thread)
            export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} ;;
    *) echo "EMULATOR_SANITIZE: address or thread, not ${EMULATOR_SANITIZE}" >&2; exit 2 ;;
esac
# EMULATOR_DEFINES: -D options for the kernels, as the NVRTC switches add them (e.g. -DTC_N16_NARROW, what
# ESPER_CUDA_TC_WIDE=0 compiles: the square n16 forwards with 8 warps).
read -r -a defines <<<"${EMULATOR_DEFINES:-}"
g++ -std=c++17 "${flags[@]}" "${defines[@]}" -ffp-contract=off -Wno-unknown-pragmas -pthread -o "$out/emulate" \
    "$here/emulate.cpp"
"$out/emulate"
