#!/usr/bin/env bash
# GPU check of the mask-exact FP8 attention backward, from the repository root of a GPU machine
# with PyTorch and Triton (TE is not needed for the kernel part):
#
#   OUT=/some/dir bash tools/gpu_backward_check.sh
#
# 1. builds the quantization extension (transformer_engine_exact_fp8, sm_90) into build/exact_fp8
#    when its sources are present; without it Q/K/V are quantized by the torch fallback (CPU);
# 2. runs the GPU tests (tests/pytorch/attention/test_exact_fp8_backward.py) in three parallel
#    pytest shards, so that their Triton compilations overlap, then the negative controls alone;
#    the TE-level tests in it skip unless the assembled fork over upstream TE is importable
#    (TE_FORK_DIR, or the staged upstream TE of tools/gpu_fork_env.sh when /tmp/te-env.sh or
#    $TE_ENV exists);
# 3. runs the speed table (benchmarks/attention/bench_backward.py) and prints it last.
# STEPS (default "build tests te speed") selects steps; ROUNDS the speed table's rounds (3).
# Logs: $OUT/log.txt (everything), $OUT/tests.log, $OUT/tests_te.log, $OUT/exactness.txt,
# $OUT/attention_backward.md, $OUT/bench_backward.json. Exit status: the tests' if they failed,
# else the benchmark's.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-build tests te speed}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
cd "$ROOT"
export PYTHONUNBUFFERED=1
EXT_DIR=$ROOT/build/exact_fp8  # shared with tools/gpu_attention_check.sh
export PYTHONPATH=$EXT_DIR/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}
TEST_FILE=tests/pytorch/attention/test_exact_fp8_backward.py
SHARDS=("future_values and not leaky"
        "accuracy or launch_configs or deterministic or sdpa_control"
        "(padding or thd or batch) and not leaky")
# The negative controls count a case as caught only where torch's SDPA control reproduces its
# own bits, which it does not while other suites load the GPU: they run alone, after the shards.
ALONE="leaky"

source "$ROOT/tools/gpu_common.sh"
gpu_environment

build_quantize_extension "$EXT_DIR" "Q/K/V"

tests_rc=0
if has_step tests; then
  log "GPU tests, ${#SHARDS[@]} parallel shards (TE-level tests skip here)"
  pids=()
  for i in "${!SHARDS[@]}"; do
    timeout 420 python3 -m pytest -q -s -p no:cacheprovider -rfEs "$TEST_FILE" \
      -k "(${SHARDS[$i]}) and not through_te" > "$OUT/tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || tests_rc=1
    tail -n 3 "$OUT/tests_$i.log" | tee -a "$LOG"
  done
  timeout 300 python3 -m pytest -q -s -p no:cacheprovider -rfEs "$TEST_FILE" \
    -k "($ALONE) and not through_te" > "$OUT/tests_alone.log" 2>&1 || tests_rc=1
  tail -n 3 "$OUT/tests_alone.log" | tee -a "$LOG"
  cat "$OUT"/tests_*.log > "$OUT/tests.log" && rm -f "$OUT"/tests_*.log
fi

if has_step te; then
  te_ready=0
  if [ -n "${TE_FORK_DIR:-}" ] || [ -f "${TE_ENV:-/tmp/te-env.sh}" ]; then
    source "$ROOT/tools/gpu_fork_env.sh"
    use_fork "${TE_FORK_DIR:-/tmp/te-fork}" && te_ready=1
  fi
  if [ "$te_ready" = 1 ]; then
    log "TE-level backward tests (DotProductAttention, TransformerLayer) through the fork"
    timeout 300 python3 -m pytest -q -s -p no:cacheprovider -rfEs "$TEST_FILE" \
      -k "through_te" > "$OUT/tests_te.log" 2>&1 || tests_rc=1
    tail -n 3 "$OUT/tests_te.log" | tee -a "$LOG"
  else
    log "TE-level backward tests skipped: no assembled fork (TE_FORK_DIR) and no staged upstream TE"
  fi
fi
cat "$OUT"/tests*.log 2>/dev/null | grep -oE "(exactness|negative-control|accuracy) .*" | sort \
  > "$OUT/exactness.txt"
if [ -s "$OUT/exactness.txt" ]; then
  log "exactness: $(awk -F'cases=' '/cases=/{split($2, a, " "); s += a[1]} END {print s + 0}' \
    "$OUT/exactness.txt") cases, violations:" \
    "$(awk -F'violations=' '/violations=/{split($2, a, " "); s += a[1]} END {print s + 0}' \
    "$OUT/exactness.txt")"
fi

bench_rc=0
if has_step speed; then
  log "benchmark (backward alone and forward + backward, against BF16 SDPA cuDNN and flash)"
  timeout 240 python3 benchmarks/attention/bench_backward.py --out "$OUT" --rounds "${ROUNDS:-3}" \
    >> "$LOG" 2>&1
  bench_rc=$?
fi
[ -f "$OUT/exactness.txt" ] && cat "$OUT/exactness.txt"
grep -hE "passed|failed|error" "$OUT"/tests*.log 2>/dev/null | tail -n 5
[ -f "$OUT/attention_backward.md" ] && cat "$OUT/attention_backward.md"
[ "$tests_rc" -ne 0 ] && exit "$tests_rc"
exit "$bench_rc"
