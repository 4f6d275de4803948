#!/usr/bin/env bash
# Host time per attention call (benchmarks/attention/bench_host_time.py) on a GPU machine, from the
# repository root:
#
#   OUT=/some/dir bash tools/gpu_host_time.sh
#
# Assumes the fork's CUDA extension was built for sm_90/sm_90a into build/exact_fp8_sm90/lib
# (tools/gpu_sm90_check.sh builds it there); without it the fork's entries quantize through the
# CPU reference and the CUDA backend is skipped. TE's DotProductAttention rows need upstream TE
# staged as for tools/gpu_te_check.sh ($TE_ENV, default /tmp/te-env.sh, and the pinned wheel in
# $TE_STAGE_DIR): when that environment file exists, the fork is assembled into $TE_FORK_DIR
# (default /tmp/te-fork-host; an existing assembled tree named by TE_FORK_DIR is reused) with the
# built extension copied beside it instead of rebuilt, and the benchmark runs from that tree.
# Otherwise (or if assembling fails) it runs from the checkout and the TE rows are skipped.
# CALLS / REPEATS: the benchmark's --calls / --repeats (default 300 / 7).
# Logs: $OUT/log.txt; results: $OUT/host_time.{md,json}. Exit status: the benchmark's.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
cd "$ROOT"
export PYTHONUNBUFFERED=1
EXT_LIB=$ROOT/build/exact_fp8_sm90/lib

source "$ROOT/tools/gpu_common.sh"

log "environment"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
  nproc
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version())"
  python3 -c "import triton; print('triton', triton.__version__)" || echo "no triton"
  ls "$EXT_LIB"/transformer_engine_exact_fp8*.so 2>/dev/null || echo "no built extension in $EXT_LIB"
} 2>&1 | tee -a "$LOG"

BENCH=$ROOT/benchmarks/attention/bench_host_time.py
FROM_FORK=0
TE_ENV_FILE=${TE_ENV:-/tmp/te-env.sh}
if [ -f "$TE_ENV_FILE" ]; then
  source "$ROOT/tools/gpu_fork_env.sh"
  if [ -z "${TE_FORK_DIR:-}" ]; then
    FORK=/tmp/te-fork-host
    log "assemble the fork into $FORK (TE rows), the built extension copied beside it"
    source "$TE_ENV_FILE"
    rm -rf "$FORK"
    if python3 -m build_tools.assemble --out "$FORK" --offline "${TE_STAGE_DIR:-/tmp/stage}" \
        >> "$LOG" 2>&1; then
      _link_upstream_libraries "$FORK"
      cp "$EXT_LIB"/transformer_engine_exact_fp8*.so "$FORK/" 2>/dev/null ||
        log "WARNING: no built extension to copy: the fork quantizes through its reference"
      TE_FORK_DIR=$FORK
    else
      log "WARNING: the fork could not be assembled (see $LOG): running from the checkout"
    fi
  fi
  if [ -n "${TE_FORK_DIR:-}" ] && use_fork "$TE_FORK_DIR"; then
    FROM_FORK=1
  fi
fi
if [ "$FROM_FORK" -eq 1 ]; then
  log "benchmark from the assembled fork $TE_FORK_DIR"
  # PYTHONSAFEPATH (use_fork): the script's folder is not put first, so the fork's tree wins
  export PYTHONPATH=$EXT_LIB:$PYTHONPATH
else
  log "benchmark from the checkout (no TE environment file at $TE_ENV_FILE: TE rows skipped)"
  export PYTHONPATH=$EXT_LIB:$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
timeout 300 python3 "$BENCH" --out "$OUT" --calls "${CALLS:-300}" --repeats "${REPEATS:-7}" \
  2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || log "FAILED: the benchmark exited with $rc"
exit "$rc"
