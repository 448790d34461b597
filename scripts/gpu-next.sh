#!/usr/bin/env bash
# The measurements the kernels built without a device are waiting for, in one device call of at most
# NEXT_BUDGET seconds (default 540), the most telling first; a step that would start with under 30 s
# left is skipped and says so. Needs three gzipped builds in gpu/ (carry `gpu`):
#
#   bash scripts/gpu-build.sh a=f94e9da b=d01b65e c=HEAD     # here: the last measured build, the
#                                                            # 2026-11-27 kernels, everything since
#   bash scripts/gpu-next.sh [STEP …]                        # on the device: every step, or those named
#
# Steps: c's selftest (and, should it fail, again with the new kernels' switches set back); A/B of a
# against c (W16 bare and seeded, E256 seeded, at TF32); c against itself with global loads used as soon
# as issued again (ESPER_CUDA_WG_BATCH=1 ESPER_CUDA_LOADS_AHEAD=0: the weight gradients' k-steps, the
# staging, batch norm's reductions, the element-wise passes' loads before their stores and group norm's
# residual epilogue); c against itself without cp.async (ESPER_CUDA_CP_ASYNC=0: the square tensor-core
# kernels staging between two barriers again, the staged group norms copying through registers); c
# against itself with packed tiles (ESPER_CUDA_TC_SPACED=0: the square tensor-core kernels' K loops with
# their shared loads' bank conflicts back) and ncu's count of those loads' wavefronts both ways
# (ncu-kernels.py --banks, beside the kernel emulator's count); the per-kernel device time of one bare and one seeded W16
# training batch + validation under ncu (c); c's own switches A/B'd against c — the tensor-core kernels'
# occupancy (ESPER_CUDA_TC_MIN_BLOCKS=2 ESPER_CUDA_TC_WIDE=0), batch norm's gradient on load in the
# first block (ESPER_CUDA_BN_ON_LOAD=0), then the square kernels and the staged group norm together — and b against
# c (the 2026-11-28 seed and slot fusions); a short heuristic `train` with the profile table and the
# copies per step. Everything goes to $OUT/next.txt (the summary: each step's exit, time and last
# lines) and $OUT/next.tgz (logs, JSON), rewritten after every step. The steps' names, in order:
# selftest-c (selftest-c-switched-back), ab-a-c, ab-loads-ahead, ab-cp-async, ab-spaced, ncu-banks, ncu-bare,
# ab-occupancy, ab-bn-on-load, ab-square-gn, ncu-seeded, ab-b-c, train-profile — so that a second call can
# run what the first had no time for.
set -u
OUT=${OUT:-gpu-out}
WORK=/tmp/gpu-next
BUDGET=${NEXT_BUDGET:-540}
mkdir -p "$OUT" "$WORK/logs"
: >"$OUT/next.txt"
export ESPER_KERNEL_CACHE=${ESPER_KERNEL_CACHE:-$WORK/kernel-cache}
for build in a b c; do
    [ -f "gpu/$build.gz" ] || { echo "gpu/$build.gz missing: build it with scripts/gpu-build.sh" | tee -a "$OUT/next.txt"; exit 2; }
done
gunzip -c gpu/c.gz >"$WORK/c" && chmod +x "$WORK/c"
# Which GPU and which commits, for the record.
{
    nvidia-smi -L 2>&1 | head -n 2
    for build in a b c; do echo "$build: $(cat "gpu/$build.commit" 2>/dev/null || echo '(commit unknown)')"; done
} | tee -a "$OUT/next.txt"
STARTED=$SECONDS

# run NAME LIMIT CMD…: CMD (a command or an exported function) under min(LIMIT, what the budget has
# left), its output in logs/NAME.log.
WANTED=" $* "
run() {
    local name=$1 limit=$2
    shift 2
    if [ "$WANTED" != "  " ] && [[ "$WANTED" != *" $name "* ]]; then
        return 0
    fi
    local left=$((BUDGET - (SECONDS - STARTED)))
    if [ "$left" -lt 30 ]; then
        echo "== $name skipped: ${left} s of the budget left" | tee -a "$OUT/next.txt"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (limit ${limit} s): $*" | tee -a "$OUT/next.txt"
    local began=$SECONDS
    timeout "$limit" bash -c '"$@"' "$name" "$@" >"$WORK/logs/$name.log" 2>&1
    local rc=$?
    {
        echo "   exit $rc after $((SECONDS - began)) s; last lines:"
        tail -n "${TAIL:-20}" "$WORK/logs/$name.log" | sed 's/^/   | /'
    } | tee -a "$OUT/next.txt"
    tar czf "$OUT/next.tgz" -C "$WORK" logs
    return $rc
}

NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
NCU_STEP=(--task cifar_baseline --batch-per-env 512 --train-batches 1 --test-per-env 625 --envs 16 --reps 1
    --warmup 0 --cuda-graphs off --precision tf32)
# ncu's CSV, then its per-kernel table (ncu-kernels.py) as the log's last lines.
ncu_table() {
    local log=$1
    shift
    "$NCU_BIN" --metrics gpu__time_duration.sum --csv --print-units base "$@" >"$log" 2>&1
    local rc=$?
    python3 scripts/ncu-kernels.py "$log" --top 25
    return $rc
}
export -f ncu_table
# The square tensor-core kernels' shared loads in one seeded W16 training batch and validation: ncu's
# instructions and wavefronts with spaced tiles (c as built) and packed (ESPER_CUDA_TC_SPACED=0), then
# ncu-kernels.py's --banks table of both.
ncu_banks() {
    local metrics=gpu__time_duration.sum,smsp__inst_executed_op_shared_ld.sum
    metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
    local side rc=0
    for side in spaced packed; do
        env $([ $side = packed ] && echo ESPER_CUDA_TC_SPACED=0) "$NCU_BIN" --metrics "$metrics" --csv --print-units base \
            -k 'regex:^conv3x3_(wgrad_)?tc_n(8|16)_w(8|16|32)(_bnpool)?_tf32$' -c 40 "$@" >"$WORK/logs/ncu-banks-$side.csv" 2>&1 \
            || rc=$?
    done
    python3 scripts/ncu-kernels.py --banks "$WORK/logs/ncu-banks-spaced.csv" "$WORK/logs/ncu-banks-packed.csv"
    return $rc
}
export -f ncu_banks
export WORK
export NCU_BIN

# c's selftest (a's passed on an H200, 324 of 324); where it fails, again with every switch of the
# unmeasured kernels set back, to tell whether they are the cause.
if ! TAIL=30 run selftest-c 150 "$WORK/c" selftest --device cuda; then
    TAIL=30 run selftest-c-switched-back 150 env ESPER_CUDA_TC_WIDE=0 ESPER_CUDA_TC_MIN_BLOCKS=2 \
        ESPER_CUDA_WG_BATCH=1 ESPER_CUDA_LOADS_AHEAD=0 ESPER_CUDA_BN_ON_LOAD=0 ESPER_CUDA_TC_SQUARE=0 \
        ESPER_CUDA_GN_STAGED=0 ESPER_CUDA_FUSE=0 ESPER_CUDA_CP_ASYNC=0 ESPER_CUDA_TC_SPACED=0 \
        "$WORK/c" selftest --device cuda
fi
TAIL=12 run ab-a-c 200 env OUT="$WORK/logs/ab-a-c" AB_SELFTEST=0 \
    AB_CASES="w16-none-tf32 w16-seeded-tf32 e256-seeded-tf32" bash scripts/gpu-ab.sh gpu/a.gz gpu/c.gz
TAIL=8 run ab-loads-ahead 90 env OUT="$WORK/logs/ab-loads-ahead" AB_SELFTEST=0 \
    AB_CASES="w16-none-tf32 w16-seeded-tf32" A_ENV="ESPER_CUDA_WG_BATCH=1 ESPER_CUDA_LOADS_AHEAD=0" bash scripts/gpu-ab.sh gpu/c.gz gpu/c.gz
TAIL=8 run ab-cp-async 90 env OUT="$WORK/logs/ab-cp-async" AB_SELFTEST=0 \
    AB_CASES="w16-none-tf32 w16-seeded-tf32" A_ENV=ESPER_CUDA_CP_ASYNC=0 bash scripts/gpu-ab.sh gpu/c.gz gpu/c.gz
TAIL=8 run ab-spaced 90 env OUT="$WORK/logs/ab-spaced" AB_SELFTEST=0 \
    AB_CASES="w16-none-tf32 w16-seeded-tf32" A_ENV=ESPER_CUDA_TC_SPACED=0 bash scripts/gpu-ab.sh gpu/c.gz gpu/c.gz
TAIL=30 run ncu-banks 120 ncu_banks "$WORK/c" bench --device cuda "${NCU_STEP[@]}" --json "$WORK/ncu-banks.json"
TAIL=40 run ncu-bare 120 ncu_table "$WORK/logs/ncu-bare.csv" "$WORK/c" bench --device cuda --seeds none \
    "${NCU_STEP[@]}" --json "$WORK/ncu-bare.json"
TAIL=8 run ab-occupancy 90 env OUT="$WORK/logs/ab-occupancy" AB_SELFTEST=0 AB_CASES="w16-none-tf32 w16-seeded-tf32" \
    A_ENV="ESPER_CUDA_TC_MIN_BLOCKS=2 ESPER_CUDA_TC_WIDE=0" bash scripts/gpu-ab.sh gpu/c.gz gpu/c.gz
TAIL=8 run ab-bn-on-load 90 env OUT="$WORK/logs/ab-bn-on-load" AB_SELFTEST=0 AB_CASES="w16-none-tf32 w16-seeded-tf32" \
    A_ENV=ESPER_CUDA_BN_ON_LOAD=0 bash scripts/gpu-ab.sh gpu/c.gz gpu/c.gz
TAIL=8 run ab-square-gn 90 env OUT="$WORK/logs/ab-square-gn" AB_SELFTEST=0 AB_CASES="w16-none-tf32 w16-seeded-tf32" \
    A_ENV="ESPER_CUDA_TC_SQUARE=0 ESPER_CUDA_GN_STAGED=0" bash scripts/gpu-ab.sh gpu/c.gz gpu/c.gz
TAIL=40 run ncu-seeded 120 ncu_table "$WORK/logs/ncu-seeded.csv" "$WORK/c" bench --device cuda "${NCU_STEP[@]}" \
    --json "$WORK/ncu-seeded.json"
TAIL=8 run ab-b-c 90 env OUT="$WORK/logs/ab-b-c" AB_SELFTEST=0 AB_CASES="w16-seeded-tf32 e256-seeded-tf32" \
    bash scripts/gpu-ab.sh gpu/b.gz gpu/c.gz
TAIL=40 run train-profile 60 "$WORK/c" train --device cuda --envs 16 --epochs 4 --policy heuristic --count-syncs \
    --profile table
echo "== done after $((SECONDS - STARTED)) s" | tee -a "$OUT/next.txt"
exit 0
