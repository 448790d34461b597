#!/usr/bin/env bash
# One device session's checks, in the order that teaches the most if the time runs out: the selftest
# (every kernel and composed piece against its CPU twin), then the W16 bench without and with seeds, a
# short heuristic train run (the whole step's systems on the device, copies back per step, the profile's
# device column), then the env sweep. Each step has its own time limit and writes its output under $OUT (the device
# tool brings $OUT back), so a step that hangs or fails costs only its own limit.
#
#   bash scripts/gpu-session.sh [BIN] [STEP ...]   # BIN: a cuda build (default gpu/esper-ecs); STEPs: the
#                                                  # names below (default: all, in order)
#
# The limits add up to more than one device call allows (600 s): split them over calls by naming steps,
# e.g. `selftest bench-w16-none bench-w16-seeded` first.
#
# Build here first (docs/gpu.md): `bash ../shared/tools/cuda-build.sh`, then copy
# target/release/esper-ecs into gpu/, strip it (list gpu/ in .git/info/exclude) and carry it to the device.
set -u
BIN=${1:-gpu/esper-ecs}
shift $(($# > 0 ? 1 : 0))
WANTED=" $* "
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export ESPER_KERNEL_CACHE=${ESPER_KERNEL_CACHE:-$OUT/kernel-cache}
if [ ! -x "$BIN" ]; then
    echo "no executable at $BIN: build with bash ../shared/tools/cuda-build.sh and copy it there" >&2
    exit 2
fi

step() {
    local name=$1 limit=$2
    shift 2
    if [ "$WANTED" != "  " ] && [[ "$WANTED" != *" $name "* ]]; then
        return
    fi
    echo "== $name (limit ${limit}s): $*"
    local started=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "   exit $rc after $((SECONDS - started)) s; last lines:"
    tail -n 25 "$OUT/$name.log" | sed 's/^/   | /'
}

W16=(--task cifar_baseline --batch-per-env 512 --train-batches 6 --test-per-env 625 --reps 3 --warmup 1)
nvidia-smi >"$OUT/nvidia-smi.log" 2>&1 && head -n 15 "$OUT/nvidia-smi.log"
step selftest 240 "$BIN" selftest --device cuda
step bench-w16-none 150 "$BIN" bench --device cuda --seeds none --envs 16 "${W16[@]}" --json "$OUT/bench-w16-none.json"
step bench-w16-seeded 180 "$BIN" bench --device cuda --envs 16 "${W16[@]}" --json "$OUT/bench-w16-seeded.json"
step bench-w16-seeded-bf16 150 "$BIN" bench --device cuda --envs 16 --precision bf16 "${W16[@]}" \
    --json "$OUT/bench-w16-seeded-bf16.json"
step bench-w16-seeded-tf32 150 "$BIN" bench --device cuda --envs 16 --precision tf32 "${W16[@]}" \
    --json "$OUT/bench-w16-seeded-tf32.json"
step bench-w16-none-nographs 150 "$BIN" bench --device cuda --seeds none --envs 16 --cuda-graphs off "${W16[@]}" \
    --json "$OUT/bench-w16-none-nographs.json"
step train-heuristic 180 "$BIN" train --device cuda --envs 16 --epochs 4 --policy heuristic --count-syncs \
    --profile table --out "$OUT/train-heuristic" --force --quiet
step bench-sweep-none 240 "$BIN" bench --device cuda --seeds none --envs 1,4,16,64,256 --reps 2 \
    --json "$OUT/bench-sweep-none.json"
