#!/usr/bin/env bash
# A static reading of the kernels' machine code, for sessions without a GPU. For every kernel of the
# given kernels/cuda files (all of them by default), compiled as NVRTC compiles them (common.cuh
# first, sm_90, --fmad=false, C++17, the switches' defines from AUDIT_DEFINES):
#
#   regs         registers a thread (ptxas -v)
#   reg-warps    the most resident warps an SM the registers allow (64K registers, allocated per warp
#                in units of 256; 64 is the ceiling). Block sizes and shared memory can allow fewer: a
#                1 024-thread block needs at most 32 registers for two an SM, and 33 KB of smem a block
#                leaves room for six.
#   spill        bytes stored / loaded to local memory
#   smem         static shared memory a block
#   ld-after-st  how often a global load follows a global store in the SASS (LDG after STG in program
#                order). Each such load waits for that store: the compiler cannot tell a pass's output
#                from its inputs. A loop's tail or two is normal; one per element of a loop's body means
#                a thread keeps one load in flight (what LOADS_AHEAD's rewrites removed, docs/gpu.md).
#
#   bash scripts/sass-audit.sh                                   # every file
#   bash scripts/sass-audit.sh seeds.cu data.cu                  # those files
#   AUDIT_DEFINES=-DLOADS_ONE_AT_A_TIME bash scripts/sass-audit.sh   # with a switch set back
#
# Needs the CUDA 13.0 compiler in target/cuda13 (bash ../shared/tools/cuda-build.sh installs it) and
# cuobjdump (with nvdisasm, which it runs), which this installs into target/cuobjdump from the package
# registry on its first run.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
nvcc=target/cuda13/nvidia/cu13/bin/nvcc
[ -x "$nvcc" ] || { echo "sass-audit: $nvcc not found: run bash ../shared/tools/cuda-build.sh once" >&2; exit 2; }
tools=target/cuobjdump
cuobjdump=$(ls "$tools"/nvidia/cu*/bin/cuobjdump 2>/dev/null | head -n1 || true)
if [ -z "$cuobjdump" ] || [ ! -x "$(dirname "$cuobjdump")/nvdisasm" ]; then
    echo "sass-audit: installing cuobjdump and nvdisasm into $tools" >&2
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-compile \
        --upgrade --target "$tools" --only-binary=:all: "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14"
    cuobjdump=$(ls "$tools"/nvidia/cu*/bin/cuobjdump | head -n1)
fi
export PATH=$(dirname "$cuobjdump"):$PATH
files=("$@")
[ ${#files[@]} -gt 0 ] || files=($(cd kernels/cuda && ls *.cu))
for file in "${files[@]}"; do
    [ -f "kernels/cuda/${file##*/}" ] || { echo "sass-audit: kernels/cuda/${file##*/} not found" >&2; exit 2; }
done
read -r -a defines <<<"${AUDIT_DEFINES:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "%-13s %-46s %5s %9s %13s %6s %12s\n" file kernel regs reg-warps "spill st/ld" smem ld-after-st
for file in "${files[@]}"; do
    name=${file##*/}
    cat kernels/cuda/common.cuh "kernels/cuda/$name" >"$work/unit.cu"
    if ! "$nvcc" -cubin -arch=sm_90 --fmad=false -std=c++17 "${defines[@]}" -Xptxas -v "$work/unit.cu" \
        -o "$work/unit.cubin" 2>"$work/ptxas.txt"; then
        grep -v '^ptxas info' "$work/ptxas.txt" >&2
        echo "sass-audit: $name does not compile (the lines above)" >&2
        exit 1
    fi
    "$cuobjdump" -sass "$work/unit.cubin" >"$work/unit.sass"
    # ld-after-st per kernel, from the SASS.
    awk '/Function :/ { if (k != "") print k, n; k = $3; n = 0; last = "" }
         /STG/ { last = "S" }
         /LDG/ { if (last == "S") n++; last = "L" }
         END { if (k != "") print k, n }' "$work/unit.sass" >"$work/ldst.txt"
    # One line per kernel from ptxas -v, joined with its ld-after-st count.
    awk -v file="$name" '
        FNR == NR { ldst[$1] = $2; next }
        /Compiling entry function/ { match($0, /'"'"'[A-Za-z0-9_]+'"'"'/); k = substr($0, RSTART + 1, RLENGTH - 2); st = 0; ld = 0 }
        /spill stores/ { match($0, /[0-9]+ bytes spill stores/); st = substr($0, RSTART, RLENGTH) + 0
                         match($0, /[0-9]+ bytes spill loads/); ld = substr($0, RSTART, RLENGTH) + 0 }
        /Used [0-9]+ registers/ {
            match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15) + 0
            smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH) + 0
            per_warp = int((regs * 32 + 255) / 256) * 256
            warps = int(65536 / per_warp); if (warps > 64) warps = 64
            printf "%-13s %-46s %5d %9d %13s %6d %12s\n", file, k, regs, warps, st "/" ld, smem, \
                (k in ldst) ? ldst[k] : "?"
        }' "$work/ldst.txt" "$work/ptxas.txt"
done
