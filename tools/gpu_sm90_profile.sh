#!/usr/bin/env bash
# Profile and memory-check the sm_90a attention forward on an H100/H200 machine (no upstream TE
# needed), from the repository root:
#
#   OUT=/some/dir bash tools/gpu_sm90_profile.sh
#
# 1. build: the extension into build/exact_fp8_sm90/lib (tools/gpu_sm90_check.sh's build);
# 2. profile: Nsight Compute on one launch of the kernel at b = 2, h = 16, s = 8k, causal
#    (benchmarks/attention/profile_sm90.py; clocks left alone), the full section set with
#    per-instruction samples: $OUT/sm90_8k.ncu-rep, the details page ($OUT/ncu_details.txt),
#    the SASS with its stall samples ($OUT/ncu_source.csv) and their summary
#    (benchmarks/attention/ncu_summary.py: $OUT/ncu_summary.md);
# 3. sanitize: compute-sanitizer memcheck, racecheck and synccheck over the small shapes of
#    profile_sm90.py --small ($OUT/sanitizer_*.txt), the forward's persistent grid capped at
#    NVTE_EXACT_FP8_SM90_FWD_MAX_CTAS (default 2) CTAs so that each walks many query tiles.
# STEPS (default "build profile sanitize") selects steps. A short summary is printed last.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-build profile sanitize}
SHAPE=${SHAPE:-2,16,16,8192}
mkdir -p "$OUT"
cd "$ROOT"
export PYTHONPATH=$ROOT/build/exact_fp8_sm90/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}
SUMMARY=$OUT/profile_summary.txt
LOG=$SUMMARY
source "$ROOT/tools/gpu_common.sh"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | tail -n 1)
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null |
  tail -n 1)

if has_step build; then
  STEPS=build OUT=$OUT/build bash tools/gpu_sm90_check.sh > /dev/null 2>&1
  note "build: exit $?"
fi

if has_step profile; then
  if [ -z "$NCU" ]; then
    note "profile: no ncu on this machine"
  else
    timeout 300 "$NCU" --clock-control none --set full --import-source no \
      -k regex:attention_fwd --launch-skip 3 --launch-count 1 -f -o "$OUT/sm90_8k" \
      python3 benchmarks/attention/profile_sm90.py --shape "$SHAPE" > "$OUT/ncu.log" 2>&1
    note "profile: exit $? ($NCU)"
    "$NCU" -i "$OUT/sm90_8k.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
    "$NCU" -i "$OUT/sm90_8k.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/ncu_source.csv" 2>&1
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Registers Per|Achieved Occupancy" \
      "$OUT/ncu_details.txt" | head -n 20 | tee -a "$SUMMARY"
    # per consumer warp and KV tile visited (causal: b h n (n + 1) / 2 visits, n query tiles)
    per=$(python3 -c "b, h, _, s = map(int, '$SHAPE'.split(',')); n = -(-s // 128); \
print(8 * b * h * n * (n + 1) // 2)")
    python3 benchmarks/attention/ncu_summary.py "$OUT/ncu_source.csv" --per "$per" \
      > "$OUT/ncu_summary.md" 2>&1
    note "stall reasons and instructions per consumer warp and KV tile: $OUT/ncu_summary.md"
  fi
fi

if has_step sanitize; then
  if [ -z "$SANITIZER" ]; then
    note "sanitize: no compute-sanitizer on this machine"
  else
    for tool in memcheck racecheck synccheck; do
      NVTE_EXACT_FP8_SM90_FWD_MAX_CTAS=${NVTE_EXACT_FP8_SM90_FWD_MAX_CTAS:-2} \
        timeout 240 "$SANITIZER" --tool "$tool" --kernel-name kns=attention_fwd \
        python3 benchmarks/attention/profile_sm90.py --small > "$OUT/sanitizer_$tool.txt" 2>&1
      note "sanitize $tool: exit $?; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" \
        "$OUT/sanitizer_$tool.txt" | tail -n 2 | tr '\n' ' ')"
    done
  fi
fi
echo "== summary"
cat "$SUMMARY"
