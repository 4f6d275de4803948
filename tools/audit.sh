#!/usr/bin/env bash
# The causality audit: runs on the GPU when there is one (and the fork's kernels import),
# otherwise on the CPU through the reference numerics. Arguments go to te-fp8-causality-audit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/tools/setup-env.sh"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit "$@"
