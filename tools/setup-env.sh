#!/usr/bin/env bash
# Install what the tests and the CPU audit need, on a fresh machine or a GPU machine.
# PyTorch: keep an existing installation (a CUDA build stays); otherwise the CPU build 2.13.0.
set -euo pipefail
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
if [ "${1:-}" = "--tests" ]; then
  "$PY" -m pip install -q -r "$(dirname "$0")/../requirements-test.txt"
fi
