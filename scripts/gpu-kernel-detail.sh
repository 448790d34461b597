#!/usr/bin/env bash
# Why a kernel takes the time it does: ncu's detailed sections (speed of light, occupancy, warp stall
# reasons, memory and compute workload, the source lines the warps stall on) for the first launches of
# the kernel families that lead the per-kernel profile of one seeded W16 step (gpu-session.sh's ncu
# steps), at TF32 and launch by launch. One device call; the text reports go to $OUT/detail.tgz and
# their speed-of-light and stall lines to $OUT/detail-summary.txt.
#
#   bash scripts/gpu-kernel-detail.sh [BIN] [KERNEL-REGEX:COUNT ...]
set -u
BIN=${1:-gpu/esper-ecs}
shift $(($# > 0 ? 1 : 0))
OUT=${OUT:-gpu-out}
LOGS=/tmp/gpu-detail/logs
mkdir -p "$OUT" "$LOGS"
export ESPER_KERNEL_CACHE=${ESPER_KERNEL_CACHE:-/tmp/gpu-detail/kernel-cache}
NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
WANTED=("$@")
if [ ${#WANTED[@]} -eq 0 ]; then
    # The square-plane tensor-core kernels (the default since they were built; the general ones,
    # conv3x3_tc_n8_tf32 …, run only under ESPER_CUDA_TC_SQUARE=0), the staged group norm and the fused
    # batch norm backward's reduction.
    WANTED=("conv3x3_tc_n8_w32_tf32:2" "conv3x3_tc_n16_w(16|8)_tf32:4" "conv3x3_wgrad_tc_n8_w32_tf32:2"
        "conv3x3_wgrad_tc_n16_w(16|8)_tf32:3" "group_norm_forward_staged_f32:2" "relu_bn_backward_partial_f32:2")
fi
STEP=(bench --device cuda --task cifar_baseline --batch-per-env 512 --train-batches 1 --test-per-env 625 --envs 16
    --reps 1 --warmup 0 --cuda-graphs off)
SECTIONS=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
    --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
    --section InstructionStats --section SourceCounters)
for item in "${WANTED[@]}"; do
    name=${item%%:*} count=${item##*:}
    precision=tf32
    case $name in *_f32) [[ $name == conv2d_implicit* ]] && precision=f32 ;; esac
    echo "== $name ×$count ($precision)" | tee -a "$OUT/detail-summary.txt"
    started=$SECONDS
    file=$(printf '%s' "$name" | tr -c 'A-Za-z0-9_' '_')  # a regex's (16|8) out of the file name
    timeout 150 "$NCU_BIN" "${SECTIONS[@]}" -k "regex:^${name}\$" -c "$count" \
        "$BIN" "${STEP[@]}" --precision "$precision" --json "/tmp/gpu-detail/$file.json" >"$LOGS/$file.txt" 2>&1
    echo "   exit $? after $((SECONDS - started)) s" | tee -a "$OUT/detail-summary.txt"
    grep -E "^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|L1/TEX Hit|Bank Conflicts|Stall|OPT " \
        "$LOGS/$file.txt" | head -n 80 | sed 's/^/   | /' >>"$OUT/detail-summary.txt"
    tar czf "$OUT/detail.tgz" -C "$(dirname "$LOGS")" logs
done
exit 0
