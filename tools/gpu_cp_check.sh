#!/usr/bin/env bash
# GPU check of mask-exact FP8 attention under context parallelism (issue 22), from the
# repository root of a GPU machine:
#
#   OUT=/some/dir bash tools/gpu_cp_check.sh
#
# Runs tests/pytorch/attention/test_exact_fp8_context_parallel.py (the ring simulated in one
# process, every step through the real Triton kernel) in two parallel pytest shards so that their
# Triton compilations overlap; with two or more GPUs its test_multi_gpu_ring also launches
# run_exact_fp8_cp.py under torchrun (skipped on one GPU). K/V are quantized by the CUDA
# extension when build/exact_fp8/lib holds it (STEPS="build tests" builds it first, sm_90, as
# tools/gpu_attention_check.sh does), else by the torch fallback (a warning; same bits).
# Logs: $OUT/log.txt (everything), $OUT/tests_{0,1}.log. Exit status: the tests'.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-tests}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
cd "$ROOT"
export PYTHONUNBUFFERED=1
EXT_DIR=$ROOT/build/exact_fp8
export PYTHONPATH=$EXT_DIR/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}
TEST_FILE=tests/pytorch/attention/test_exact_fp8_context_parallel.py
SHARDS=("matches_single_call or kv_fp8 or a2a or bytes or multi_gpu"
        "future_shards or other_samples or leaky")

source "$ROOT/tools/gpu_common.sh"
gpu_environment
{ python3 -c "import transformer_engine_exact_fp8" 2>/dev/null && echo "extension: built" \
    || echo "extension: not built (K/V quantized by the torch fallback)"; } 2>&1 | tee -a "$LOG"

build_quantize_extension "$EXT_DIR" "K/V"

tests_rc=0
if has_step tests; then
  log "GPU tests, ${#SHARDS[@]} parallel shards"
  pids=()
  for i in "${!SHARDS[@]}"; do
    python3 -m pytest -q -s -p no:cacheprovider -W ignore::RuntimeWarning "$TEST_FILE" \
      -k "${SHARDS[$i]}" > "$OUT/tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || tests_rc=1
    grep -E "error vs fp64|FAILED|Error" "$OUT/tests_$i.log" | head -40 | tee -a "$LOG"
    tail -n 3 "$OUT/tests_$i.log" | tee -a "$LOG"
  done
fi
log "done (tests rc=$tests_rc)"
exit $tests_rc
