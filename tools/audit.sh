#!/usr/bin/env bash
# The causality audit: runs on the GPU when there is one (and the fork's kernels import),
# otherwise on the CPU through the reference numerics. Arguments go to te-fp8-causality-audit
# (`bash tools/audit.sh --help` lists them). With --plot, matplotlib is installed when missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
bash "$ROOT/tools/setup-env.sh"
for arg in "$@"; do
  case "$arg" in
    --plot | --plot=*)
      if ! "$PY" -c "import matplotlib" 2>/dev/null; then
        echo "== --plot: installing matplotlib" >&2
        "$PY" -m pip install -q matplotlib
      fi
      break
      ;;
  esac
done
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit "$@"
