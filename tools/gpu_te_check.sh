#!/usr/bin/env bash
# TE integration tests of mask-exact FP8 attention, on a GPU machine without network.
#
# Needs upstream TE 2.20.2 staged first (shared/device/upstream-te.sh): /tmp/te-env.sh (or
# $TE_ENV), upstream's core library and torch extension installed into $TE_SITE_DIR (default
# /tmp/te-site), the pinned pure-Python wheel in $TE_STAGE_DIR (default /tmp/stage). Then, from
# the repository root:
#
#   OUT=/some/dir bash tools/gpu_te_check.sh [extra pytest arguments, e.g. -k report]
#
# 1. assembles the fork with tools/gpu_fork_env.sh (into /tmp/te-fork, or reuses TE_FORK_DIR),
#    and checks that `import transformer_engine` resolves to it with its patched files intact;
# 2. runs pytest on tests/pytorch/attention/test_exact_fp8_te.py (at most $PYTEST_TIMEOUT
#    seconds, default 480), junit XML in $OUT/junit.xml;
# 3. prints a summary table last. Everything is also logged to $OUT/log.txt.
# Exit status: pytest's (124 if it ran out of time), or 2 if the fork could not be assembled.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
FORK=${TE_FORK_DIR:-/tmp/te-fork}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
export PYTHONUNBUFFERED=1

log() { echo "== $*" | tee -a "$LOG"; }

source "$ROOT/tools/gpu_fork_env.sh"
if ! use_fork "$FORK"; then
  log "FAILED: the fork could not be assembled (see above)"
  exit 2
fi
if ! python3 - "$FORK" 2>&1 <<'PY' | tee -a "$LOG"; then
import sys, torch, triton
import transformer_engine as te_pkg
import transformer_engine.pytorch  # noqa: F401  (loads upstream's core library)
from transformer_engine import _fork_build_info as info

if not te_pkg.__file__.startswith(sys.argv[1]):
    sys.exit(f"transformer_engine comes from {te_pkg.__file__}, not from the assembled fork")
info.check_patched_files()
cap = torch.cuda.get_device_capability()
print(f"fork {te_pkg.__file__} ({len(info.PATCHES)} patches, patched files intact)")
print(f"{torch.cuda.get_device_name()} sm{cap[0]}{cap[1]}, torch {torch.__version__},"
      f" triton {triton.__version__}, cuDNN {torch.backends.cudnn.version()}")
PY
  log "FAILED: transformer_engine is not the assembled fork, or does not import (see above)"
  exit 2
fi

log "pytest tests/pytorch/attention/test_exact_fp8_te.py $*"
cd "$ROOT"
timeout "${PYTEST_TIMEOUT:-480}" python3 -m pytest -p no:cacheprovider -q -rfEs \
  --junitxml="$OUT/junit.xml" tests/pytorch/attention/test_exact_fp8_te.py "$@" 2>&1 |
  tee -a "$LOG"
rc=${PIPESTATUS[0]}

log "summary (pytest exit status $rc)"
python3 - "$OUT/junit.xml" <<'PY' 2>&1 | tee -a "$LOG"
import collections, sys, xml.etree.ElementTree as ET

try:
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
except (OSError, ET.ParseError) as error:
    sys.exit(f"no junit report ({error}): pytest did not finish")
outcomes = collections.Counter()
rows = []
for case in cases:
    outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
    outcomes[outcome] += 1
    if outcome != "passed":
        detail = next(c for c in case if c.tag == outcome).get("message", "")
        rows.append((outcome, case.get("name"), detail.splitlines()[0][:110] if detail else ""))
print("| outcome | tests |\n|---|---|")
for outcome in ("passed", "failure", "error", "skipped"):
    print(f"| {outcome} | {outcomes[outcome]} |")
for outcome, name, detail in rows:
    print(f"{outcome:8s} {name}: {detail}")
PY
exit "$rc"
