#!/usr/bin/env bash
# A kernel change on an H100/H200, in one run: the GPU tests of the new build, the same tests of
# the base build where they should catch what the change fixes, then both builds side by side.
#
#   OUT=/some/dir BASE=build/ab/base NEW=build/ab/new bash tools/gpu_ab_check.sh
#
# BASE and NEW are folders holding a built transformer_engine_exact_fp8 (python -m
# build_tools.cmake_build ... --install-dir DIR, for the GPU machine's Python). A folder may also
# hold a transformer_engine/ Python tree (e.g. `git archive BASE transformer_engine/pytorch`): the
# A/B then runs that build's Python side too (the Triton kernel's). The tests always import this
# checkout's Python package (`python -m pytest` puts the working directory first), with the
# folder's extension.
# Steps (STEPS, default "tests control ab"):
#   tests    the sm90 forward tests (TESTS_SM90, default the whole file) and the Triton forward
#            tests selected by TRITON_K on NEW;
#   control  CONTROL_K (a -k expression) of both forward test files on BASE: its failures are the
#            expected ones, reported, never this script's failure;
#   ab       benchmarks/attention/ab_sm90_builds.py --lib base=BASE --lib new=NEW (ENTRIES,
#            ROUNDS), its table printed last.
# Logs: $OUT/log.txt, $OUT/tests_*.log, $OUT/control.log, $OUT/ab_sm90.{md,json}.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-tests control ab}
BASE=$(cd "${BASE:?BASE: the base build folder}" && pwd)
NEW=$(cd "${NEW:?NEW: the new build folder}" && pwd)
SM90=tests/pytorch/attention/test_exact_fp8_attention_sm90.py
TRITON=tests/pytorch/attention/test_exact_fp8_attention.py
source "$ROOT/tools/gpu_common.sh"
start_run
gpu_environment
rc=0

# pytest_on DIR LOGNAME ARGS...: pytest with DIR first on the path.
pytest_on() {
  local dir=$1 name=$2
  shift 2
  PYTHONPATH=$dir:$ROOT timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider \
    -rfE "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  tail -n 2 "$OUT/$name.log" | tee -a "$LOG"
  return $status
}

if has_step tests; then
  log "tests of NEW: $SM90 ${TESTS_SM90:+-k $TESTS_SM90} and $TRITON -k ${TRITON_K:-huge}"
  pytest_on "$NEW" tests_sm90 "$SM90" ${TESTS_SM90:+-k "$TESTS_SM90"} || rc=1
  pytest_on "$NEW" tests_triton "$TRITON" -k "${TRITON_K:-huge}" || rc=1
fi
if has_step control; then
  log "the same tests on BASE (-k ${CONTROL_K:-huge}): failures here are what NEW fixes"
  pytest_on "$BASE" control "$SM90" "$TRITON" -k "${CONTROL_K:-huge}"
  grep -E "^FAILED" "$OUT/control.log" | sed 's/ - .*//' | tee -a "$LOG"
fi
if has_step ab; then
  log "A/B: base vs new (${ENTRIES:-cuda kernel,cuda,triton}, ${ROUNDS:-3} rounds)"
  timeout "${AB_TIMEOUT:-400}" python3 benchmarks/attention/ab_sm90_builds.py --out "$OUT" \
    --lib "base=$BASE" --lib "new=$NEW" --rounds "${ROUNDS:-3}" \
    --entries "${ENTRIES:-cuda kernel,cuda,triton}" >> "$LOG" 2>&1 || rc=1
  [ -f "$OUT/ab_sm90.md" ] && cat "$OUT/ab_sm90.md"
fi
grep -hE "passed|failed" "$OUT"/tests_*.log 2>/dev/null
exit $rc
