#!/usr/bin/env bash
# Every GPU check of the fork, one after the other, on a GPU machine without network where
# upstream TE 2.20.2 is staged (shared/device/upstream-te.sh; the TE steps load it through
# tools/gpu_fork_env.sh, the kernel steps run without it):
#
#   OUT=/some/dir bash tools/gpu_full_check.sh      (upstream TE's environment not sourced)
#
# 1. TE integration tests            tools/gpu_te_check.sh
# 2. causality audit through TE      STEPS=audit tools/gpu_audit_bench.sh
# 3. kernel and quantization tests   STEPS="build tests" tools/gpu_attention_check.sh, plus
#                                    tests/pytorch/attention/test_exact_fp8_quantize.py
# 4. benchmarks on an otherwise idle GPU: the kernel's speed table (STEPS=speed
#    tools/gpu_attention_check.sh, ROUNDS rounds, default 3), then the TE-API benchmark
#    (STEPS=bench tools/gpu_audit_bench.sh)
#
# Each step writes into its own folder under $WORK (default /tmp/gpu_full_check); $OUT receives
# them as one results.tar.gz and a summary.txt (step, exit status, last lines), also printed.
# Exit status: 0 if every step passed, else 1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
WORK=${WORK:-/tmp/gpu_full_check}
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
failed=0

step() {  # step NAME COMMAND...: run it with OUT=$WORK/NAME, record the exit status and tail
  local name=$1 rc
  shift
  mkdir -p "$WORK/$name"
  echo "== $(date -u +%FT%TZ) $name: $*" | tee -a "$SUMMARY"
  OUT="$WORK/$name" "$@" > "$WORK/$name/stdout.txt" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && failed=1
  echo "== $name exit status $rc" | tee -a "$SUMMARY"
  tail -n "${TAIL_LINES:-25}" "$WORK/$name/stdout.txt" | tee -a "$SUMMARY"
  tar -czf "$OUT/results.tar.gz" -C "$WORK" .  # after every step: a time limit loses nothing
}

quantize_tests() {
  PYTHONPATH="$ROOT/build/exact_fp8/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q \
    -p no:cacheprovider tests/pytorch/attention/test_exact_fp8_quantize.py
}

# The kernel steps import this repository's exact_fp8 package, which an upstream TE package on
# PYTHONPATH shadows (the TE steps load upstream TE themselves): refuse to start with one there.
IFS=: read -ra path_entries <<< "${PYTHONPATH:-}"
for entry in "${path_entries[@]}"; do
  if [ -n "$entry" ] && [ -f "$entry/transformer_engine/__init__.py" ]; then
    echo "PYTHONPATH holds a transformer_engine package ($entry): run this script without" \
      "upstream TE's environment sourced" >&2
    exit 2
  fi
done

cd "$ROOT"
step te bash tools/gpu_te_check.sh
STEPS=audit step audit bash tools/gpu_audit_bench.sh
STEPS="build tests" step kernel bash tools/gpu_attention_check.sh
step quantize quantize_tests
STEPS=speed ROUNDS=${ROUNDS:-3} step speed bash tools/gpu_attention_check.sh
STEPS=bench step bench bash tools/gpu_audit_bench.sh

echo "== all steps passed: $([ "$failed" -eq 0 ] && echo yes || echo NO)" | tee -a "$SUMMARY"
exit "$failed"
