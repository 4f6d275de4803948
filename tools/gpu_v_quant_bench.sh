#!/usr/bin/env bash
# GPU check of the V quantization kernels, from the repository root of an H100/H200 machine
# (no network needed when the pinned CUTLASS wheel is in build/artifacts, or in the folder that
# NVTE_FORK_ARTIFACTS_DIR names):
#
#   OUT=/some/dir bash tools/gpu_v_quant_bench.sh
#
# 1. build: transformer_engine_exact_fp8 for sm_90 (and the sm_90a attention kernel, which the
#    build always includes for sm_90) into build/exact_fp8_sm90/lib;
# 2. tests: tests/pytorch/attention/test_exact_fp8_quantize.py (every cast against the reference,
#    bit for bit);
# 3. bench: benchmarks/quantize/bench_v_quant.py (the V casts next to a copy of the same V, one
#    run: bshd s = 4k, 8k, 16k, GQA, thd), table in $OUT/v_quant_bandwidth.md, printed last;
# 4. memcheck, racecheck: compute-sanitizer over a few quantization tests (60 s limit each).
# STEPS (default "build tests bench memcheck racecheck") selects steps. Logs: $OUT/log.txt
# (everything) and one file per step. Exit status: 1 if a step failed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-build tests bench memcheck racecheck}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
cd "$ROOT"
export PYTHONUNBUFFERED=1
EXT_DIR=$ROOT/build/exact_fp8_sm90
export PYTHONPATH=$EXT_DIR/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ -z "${NVTE_FORK_ARTIFACTS_DIR:-}" ] && [ -d "$ROOT/build/artifacts" ]; then
  export NVTE_FORK_ARTIFACTS_DIR=$ROOT/build/artifacts
fi
TESTS=tests/pytorch/attention/test_exact_fp8_quantize.py
# small and edge cases of the current-scaling V cast (thd, aligned, short chunks, every head dim)
SANITIZED="per_chunk_matches_reference and thd and dtype0 or sync_free or empty or strided"

source "$ROOT/tools/gpu_common.sh"
rc=0
fail() { log "FAILED: $*"; rc=1; }

gpu_environment

if has_step build; then
  log "build (sm_90)"
  start=$SECONDS
  python3 -m build_tools.cmake_build --build-dir "$EXT_DIR/cmake" --install-dir "$EXT_DIR/lib" \
    --arch 90 > "$OUT/build.log" 2>&1 || fail "the extension did not build ($OUT/build.log)"
  tail -n 2 "$OUT/build.log" | tee -a "$LOG"
  log "build took $((SECONDS - start)) s"
fi

if has_step tests; then
  log "quantization tests ($TESTS)"
  timeout 300 python3 -m pytest -q -p no:cacheprovider "$TESTS" > "$OUT/tests.log" 2>&1 ||
    fail "quantization tests ($OUT/tests.log)"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -n 20 | tee -a "$LOG"
  tail -n 1 "$OUT/tests.log" | tee -a "$LOG"
fi

if has_step bench; then
  log "bandwidth next to a copy"
  timeout 300 python3 benchmarks/quantize/bench_v_quant.py --output "$OUT/v_quant_bandwidth.md" \
    > "$OUT/bench.log" 2>&1 || fail "benchmark ($OUT/bench.log)"
fi

for tool in memcheck racecheck; do
  has_step "$tool" || continue
  if ! command -v compute-sanitizer > /dev/null; then
    log "$tool: compute-sanitizer not found, skipped"
    continue
  fi
  log "compute-sanitizer --tool $tool (60 s limit)"
  timeout 60 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 -m pytest -x -q \
    -p no:cacheprovider "$TESTS" -k "$SANITIZED" > "$OUT/$tool.log" 2>&1
  status=$?
  tail -n 3 "$OUT/$tool.log" | tee -a "$LOG"
  if [ "$status" -eq 124 ]; then
    log "$tool: stopped at the 60 s limit (no error reported before it)"
    grep -q "ERROR SUMMARY: [1-9]" "$OUT/$tool.log" && fail "$tool ($OUT/$tool.log)"
  elif [ "$status" -ne 0 ]; then
    fail "$tool (exit $status, $OUT/$tool.log)"
  fi
done

if [ -f "$OUT/v_quant_bandwidth.md" ]; then
  echo
  grep '^|' "$OUT/v_quant_bandwidth.md" | tee -a "$LOG"
fi
log "done in $SECONDS s, exit $rc"
exit "$rc"
