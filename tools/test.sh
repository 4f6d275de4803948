#!/usr/bin/env bash
# The whole test suite. On a machine without a GPU the GPU tests skip with a reason.
# Steps: install test dependencies; check that the patch series applies to the pinned upstream
# wheel; compile the CUDA sources for sm_90 and sm_100a (the Hopper attention kernel for sm_90a,
# against the pinned CUTLASS headers) when nvcc is present; run pytest.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
bash tools/setup-env.sh --tests
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

echo "== patch series against the pinned upstream wheel"
"$PY" -m build_tools.assemble --check

if command -v nvcc >/dev/null 2>&1; then
  echo "== CUDA sources compile for sm_90 and sm_100a (the attention kernel for sm_90a)"
  "$PY" -m build_tools.cmake_build --compile-only --arch 90 --arch 100a
else
  echo "== nvcc not found: CUDA compile check skipped"
fi

echo "== pytest"
# The folders are named: pytest does not recurse into folders called build by default.
"$PY" -m pytest -q -p no:cacheprovider tests/cpu tests/build tests/pytorch "$@"
