#!/usr/bin/env bash
# Two cuda builds side by side on one GPU (a change's speed against the build before it, in one device
# call, as METHOD asks): each W16 workload (and E256 at TF32) is benched with A, then B, then A and B
# again, and a table of the full loop's median ms per step is printed per binary and round, with the
# device's train and validate ms. Binaries may be gzipped (two stripped builds exceed the carry limit
# unless compressed). The JSON reports go to $OUT/ab.tgz, the table to $OUT/ab.txt.
#
#   bash scripts/gpu-ab.sh A[.gz] B[.gz]
#
# A_ENV / B_ENV: environment settings for one side's runs (selftests included), so that one build can be
# measured against itself with a switch, e.g. the square tensor-core kernels against the general ones:
#   A_ENV=ESPER_CUDA_TC_SQUARE=0 bash scripts/gpu-ab.sh B.gz B.gz
#
# AB_CASES: the workloads to run, a space-separated subset of ORDER below (all by default), so that two
# comparisons fit one device call; AB_SELFTEST=0 skips the selftests (already run by the other).
set -u
OUT=${OUT:-gpu-out}
WORK=/tmp/gpu-ab
mkdir -p "$OUT" "$WORK/json"
rm -f "$WORK/json/"*  # no report of an earlier run is read as this one's
export ESPER_KERNEL_CACHE=${ESPER_KERNEL_CACHE:-$WORK/kernel-cache}
unpack() {  # $1: path, $2: name → prints the executable's path
    case $1 in
        *.gz) gunzip -c "$1" >"$WORK/$2" && chmod +x "$WORK/$2" && echo "$WORK/$2" ;;
        *) echo "$1" ;;
    esac
}
A=$(unpack "$1" a) B=$(unpack "$2" b)
A_ENV=${A_ENV:-} B_ENV=${B_ENV:-}
[ -n "$A_ENV$B_ENV" ] && echo "A: ${A_ENV:-(no settings)}; B: ${B_ENV:-(no settings)}" | tee "$OUT/ab-env.txt"
W16=(--task cifar_baseline --batch-per-env 512 --train-batches 6 --test-per-env 625 --envs 16 --reps 3 --warmup 1)
E256=(--task cifar_baseline --batch-per-env 64 --train-batches 3 --test-per-env 40 --envs 256 --reps 3 --warmup 1)
declare -A CASES=(
    [w16-none-f32]="--seeds none --precision f32 ${W16[*]}"
    [w16-seeded-f32]="--precision f32 ${W16[*]}"
    [w16-none-tf32]="--seeds none --precision tf32 ${W16[*]}"
    [w16-seeded-tf32]="--precision tf32 ${W16[*]}"
    [e256-none-tf32]="--seeds none --precision tf32 ${E256[*]}"
    [e256-seeded-tf32]="--precision tf32 ${E256[*]}"
)
ORDER=(w16-none-f32 w16-seeded-f32 w16-none-tf32 w16-seeded-tf32 e256-none-tf32 e256-seeded-tf32)
if [ -n "${AB_CASES:-}" ]; then
    read -r -a ORDER <<<"$AB_CASES"
    for case in "${ORDER[@]}"; do
        [ -n "${CASES[$case]:-}" ] || { echo "AB_CASES: no workload named $case" >&2; exit 2; }
    done
fi
: >"$OUT/ab.txt"
: >"$WORK/selftest-a.log" >"$WORK/selftest-b.log" >"$WORK/selftest-b-direct.log"
if [ "${AB_SELFTEST:-1}" != 0 ]; then
    # shellcheck disable=SC2086
    env $A_ENV "$A" selftest --device cuda >"$WORK/selftest-a.log" 2>&1; echo "selftest A: exit $? ($(tail -n 1 "$WORK/selftest-a.log"))" | tee -a "$OUT/ab.txt"
    # shellcheck disable=SC2086
    env $B_ENV "$B" selftest --device cuda >"$WORK/selftest-b.log" 2>&1; echo "selftest B: exit $? ($(tail -n 1 "$WORK/selftest-b.log"))" | tee -a "$OUT/ab.txt"
    # shellcheck disable=SC2086
    env $B_ENV ESPER_CUDA_CONV=direct "$B" selftest --device cuda >"$WORK/selftest-b-direct.log" 2>&1
    echo "selftest B, direct convolutions: exit $? ($(tail -n 1 "$WORK/selftest-b-direct.log"))" | tee -a "$OUT/ab.txt"
fi
for round in 1 2; do
    for case in "${ORDER[@]}"; do
        for side in a b; do
            bin=$A settings=$A_ENV; [ $side = b ] && bin=$B settings=$B_ENV
            # shellcheck disable=SC2086
            timeout 120 env $settings "$bin" bench --device cuda ${CASES[$case]} --json "$WORK/json/$case-$side-$round.json" \
                >"$WORK/json/$case-$side-$round.log" 2>&1 || echo "$case $side round $round: exit $?" | tee -a "$OUT/ab.txt"
        done
    done
done
python3 - "$WORK/json" "${ORDER[@]}" <<'PY' | tee -a "$OUT/ab.txt"
import json, sys, os
folder, cases = sys.argv[1], sys.argv[2:]
print(f"{'workload (full loop)':22s} {'A ms/step':>18s} {'B ms/step':>18s} {'B/A':>6s}   device train+validate ms (A | B)")
for case in cases:
    ms, dev = {}, {}
    for side in "ab":
        for r in (1, 2):
            p = os.path.join(folder, f"{case}-{side}-{r}.json")
            if not os.path.exists(p):
                continue
            t = [t for t in json.load(open(p))["tiers"] if t["tier"] == "full_loop"][-1]
            ms.setdefault(side, []).append(t["step"]["median_ms"])
            d = t.get("device") or {}
            dev.setdefault(side, []).append(f"{d.get('train_ms', 0):.1f}+{d.get('validate_ms', 0):.1f}")
    if "a" in ms and "b" in ms:
        a, b = min(ms["a"]), min(ms["b"])
        fa = "/".join(f"{v:.1f}" for v in ms["a"]); fb = "/".join(f"{v:.1f}" for v in ms["b"])
        print(f"{case:22s} {fa:>18s} {fb:>18s} {b / a:6.3f}   {' '.join(dev['a'])} | {' '.join(dev['b'])}")
PY
tar czf "$OUT/ab.tgz" -C "$WORK" json selftest-a.log selftest-b.log selftest-b-direct.log
