#!/usr/bin/env bash
# GPU check of the mask-exact FP8 attention forward, from the repository root of a GPU machine:
#
#   OUT=/some/dir bash tools/gpu_attention_check.sh
#
# 1. builds the quantization extension (transformer_engine_exact_fp8, sm_90) into build/lib when
#    its sources are present; without it K/V are quantized by the torch fallback (CPU) and the
#    tables say so;
# 2. runs the GPU tests (tests/pytorch/attention/test_exact_fp8_attention.py) in four parallel
#    pytest shards, so that their Triton compilations overlap;
# 3. runs the accuracy table, then the speed table (benchmarks/attention/bench_exact_fp8_forward.py)
#    and prints both last.
# STEPS (default "build tests accuracy speed") selects steps; ROUNDS the speed table's rounds.
# Logs: $OUT/log.txt (everything), $OUT/tests.log, $OUT/attention_{accuracy,forward}.md,
# $OUT/bench_exact_fp8.json. Exit status: the tests' if they failed, else the benchmark's.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-build tests accuracy speed}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
cd "$ROOT"
export PYTHONUNBUFFERED=1
EXT_DIR=$ROOT/build/exact_fp8  # shared with tools/gpu_quantize_check.sh
export PYTHONPATH=$EXT_DIR/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}
TEST_FILE=tests/pytorch/attention/test_exact_fp8_attention.py
SHARDS=("hidden_tokens"
        "bug_report or negative_control or decode or unsupported or code_zero or layout or cuda_graph"
        "accuracy" "in_kernel or launch_config")

source "$ROOT/tools/gpu_common.sh"
gpu_environment

build_quantize_extension "$EXT_DIR" "K/V"

tests_rc=0
if has_step tests; then
  log "GPU tests, ${#SHARDS[@]} parallel shards"
  pids=()
  for i in "${!SHARDS[@]}"; do
    python3 -m pytest -x -q -s -p no:cacheprovider "$TEST_FILE" -k "${SHARDS[$i]}" \
      > "$OUT/tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || tests_rc=1
    tail -n 3 "$OUT/tests_$i.log" | tee -a "$LOG"
  done
  cat "$OUT"/tests_*.log > "$OUT/tests.log" && rm -f "$OUT"/tests_*.log
  grep -oE "(exactness|negative-control) .*" "$OUT/tests.log" | sort > "$OUT/exactness.txt"
  log "exactness: $(awk -F'cases=' '/cases=/{split($2, a, " "); s += a[1]} END {print s + 0}' \
    "$OUT/exactness.txt") cases, violations:" \
    "$(awk -F'violations=' '/violations=/{s += $2} END {print s + 0}' "$OUT/exactness.txt")"
fi

bench_args=()
has_step accuracy && bench_args+=(--accuracy)
has_step speed && bench_args+=(--speed --rounds "${ROUNDS:-5}")
bench_rc=0
if [ ${#bench_args[@]} -gt 0 ]; then
  log "benchmark ${bench_args[*]}"
  python3 benchmarks/attention/bench_exact_fp8_forward.py "${bench_args[@]}" --out "$OUT" \
    2>&1 | tee -a "$LOG"
  bench_rc=$?
fi
[ -f "$OUT/exactness.txt" ] && cat "$OUT/exactness.txt"
[ "$tests_rc" -ne 0 ] && exit "$tests_rc"
exit "$bench_rc"
