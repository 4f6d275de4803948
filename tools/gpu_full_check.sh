#!/usr/bin/env bash
# Every GPU check of the fork in one go, on a GPU machine without network where upstream TE 2.20.2
# is staged (shared/device/upstream-te.sh; the TE steps load it through tools/gpu_fork_env.sh, the
# kernel steps run without it) and the pinned CUTLASS wheel is in build/artifacts (or
# NVTE_FORK_ARTIFACTS_DIR):
#
#   OUT=/some/dir bash tools/gpu_full_check.sh      (upstream TE's environment not sourced)
#
# 0. build: the extension once (sm_90 quantizers + the sm_90a attention kernel) into
#    build/exact_fp8_sm90/lib; build/exact_fp8 points at it for the scripts that look there.
# 1. tests: the test suites, side by side on the one GPU (each under its own time limit):
#      te       tools/gpu_te_check.sh (assembles the fork into /tmp/te-fork)
#      sm90     the CUDA kernel's tests (STEPS=tests tools/gpu_sm90_check.sh)
#      triton   the kernel tests (STEPS=tests tools/gpu_attention_check.sh)
#      quantize the quantization tests (STEPS=tests tools/gpu_v_quant_bench.sh)
#      cp       the context-parallel decomposition (tools/gpu_cp_check.sh)
#      backward the backward's kernel tests (STEPS=tests tools/gpu_backward_check.sh)
# 2. te2: what needs the fork assembled by step te, side by side: the causality audit through TE
#    (STEPS=audit tools/gpu_audit_bench.sh) and the backward through DotProductAttention and
#    TransformerLayer (STEPS=te tools/gpu_backward_check.sh); with phase 1, it starts as soon as
#    step te has assembled the fork, next to the TE tests.
# 3. bench: the benchmarks, one after the other on the then idle GPU: the sm90 forward table with
#    TE's rows (under the assembled fork), the V quantization bandwidth, the backward, the host
#    time. ROUNDS (default 3) their rounds.
# STEPS (default "build tests te2 bench") selects the phases; a later call on the same machine may
# run "te2 bench" alone (the build and /tmp/te-fork stay).
#
# Each step writes into its own folder under $WORK (default /tmp/gpu_full_check); $OUT receives
# them as one results.tar.gz and a summary.txt (step, exit status, last lines), also printed.
# Exit status: 0 if every step passed, else 1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
WORK=${WORK:-/tmp/gpu_full_check}
STEPS=${STEPS:-build tests te2 bench}
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
failed=0
cd "$ROOT"
if [ -z "${NVTE_FORK_ARTIFACTS_DIR:-}" ] && [ -d "$ROOT/build/artifacts" ]; then
  export NVTE_FORK_ARTIFACTS_DIR=$ROOT/build/artifacts
fi
has_step() { [[ " $STEPS " == *" $1 "* ]]; }

report() {  # report NAME RC: record a finished step's exit status and tail
  local name=$1 rc=$2
  [ "$rc" -ne 0 ] && failed=1
  {
    echo "== $(date -u +%FT%TZ) $name exit status $rc"
    tail -n "${TAIL_LINES:-12}" "$WORK/$name/stdout.txt"
  } | tee -a "$SUMMARY"
  tar -czf "$OUT/results.tar.gz" -C "$WORK" .  # after every step: a time limit loses nothing
}

limited() {  # limited LIMIT_S COMMAND...: the command (or a function of this script) timed
  local limit=$1
  shift
  if declare -F "$1" > /dev/null; then
    timeout "$limit" bash -c "$(declare -f te2_steps te2_when_assembled "$1"); $1"
  else
    timeout "$limit" "$@"
  fi
}

step() {  # step NAME LIMIT_S COMMAND...: run it with OUT=$WORK/NAME under a time limit
  local name=$1 limit=$2
  shift 2
  mkdir -p "$WORK/$name"
  echo "== $(date -u +%FT%TZ) $name: $*" | tee -a "$SUMMARY"
  OUT="$WORK/$name" limited "$limit" "$@" > "$WORK/$name/stdout.txt" 2>&1
  report "$name" $?
}


te2_steps() {  # the audit and the TE-level backward tests, side by side, on /tmp/te-fork
  mkdir -p "$OUT/audit" "$OUT/backward_te"
  STEPS=audit TE_FORK_DIR=/tmp/te-fork OUT=$OUT/audit bash tools/gpu_audit_bench.sh \
    > "$OUT/audit/stdout.txt" 2>&1 &
  local audit=$!
  STEPS=te TE_FORK_DIR=/tmp/te-fork OUT=$OUT/backward_te bash tools/gpu_backward_check.sh \
    > "$OUT/backward_te/stdout.txt" 2>&1
  local rc=$?
  wait "$audit" || rc=1
  tail -n 8 "$OUT/audit/stdout.txt" "$OUT/backward_te/stdout.txt"
  return "$rc"
}

te2_when_assembled() {  # te2_steps once step te's fork holds its built extension
  until ls /tmp/te-fork/transformer_engine_exact_fp8*.so > /dev/null 2>&1; do sleep 5; done
  sleep 5
  te2_steps
}

sm90_speed_through_te() {  # the sm90 table with TE's rows: under the fork assembled by step te
  (
    source tools/gpu_fork_env.sh
    LOG=$OUT/log.txt
    log() { echo "$*" | tee -a "$LOG"; }
    TE_FORK_DIR=/tmp/te-fork use_fork || exit 1
    python3 benchmarks/attention/bench_sm90_forward.py --out "$OUT" --rounds "${ROUNDS:-3}"
  )
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

if has_step build; then
  step build 300 python3 -m build_tools.cmake_build --build-dir build/exact_fp8_sm90/cmake \
    --install-dir build/exact_fp8_sm90/lib --arch 90
  rm -rf build/exact_fp8 && ln -s exact_fp8_sm90 build/exact_fp8
fi

declare -A pids
run_bg() {  # run_bg NAME LIMIT_S COMMAND...: step in the background
  local name=$1 limit=$2
  shift 2
  mkdir -p "$WORK/$name"
  echo "== $(date -u +%FT%TZ) $name (background): $*" | tee -a "$SUMMARY"
  (OUT="$WORK/$name" limited "$limit" "$@" > "$WORK/$name/stdout.txt" 2>&1) &
  pids[$name]=$!
}
wait_all() {  # the background steps: wait for each, then report it
  local name
  for name in "${!pids[@]}"; do
    wait "${pids[$name]}"
    report "$name" $?
  done
  pids=()
}

if has_step tests; then
  PYTEST_TIMEOUT=300 run_bg te 420 bash tools/gpu_te_check.sh
  STEPS=tests run_bg sm90 200 bash tools/gpu_sm90_check.sh
  STEPS=tests run_bg triton 300 bash tools/gpu_attention_check.sh
  STEPS=tests run_bg quantize 200 bash tools/gpu_v_quant_bench.sh
  run_bg cp 240 bash tools/gpu_cp_check.sh
  STEPS=tests run_bg backward 420 bash tools/gpu_backward_check.sh
  if [[ " $STEPS " == *" te2 "* ]]; then  # as soon as step te has assembled and built the fork
    run_bg te2 420 te2_when_assembled
  fi
  wait_all
fi

if has_step te2 && ! has_step tests; then
  run_bg te2 420 te2_steps
  wait_all
fi

if has_step bench; then
  step speed 200 sm90_speed_through_te
  STEPS=bench step v_quant 120 bash tools/gpu_v_quant_bench.sh
  STEPS=speed step backward_bench 200 bash tools/gpu_backward_check.sh
  TE_FORK_DIR=/tmp/te-fork step host_time 150 bash tools/gpu_host_time.sh
fi

echo "== all steps passed: $([ "$failed" -eq 0 ] && echo yes || echo NO)" | tee -a "$SUMMARY"
exit "$failed"
