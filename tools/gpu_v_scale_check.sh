#!/usr/bin/env bash
# GPU check of rules v2 (one V scale per (chunk, kv-head) for current scaling), in one go, from
# the repository root of a GPU machine:
#
#   OUT=/some/dir BASELINE=/path/to/v1-copy bash tools/gpu_v_scale_check.sh
#
# 1. builds the quantization extension (sm_90) and, with BASELINE (a copy of an older commit's
#    transformer_engine/, build_tools/ and CMakeLists.txt, e.g. from `git archive`), the
#    baseline's extension under the module name transformer_engine_exact_fp8_v1 (the copy is
#    edited in place: its module name, and module-local pybind11 types, so that both extensions
#    load in one process);
# 2. runs the GPU tests of the quantization kernels and of the attention kernel (parallel shards);
# 3. runs the quantization bandwidth benchmark, then benchmarks/attention/bench_v_scale_rules.py
#    (accuracy against fp64, speed against v1 and torch's BF16 SDPA) and prints the tables last.
# STEPS (default "build tests quantize rules") selects steps ("qtests": the quantization tests
# alone); ROUNDS the speed rounds (3); RULES_ARGS the benchmark's (default --accuracy --speed).
# Logs: $OUT/log.txt, $OUT/tests.log, $OUT/quantize_bandwidth.md, $OUT/v_scale_rules.{md,json}.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-build tests quantize rules}
BASELINE=${BASELINE:-}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
cd "$ROOT"
export PYTHONUNBUFFERED=1
EXT_DIR=$ROOT/build/exact_fp8
export PYTHONPATH=$EXT_DIR/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}
SHARDS=("hidden_tokens" "bug_report or negative_control or decode or code_zero or fold or finite"
        "accuracy" "in_kernel or launch_config or layout or cuda_graph or unsupported")

source "$ROOT/tools/gpu_common.sh"

rename_baseline() {  # the baseline copy's extension as transformer_engine_exact_fp8_v1
  grep -rlw transformer_engine_exact_fp8 --include=*.py --include=*.txt --include=*.cpp \
    "$BASELINE" | xargs -r sed -i 's/\btransformer_engine_exact_fp8\b/transformer_engine_exact_fp8_v1/g'
  sed -i 's/(m, "TokenView",/(m, "TokenView", py::module_local(),/;
          s/(m, "Chunks",/(m, "Chunks", py::module_local(),/' \
    "$BASELINE/transformer_engine/pytorch/csrc/exact_fp8_binding.cpp"
}

gpu_environment

if has_step build; then
  log "build the extension (sm_90)${BASELINE:+, and the baseline}"
  python3 -m build_tools.cmake_build --build-dir "$EXT_DIR/cmake" --install-dir "$EXT_DIR/lib" \
    --arch 90 > "$OUT/build.log" 2>&1 &
  pid=$!
  if [ -n "$BASELINE" ]; then
    rename_baseline
    (cd "$BASELINE" && python3 -m build_tools.cmake_build --build-dir build/cmake \
      --install-dir build/lib --arch 90) > "$OUT/build_baseline.log" 2>&1 || log "WARNING: baseline build failed"
  fi
  wait "$pid" || log "WARNING: the extension did not build"
  cat "$OUT"/build*.log >> "$LOG" && rm -f "$OUT"/build*.log
fi

tests_rc=0
if has_step qtests; then
  log "GPU tests of the quantization kernels"
  python3 -m pytest -x -q -p no:cacheprovider tests/pytorch/attention/test_exact_fp8_quantize.py \
    > "$OUT/tests.log" 2>&1 || tests_rc=1
  tail -n 2 "$OUT/tests.log" | tee -a "$LOG"
fi
if has_step tests; then
  log "GPU tests: quantization, and ${#SHARDS[@]} attention shards, in parallel"
  pids=()
  python3 -m pytest -x -q -p no:cacheprovider tests/pytorch/attention/test_exact_fp8_quantize.py \
    > "$OUT/tests_q.log" 2>&1 &
  pids+=($!)
  for i in "${!SHARDS[@]}"; do
    python3 -m pytest -x -q -s -p no:cacheprovider tests/pytorch/attention/test_exact_fp8_attention.py \
      -k "${SHARDS[$i]}" > "$OUT/tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || tests_rc=1; done
  for f in "$OUT"/tests_*.log; do tail -n 2 "$f" | tee -a "$LOG"; done
  cat "$OUT"/tests_*.log > "$OUT/tests.log" && rm -f "$OUT"/tests_*.log
  cases=$(grep -oE "cases=[0-9]+" "$OUT/tests.log" | awk -F= '{s += $2} END {print s + 0}')
  violations=$(grep -oE "violations=[0-9]+" "$OUT/tests.log" | awk -F= '{s += $2} END {print s + 0}')
  log "exactness: $cases cases, $violations violations"
fi

if has_step quantize; then
  log "quantization bandwidth"
  python3 benchmarks/quantize/bench_exact_fp8_quantize.py --output "$OUT/quantize_bandwidth.md" \
    >> "$LOG" 2>&1 || log "WARNING: quantization benchmark failed"
fi

bench_rc=0
if has_step rules; then
  log "rules v2 against v1: accuracy and speed"
  python3 benchmarks/attention/bench_v_scale_rules.py ${RULES_ARGS:---accuracy --speed} \
    --rounds "${ROUNDS:-3}" ${BASELINE:+--baseline "$BASELINE"} --out "$OUT" >> "$LOG" 2>&1
  bench_rc=$?
fi
[ -f "$OUT/quantize_bandwidth.md" ] && grep '^|' "$OUT/quantize_bandwidth.md"
[ -f "$OUT/v_scale_rules.md" ] && grep -E '^(\| [0-9]|targets)' "$OUT/v_scale_rules.md"
[ "$tests_rc" -ne 0 ] && exit "$tests_rc"
exit "$bench_rc"
