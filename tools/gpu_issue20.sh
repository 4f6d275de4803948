#!/usr/bin/env bash
# Issue 20's evidence for one build of the sm_90a attention forward, on an H100/H200 machine
# without network, in as few calls as its time limit allows. From the repository root:
#
#   SM90_EXT=<dir or .so.xz> OUT=/some/dir bash tools/gpu_issue20.sh
#
# SM90_EXT: a prebuilt extension (cmake_build's --install-dir, or its .so compressed with xz),
# built elsewhere with the machine's Python; unset: built here (tools/gpu_sm90_check.sh's build).
# It is installed into build/exact_fp8_sm90/lib, where the other GPU scripts look for it.
# Steps (STEPS, default "sanitize tests te tables"; logs in $OUT/log.txt and a folder per part):
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck on small shapes
#             (tools/gpu_sm90_profile.sh)
#   tests     the forward's and the backward's sm90 GPU test files
#   te        the causality audit through TE and the TE-level tests (tools/gpu_audit_bench.sh,
#             tools/gpu_te_check.sh); needs upstream TE 2.20.2 staged, as those scripts say
#   tables    issue 20's table (benchmarks/attention/bench_sm90_forward.py: the fork's forward
#             with and without quantization, its leaky variant, the quantization, the Triton
#             kernel, torch's BF16 SDPA, TE's calls where TE imports), cuDNN's per-tensor FP8
#             kernel beside the fork's timed by the CUDA profiler, and TE's own table
# The summary (one line a step, then the tables) is printed last and kept in $OUT/summary.md.
# Steps that need more than one call's time: split them, e.g. STEPS="sanitize tests te", then
# STEPS=tables (the machine keeps /tmp/te-fork, which the te step assembles, while it is warm).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-sanitize tests te tables}
source "$ROOT/tools/gpu_common.sh"
start_run
SUMMARY=$OUT/summary.md
: > "$SUMMARY"
EXT_LIB=$ROOT/build/exact_fp8_sm90/lib
SM90_TESTS=(tests/pytorch/attention/test_exact_fp8_attention_sm90.py
  tests/pytorch/attention/test_exact_fp8_backward_sm90.py)
FORWARD_ENTRIES="cuda,cuda kernel,kernel all-fp8,quantize,triton,sdpa flash,sdpa cudnn"
FORWARD_ENTRIES+=",te fork,te bf16,te delayed"
PROFILED_ENTRIES="cuda,cuda kernel,cuda profiled,te delayed,te delayed kernel,sdpa cudnn,sdpa flash"
rc=0
result() {  # step, exit status: a summary line; the first failure sets the exit status
  echo "| $1 | $([ "$2" -eq 0 ] && echo passed || echo "FAILED (exit $2)") |" >> "$SUMMARY"
  [ "$2" -eq 0 ] || [ "$rc" -ne 0 ] || rc=$2
}

gpu_environment
mkdir -p "$EXT_LIB"
if [ -z "${SM90_EXT:-}" ]; then
  STEPS=build OUT=$OUT/build bash "$ROOT/tools/gpu_sm90_check.sh" > /dev/null 2>&1
  result "build the extension" $?
elif [[ "$SM90_EXT" == *.xz ]]; then
  xz -dc "$SM90_EXT" > "$EXT_LIB/transformer_engine_exact_fp8.$(python3 -c \
    'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX")[1:])')"
  result "the extension from $SM90_EXT" $?
else
  cp "$SM90_EXT"/transformer_engine_exact_fp8*.so "$EXT_LIB/"
  result "the extension from $SM90_EXT" $?
fi
export PYTHONPATH=$EXT_LIB:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export TE_FORK_EXT=$EXT_LIB  # the fork assembled over upstream TE takes this build

if has_step sanitize; then
  log "memory checkers"
  STEPS=sanitize OUT=$OUT/sanitize bash "$ROOT/tools/gpu_sm90_profile.sh" >> "$LOG" 2>&1
  # that script reports and exits 0: its checkers pass when their summaries say so
  status=0
  for tool in memcheck racecheck synccheck; do
    grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards" \
      "$OUT/sanitize/sanitizer_$tool.txt" 2> /dev/null || status=1
  done
  result "memcheck, racecheck, synccheck: 0 errors, 0 hazards (tools/gpu_sm90_profile.sh)" \
    "$status"
fi
if has_step tests; then
  log "the sm90 GPU test files"
  mkdir -p "$OUT/tests"
  timeout 480 python3 -m pytest -q -p no:cacheprovider "${SM90_TESTS[@]}" \
    > "$OUT/tests/pytest.log" 2>&1
  status=$?
  result "sm90 test files: $(tail -n 1 "$OUT/tests/pytest.log")" "$status"
fi
if has_step te; then
  log "the audit through TE and the TE-level tests (the fork's extension from $EXT_LIB)"
  STEPS=audit OUT=$OUT/audit bash "$ROOT/tools/gpu_audit_bench.sh" >> "$LOG" 2>&1
  result "the audit through TE (tools/gpu_audit_bench.sh)" $?
  TE_FORK_DIR=/tmp/te-fork OUT=$OUT/te_tests bash "$ROOT/tools/gpu_te_check.sh" >> "$LOG" 2>&1
  result "the TE-level tests (tools/gpu_te_check.sh)" $?
fi
if has_step tables; then
  log "issue 20's tables"
  (
    # TE's rows need the assembled fork (the te step's, or assembled here); without upstream TE
    # staged they are left out ("-" and the reason in the JSON)
    source "$ROOT/tools/gpu_fork_env.sh"
    [ -d /tmp/te-fork/transformer_engine ] && export TE_FORK_DIR=/tmp/te-fork
    use_fork /tmp/te-fork || log "no assembled fork: the table without TE's rows"
    python3 benchmarks/attention/bench_sm90_forward.py --out "$OUT/forward" --rounds 2 \
      --entries "$FORWARD_ENTRIES" &&
      python3 benchmarks/attention/bench_sm90_forward.py --out "$OUT/profiled" --rounds 1 \
        --entries "$PROFILED_ENTRIES"
  ) >> "$LOG" 2>&1
  result "issue 20's forward tables (bench_sm90_forward.py)" $?
  TE_FORK_DIR=/tmp/te-fork STEPS=bench OUT=$OUT/te_table bash "$ROOT/tools/gpu_audit_bench.sh" \
    >> "$LOG" 2>&1
  result "TE's table (benchmarks/te/bench_te_attention.py)" $?
fi

{
  echo "| step | result |"
  echo "|---|---|"
  cat "$SUMMARY"
  for table in forward/sm90_forward.md profiled/sm90_forward.md te_table/bench_te.md; do
    if [ -f "$OUT/$table" ]; then
      echo
      cat "$OUT/$table"
    fi
  done
} > "$SUMMARY.tmp"
mv "$SUMMARY.tmp" "$SUMMARY"
cat "$SUMMARY"
exit "$rc"
