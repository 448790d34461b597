#!/usr/bin/env bash
# One device session's checks, in the order that teaches the most if the time runs out: the selftest
# (every kernel and composed piece against its CPU twin), the W16 bench without and with seeds, the same
# at TF32 (the 3×3 convolutions on the tensor cores, and through cuBLAS) with a short TF32 train run,
# the issue's 256-env workload, a short heuristic train run (the whole step's systems, copies back per
# step, the profile's device column), the env sweep, the direct 3×3 convolution (after its own
# selftest), the comparisons (unfused, untrimmed, im2col + SGEMM, bf16, no graphs), and the per-kernel
# device times of one W16 epoch (ncu). The selftest must pass for the rest to run.
#
#   bash scripts/gpu-session.sh [BIN] [STEP ...]   # BIN: a cuda build (default gpu/esper-ecs); STEPs: the
#                                                  # names below (default: all, in order)
#
# The default precision on a GPU is tf32: the steps without tf32 or bf16 in their name give
# --precision f32. Each step has its own time limit; together they fit one device call (600 s) with
# room to spare (the whole list took about 110 s on an H200). The device tool brings back at most 8 files from $OUT, so
# the logs go to one archive, $OUT/logs.tgz, rewritten after every step (a call cut short keeps what ran),
# and a summary of each step's last lines to $OUT/summary.txt. The kernel cache and the train run's
# output stay in /tmp.
#
# Build here first (docs/gpu.md): `bash ../shared/tools/cuda-build.sh`, then copy
# target/release/esper-ecs into gpu/, strip it (list gpu/ in .git/info/exclude) and carry it to the device.
set -u
BIN=${1:-gpu/esper-ecs}
shift $(($# > 0 ? 1 : 0))
WANTED=" $* "
OUT=${OUT:-gpu-out}
LOGS=/tmp/gpu-session/logs
mkdir -p "$OUT" "$LOGS"
export ESPER_KERNEL_CACHE=${ESPER_KERNEL_CACHE:-/tmp/gpu-session/kernel-cache}
if [ ! -x "$BIN" ]; then
    echo "no executable at $BIN: build with bash ../shared/tools/cuda-build.sh and copy it there" >&2
    exit 2
fi

step() {
    local name=$1 limit=$2
    shift 2
    if [ "$WANTED" != "  " ] && [[ "$WANTED" != *" $name "* ]]; then
        return 0
    fi
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/summary.txt"
    local started=$SECONDS
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    {
        echo "   exit $rc after $((SECONDS - started)) s; last lines:"
        tail -n 25 "$LOGS/$name.log" | sed 's/^/   | /'
    } | tee -a "$OUT/summary.txt"
    tar czf "$OUT/logs.tgz" -C "$(dirname "$LOGS")" logs
    return $rc
}

W16=(--task cifar_baseline --batch-per-env 512 --train-batches 6 --test-per-env 625 --reps 3 --warmup 1)
E256=(--task cifar_baseline --batch-per-env 64 --train-batches 3 --test-per-env 40 --reps 3 --warmup 1)
NCU=(--task cifar_baseline --batch-per-env 512 --train-batches 1 --test-per-env 625 --envs 16 --reps 1 --warmup 0
    --cuda-graphs off)
nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1 && head -n 15 "$LOGS/nvidia-smi.log"
if ! step selftest 200 "$BIN" selftest --device cuda; then
    # Which part failed, in the same call: the selftest again with the test batches padded as before.
    step selftest-untrimmed 200 env ESPER_CUDA_TRIM_TEST=0 "$BIN" selftest --device cuda
    exit 1
fi
step bench-w16-none 120 "$BIN" bench --device cuda --precision f32 --seeds none --envs 16 "${W16[@]}" --json "$LOGS/bench-w16-none.json"
step bench-w16-seeded 120 "$BIN" bench --device cuda --precision f32 --envs 16 "${W16[@]}" --json "$LOGS/bench-w16-seeded.json"
# TF32: the 3×3 convolutions on the tensor cores (conv3x3_tc_*), and through cuBLAS (ESPER_CUDA_CONV=im2col)
# as before, to compare on one machine; a short train run at TF32 (does it learn as f32 does).
step bench-w16-none-tf32 120 "$BIN" bench --device cuda --seeds none --envs 16 --precision tf32 "${W16[@]}" \
    --json "$LOGS/bench-w16-none-tf32.json"
step bench-w16-seeded-tf32 120 "$BIN" bench --device cuda --envs 16 --precision tf32 "${W16[@]}" \
    --json "$LOGS/bench-w16-seeded-tf32.json"
# The square-plane tensor-core kernels (the default) against the general ones (ESPER_CUDA_TC_SQUARE=0).
step bench-w16-none-tf32-general 120 env ESPER_CUDA_TC_SQUARE=0 "$BIN" bench --device cuda --seeds none --envs 16 \
    --precision tf32 "${W16[@]}" --json "$LOGS/bench-w16-none-tf32-general.json"
step bench-w16-seeded-tf32-general 120 env ESPER_CUDA_TC_SQUARE=0 "$BIN" bench --device cuda --envs 16 \
    --precision tf32 "${W16[@]}" --json "$LOGS/bench-w16-seeded-tf32-general.json"
# The staged group norm (the default) against the unstaged kernels (ESPER_CUDA_GN_STAGED=0).
step bench-w16-seeded-tf32-gn-unstaged 120 env ESPER_CUDA_GN_STAGED=0 "$BIN" bench --device cuda --envs 16 \
    --precision tf32 "${W16[@]}" --json "$LOGS/bench-w16-seeded-tf32-gn-unstaged.json"
step bench-w16-seeded-tf32-cublas 120 env ESPER_CUDA_CONV=im2col "$BIN" bench --device cuda --envs 16 \
    --precision tf32 "${W16[@]}" --json "$LOGS/bench-w16-seeded-tf32-cublas.json"
# TF32 with batch norm's input gradient computed as the staged backwards load it (ESPER_CUDA_BN_ON_LOAD=1)
# instead of written and read plainly (the default); and the issue's 256-env workload at TF32 (the
# default on a GPU; the steps without tf32 or bf16 in their name give --precision f32).
step bench-w16-none-tf32-bnonload 120 env ESPER_CUDA_BN_ON_LOAD=1 "$BIN" bench --device cuda --seeds none \
    --envs 16 --precision tf32 "${W16[@]}" --json "$LOGS/bench-w16-none-tf32-bnonload.json"
step bench-w16-seeded-tf32-bnonload 120 env ESPER_CUDA_BN_ON_LOAD=1 "$BIN" bench --device cuda --envs 16 \
    --precision tf32 "${W16[@]}" --json "$LOGS/bench-w16-seeded-tf32-bnonload.json"
step bench-w16-seeded-tf32-unfused 120 env ESPER_CUDA_FUSE=0 "$BIN" bench --device cuda --envs 16 --precision tf32 \
    "${W16[@]}" --json "$LOGS/bench-w16-seeded-tf32-unfused.json"
step bench-256-none-tf32 150 "$BIN" bench --device cuda --seeds none --envs 16,256 --precision tf32 "${E256[@]}" \
    --json "$LOGS/bench-256-none-tf32.json"
step bench-256-seeded-tf32 150 "$BIN" bench --device cuda --envs 16,256 --precision tf32 "${E256[@]}" \
    --json "$LOGS/bench-256-seeded-tf32.json"
step train-heuristic-default 120 "$BIN" train --device cuda --envs 16 --epochs 4 --policy heuristic --count-syncs \
    --out /tmp/gpu-session/train-heuristic-default --force
step train-heuristic-tf32 120 "$BIN" train --device cuda --envs 16 --epochs 4 --policy heuristic --precision tf32 \
    --count-syncs --out /tmp/gpu-session/train-heuristic-tf32 --force --quiet
step bench-256-none 150 "$BIN" bench --device cuda --precision f32 --seeds none --envs 16,256 "${E256[@]}" --json "$LOGS/bench-256-none.json"
step bench-256-seeded 150 "$BIN" bench --device cuda --precision f32 --envs 16,256 "${E256[@]}" --json "$LOGS/bench-256-seeded.json"
step train-heuristic 120 "$BIN" train --device cuda --precision f32 --envs 16 --epochs 4 --policy heuristic --count-syncs \
    --profile table --out /tmp/gpu-session/train-heuristic --force --quiet
step bench-sweep-none 150 "$BIN" bench --device cuda --precision f32 --seeds none --envs 1,4,16,64,256 --reps 2 \
    --json "$LOGS/bench-sweep-none.json"
# The direct 3×3 convolution (ESPER_CUDA_CONV=direct, off by default until measured): its own selftest
# (the full step's parity then runs on it too), then W16 with it; a failure skips its benches only.
DIRECT_OK=0
if step selftest-direct 200 env ESPER_CUDA_CONV=direct "$BIN" selftest --device cuda; then
    DIRECT_OK=1
    step bench-w16-none-direct 120 env ESPER_CUDA_CONV=direct "$BIN" bench --device cuda --precision f32 --seeds none --envs 16 \
        "${W16[@]}" --json "$LOGS/bench-w16-none-direct.json"
    step bench-w16-seeded-direct 120 env ESPER_CUDA_CONV=direct "$BIN" bench --device cuda --precision f32 --envs 16 "${W16[@]}" \
        --json "$LOGS/bench-w16-seeded-direct.json"
fi
# Batch norm + ReLU + pool (and their backwards) as separate kernels again, to measure the fusion; at
# TF32 also the tensor-core kernels' epilogue statistics and their backwards reading batch norm's
# gradient on load.
step bench-w16-none-unfused 120 env ESPER_CUDA_FUSE=0 "$BIN" bench --device cuda --precision f32 --seeds none --envs 16 "${W16[@]}" \
    --json "$LOGS/bench-w16-none-unfused.json"
step bench-w16-none-tf32-unfused 120 env ESPER_CUDA_FUSE=0 "$BIN" bench --device cuda --seeds none --envs 16 \
    --precision tf32 "${W16[@]}" --json "$LOGS/bench-w16-none-tf32-unfused.json"
# Every test batch padded to the training batch again (the validation's work before trimming).
step bench-w16-seeded-untrimmed 120 env ESPER_CUDA_TRIM_TEST=0 "$BIN" bench --device cuda --precision f32 --envs 16 "${W16[@]}" \
    --json "$LOGS/bench-w16-seeded-untrimmed.json"
step bench-w16-none-im2col 120 env ESPER_CUDA_CONV=im2col "$BIN" bench --device cuda --precision f32 --seeds none --envs 16 "${W16[@]}" \
    --json "$LOGS/bench-w16-none-im2col.json"
step bench-w16-seeded-im2col 120 env ESPER_CUDA_CONV=im2col "$BIN" bench --device cuda --precision f32 --envs 16 "${W16[@]}" \
    --json "$LOGS/bench-w16-seeded-im2col.json"
step bench-w16-seeded-bf16 120 "$BIN" bench --device cuda --envs 16 --precision bf16 "${W16[@]}" \
    --json "$LOGS/bench-w16-seeded-bf16.json"
step bench-w16-none-nographs 120 "$BIN" bench --device cuda --precision f32 --seeds none --envs 16 --cuda-graphs off "${W16[@]}" \
    --json "$LOGS/bench-w16-none-nographs.json"
# Device time of every kernel of one W16 step (training batch, validation), launch by launch; ncu ships
# with the toolkit on the device machine.
NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
step ncu-w16-seeded 150 "$NCU_BIN" --metrics gpu__time_duration.sum --csv --print-units base \
    "$BIN" bench --device cuda --precision f32 "${NCU[@]}" --json /tmp/gpu-session/ncu.json
step ncu-w16-seeded-tf32 150 "$NCU_BIN" --metrics gpu__time_duration.sum --csv --print-units base \
    "$BIN" bench --device cuda --precision tf32 "${NCU[@]}" --json /tmp/gpu-session/ncu-tf32.json
if [ "$DIRECT_OK" = 1 ]; then
    step ncu-w16-seeded-direct 150 env ESPER_CUDA_CONV=direct "$NCU_BIN" --metrics gpu__time_duration.sum --csv \
        --print-units base "$BIN" bench --device cuda --precision f32 "${NCU[@]}" --json /tmp/gpu-session/ncu-direct.json
fi
exit 0
