#!/usr/bin/env bash
# The GPU check of the quantization kernels, in one go: build the extension with CMake/ninja for
# sm_90 only, run its GPU tests, the bandwidth benchmark, and a compute-sanitizer memcheck of a
# few tests. Prints a summary table last; logs go to $OUT (default build/gpu_quantize_check).
#
#   bash tools/gpu_quantize_check.sh          # from anywhere; needs one CUDA GPU, nvcc, cmake
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu_quantize_check}"
PY="${PYTHON:-python3}"
EXT_DIR="$PWD/build/exact_fp8"
TESTS=tests/pytorch/attention/test_exact_fp8_quantize.py
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

summary=()
step() {  # step NAME LOG COMMAND...: run, tee to $OUT/LOG, record status and seconds
  local name=$1 log=$2
  shift 2
  local start=$SECONDS
  "$@" 2>&1 | tee "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  local last
  last=$(grep -v '^\s*$' "$OUT/$log" | tail -n 1 | cut -c1-70)
  local status="FAILED ($rc)"
  [ "$rc" = 0 ] && status=ok
  summary+=("| $name | $status | $((SECONDS - start)) | $last |")
  return "$rc"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
  nvcc --version | tail -n 1
  cmake --version | head -n 1
} 2>&1 | tee "$OUT/versions.txt"

if step build build.txt "$PY" -m build_tools.cmake_build --arch 90 \
  --build-dir "$EXT_DIR/cmake" --install-dir "$EXT_DIR/lib"; then
  export PYTHONPATH="$EXT_DIR/lib:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  step import import.txt "$PY" -c "import transformer_engine_exact_fp8 as m; print(m.__file__)" &&
    step tests pytest.txt "$PY" -m pytest -x -q -p no:cacheprovider "$TESTS"
  step bench bench.txt "$PY" benchmarks/quantize/bench_exact_fp8_quantize.py \
    --output "$OUT/quantize_bandwidth.md"
  if command -v compute-sanitizer >/dev/null; then
    # what is left of a 140 s budget (at least 30 s), so the whole check fits a 150 s slot
    memcheck_s=$((140 - SECONDS > 30 ? 140 - SECONDS : 30))
    step memcheck memcheck.txt timeout "$memcheck_s" compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$PY" -m pytest -x -q -p no:cacheprovider "$TESTS" \
      -k "layout_matches or strided_views or empty or future_chunk or large"
  fi
fi

echo
echo "## Bandwidth"
grep '^|' "$OUT/quantize_bandwidth.md" 2>/dev/null || echo "(no benchmark results)"
echo
echo "## GPU quantization check"
echo "| step | status | seconds | last line |"
echo "|---|---|---|---|"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.md"
! printf '%s\n' "${summary[@]}" | grep -q FAILED
