#!/usr/bin/env bash
# The causality audit through TE and the TE-API benchmark, on a GPU machine without network.
#
# Needs upstream TE 2.20.2 staged on the machine first: /tmp/te-env.sh puts its core library and
# torch extension (installed into $TE_SITE_DIR, default /tmp/te-site) on the path, and the pinned
# pure-Python wheel lies in $TE_STAGE_DIR (default /tmp/stage). Then, from the repository root:
#
#   OUT=/some/dir bash tools/gpu_audit_bench.sh
#
# 1. assembles the fork with tools/gpu_fork_env.sh into /tmp/te-fork (skipped when TE_FORK_DIR
#    names a folder that already holds the fork);
# 2. runs the audit: te-fp8-causality-audit --device cuda -> $OUT/audit_gpu.json, the plot's data
#    $OUT/audit_sweep.json and, where matplotlib is installed, $OUT/audit_gpu.png;
# 3. runs benchmarks/te/bench_te_attention.py -> $OUT/bench_te.{md,json,png};
# 4. prints the two tables last. Everything is also logged to $OUT/log.txt.
# Exit status: the audit's (1 if a fork or BF16 row is not exact), else the benchmark's.
#
# To split the work over two calls (each call has a time limit): STEPS=audit, then
# STEPS=bench TE_FORK_DIR=/tmp/te-fork (the machine keeps /tmp while it stays warm).
# AUDIT_TRIALS (default 3) sets the draws per randomized scenario.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-audit bench}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
export PYTHONUNBUFFERED=1
AUDIT_MODULE=transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit

log() { echo "== $*" | tee -a "$LOG"; }

source "$ROOT/tools/gpu_fork_env.sh"
use_fork /tmp/te-fork
python3 -m transformer_engine._fork_build_info 2>&1 | tee -a "$LOG"

PLOT=(--plot-data "$OUT/audit_sweep.json")
if python3 -c "import matplotlib" 2>/dev/null; then
  PLOT+=(--plot "$OUT/audit_gpu.png")
else
  log "matplotlib is not installed: no PNG here; draw it elsewhere with"
  log "python -m ${AUDIT_MODULE}_plot audit_sweep.json audit_gpu.png"
fi

audit_rc=0
bench_rc=0
set +e
if [[ " $STEPS " == *" audit "* ]]; then
  log "causality audit through TE (--device cuda)"
  python3 -m "$AUDIT_MODULE" --device cuda --trials "${AUDIT_TRIALS:-3}" \
    --json "$OUT/audit_gpu.json" "${PLOT[@]}" 2>&1 | tee "$OUT/audit.txt"
  audit_rc=${PIPESTATUS[0]}
fi
if [[ " $STEPS " == *" bench "* ]]; then
  log "benchmark through TE's API"
  python3 "$ROOT/benchmarks/te/bench_te_attention.py" --out "$OUT" 2>&1 | tee "$OUT/bench.txt"
  bench_rc=${PIPESTATUS[0]}
fi
set -e

log "tables (audit exit status $audit_rc, benchmark exit status $bench_rc)"
if [ -f "$OUT/audit.txt" ]; then
  cat "$OUT/audit.txt" >> "$LOG"
  sed -n '/^te-fp8-causality-audit/,$p' "$OUT/audit.txt"
  echo
fi
if [ -f "$OUT/bench.txt" ]; then
  cat "$OUT/bench.txt" >> "$LOG"
  if [ -f "$OUT/bench_te.md" ]; then cat "$OUT/bench_te.md"; else tail -n 30 "$OUT/bench.txt"; fi
fi
rm -f "$OUT/audit.txt" "$OUT/bench.txt"  # both are in log.txt; at most 8 files come back
[ "$audit_rc" -ne 0 ] && exit "$audit_rc"
exit "$bench_rc"
