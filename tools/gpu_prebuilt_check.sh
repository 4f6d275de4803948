#!/usr/bin/env bash
# A prebuilt extension (forward and backward kernels) on an H100/H200, against a base build, in
# one run: smoke calls, the sm90 GPU tests, the speed of both builds side by side.
#
#   OUT=/some/dir LIB=build/ab/new/lib BASE=build/ab/base/lib bash tools/gpu_prebuilt_check.sh
#
# LIB and BASE hold a built transformer_engine_exact_fp8 (python -m build_tools.cmake_build ...
# --install-dir DIR, for the GPU machine's Python), LIB with this checkout's exact_fp8 package
# beside it (`git archive HEAD transformer_engine/pytorch/... | tar -x -C LIB`). Steps (STEPS,
# default "smoke fwd_tests bwd_tests ab masks"), each under a time limit:
#   smoke      tools/gpu_sm90_check.sh's and tools/gpu_sm90_bwd_check.sh's smoke calls on LIB (a
#              hang is reported, not waited on);
#   fwd_tests  tests/pytorch/attention/test_exact_fp8_attention_sm90.py on LIB (FWD_K selects);
#   bwd_tests  tests/pytorch/attention/test_exact_fp8_backward_sm90.py on LIB (BWD_K selects);
#   ab         benchmarks/attention/ab_sm90_builds.py and ab_backward_builds.py, BASE against LIB
#              (ROUNDS, default 2);
#   masks      benchmarks/attention/bench_masks_sm90.py on LIB.
# Logs: $OUT/log.txt and one file per step; the summary is printed last.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-smoke fwd_tests bwd_tests ab masks}
LIB=$(cd "${LIB:?LIB: the build folder}" && pwd)
source "$ROOT/tools/gpu_common.sh"
start_run
gpu_environment
rc=0
summary=()
note() { summary+=("$1"); log "$1"; }

on_lib() { PYTHONPATH=$LIB:$ROOT "$@"; }

pytest_step() {  # name, time limit, test file, -k expression
  local name=$1 limit=$2 file=$3 expr=$4
  on_lib timeout -s INT "$limit" python3 -m pytest -q -p no:cacheprovider --tb=line -rf \
    ${expr:+-k "$expr"} "$file" > "$OUT/$name.log" 2>&1
  local status=$?
  note "$name: $(tail -n 1 "$OUT/$name.log") (exit $status)"
  [ "$status" -eq 0 ] || rc=1
}

if has_step smoke; then
  mkdir -p build/exact_fp8_sm90 && rm -rf build/exact_fp8_sm90/lib && cp -r "$LIB" build/exact_fp8_sm90/lib
  STEPS=smoke OUT=$OUT/smoke_fwd bash tools/gpu_sm90_check.sh > /dev/null 2>&1
  note "forward smoke: exit $? ($(grep -c . "$OUT/smoke_fwd/smoke.log") lines, smoke_fwd/smoke.log)"
  STEPS=smoke OUT=$OUT/smoke_bwd LIB=$LIB bash tools/gpu_sm90_bwd_check.sh > /dev/null 2>&1
  note "backward smoke: exit $? (smoke_bwd/log.txt)"
fi
if has_step fwd_tests; then
  pytest_step fwd_tests "${FWD_TIMEOUT:-360}" tests/pytorch/attention/test_exact_fp8_attention_sm90.py "${FWD_K:-}"
fi
if has_step bwd_tests; then
  pytest_step bwd_tests "${BWD_TIMEOUT:-300}" tests/pytorch/attention/test_exact_fp8_backward_sm90.py "${BWD_K:-}"
fi
if has_step ab; then
  BASE=$(cd "${BASE:?BASE: the base build folder}" && pwd)
  timeout 300 python3 benchmarks/attention/ab_sm90_builds.py --out "$OUT" --lib "base=$BASE" \
    --lib "new=$LIB" --rounds "${ROUNDS:-2}" --entries "cuda kernel,cuda" >> "$LOG" 2>&1 || rc=1
  timeout 300 python3 benchmarks/attention/ab_backward_builds.py --out "$OUT" --lib "base=$BASE" \
    --lib "new=$LIB" --rounds "${ROUNDS:-2}" >> "$LOG" 2>&1 || rc=1
fi
if has_step masks; then
  on_lib timeout 240 python3 benchmarks/attention/bench_masks_sm90.py --out "$OUT" \
    --rounds "${ROUNDS:-2}" >> "$LOG" 2>&1 || rc=1
fi

echo "== summary"
printf '%s\n' "${summary[@]}"
for f in "$OUT"/fwd_tests.log "$OUT"/bwd_tests.log; do
  [ -f "$f" ] && grep -E "^FAILED" "$f" | head -n 20
done
for f in "$OUT"/smoke_fwd/smoke.log; do [ -f "$f" ] && tail -n 6 "$f"; done
[ -f "$OUT/smoke_bwd/log.txt" ] && grep -E "smoke|ms" "$OUT/smoke_bwd/log.txt" | tail -n 6
for t in ab_sm90.md ab_backward.md masks_sm90.md; do [ -f "$OUT/$t" ] && cat "$OUT/$t"; done
exit $rc
