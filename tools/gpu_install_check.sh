#!/usr/bin/env bash
# The install a user runs (issue 23, item 9), on a GPU machine without network: `pip install .` of
# this repository into a fresh virtual environment, the pinned artifacts from a local folder
# (NVTE_FORK_ARTIFACTS_DIR), then upstream's import-time version checks, the fork's own import and
# build record, and the causality audit through TE, all from that install (the checkout is not on
# the path: every check runs from another directory).
#
#   OUT=/some/dir bash tools/gpu_install_check.sh
#
# Needs on that machine: the pinned upstream artifacts in $TE_STAGE_DIR (default /tmp/stage, as
# shared/device/upstream-te.sh stages them: the pure-Python wheel, the cu13 core wheel, the
# transformer_engine_torch sdist and upstream's small runtime wheels), the CUTLASS wheel in
# build/artifacts with every runtime dependency of upstream's that neither the stage nor the
# system Python holds (on the H200 of 2026-12-02: importlib-metadata; the artifacts step names
# them, `python -m build_tools.offline_deps`; fetch them into build/artifacts with
# `pip download -d build/artifacts --only-binary=:all: --python-version 3.12 ...` on a machine
# with network: every wheel there joins the folder), a CUDA build of PyTorch with nvcc, and the build tools (setuptools, wheel,
# cmake, ninja, pybind11) in the system Python, which the environment sees
# (--system-site-packages: PyTorch is not reinstalled). Upstream TE's staged environment
# (/tmp/te-env.sh) must NOT be sourced: the install is what is tested.
#
# Steps (each logged to $OUT/<step>.log, a summary table printed last):
#   artifacts  one folder with every artifact, checked by `python -m build_tools.fetch --offline`,
#              and upstream's runtime dependencies by `python -m build_tools.offline_deps`
#   venv       python3 -m venv --system-site-packages $VENV (default /tmp/fork-venv); where that
#              venv does not see PyTorch (python3 itself a venv), a .pth file adds its folder
#   install    NVTE_FORK_ARTIFACTS_DIR=... NVTE_FORK_REQUIRE_EXT=1 pip install
#              --no-build-isolation --no-index --find-links <folder> .
#   checks     python -m transformer_engine._fork_build_info; import transformer_engine.pytorch
#              (upstream's sanity and version checks); the fork's package and its CUDA extension
#              with the sm_90a kernel; where each was imported from
#   audit      te-fp8-causality-audit --json $OUT/audit_install.json (the console script)
# STEPS (default "artifacts venv install checks audit") selects steps: a later call may run
# "checks audit" on the environment an earlier one installed.
# Exit status: 0 if every step passed, else 1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STAGE=${TE_STAGE_DIR:-/tmp/stage}
VENV=${VENV:-/tmp/fork-venv}
ARTIFACTS=${ARTIFACTS:-/tmp/fork-artifacts}
STEPS=${STEPS:-artifacts venv install checks audit}
mkdir -p "$OUT"
SUMMARY=$OUT/install_summary.txt
: > "$SUMMARY"
failed=0
export PYTHONUNBUFFERED=1
unset PYTHONPATH

step() {  # step NAME LIMIT_S COMMAND...: run it (bash -c) with its log, record its status
  local name=$1 limit=$2 start rc
  shift 2
  case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
  start=$(date +%s)
  timeout "$limit" bash -c "$*" > "$OUT/$name.log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && failed=1
  echo "| $name | $rc | $(( $(date +%s) - start )) s | $(tail -n 1 "$OUT/$name.log" | cut -c1-90) |" |
    tee -a "$SUMMARY"
  return "$rc"
}

# torch's own cuDNN (the sdist's headers and, at run time, its library before a system copy)
CUDNN=$(python3 -c "import nvidia.cudnn, os; print(list(nvidia.cudnn.__path__)[0])" 2> /dev/null)

step artifacts 60 "mkdir -p '$ARTIFACTS' && cp '$STAGE'/*.whl '$STAGE'/*.tar.gz '$ARTIFACTS'/ &&
  cp '$ROOT'/build/artifacts/*.whl '$ARTIFACTS'/ &&
  cd '$ROOT' && python3 -m build_tools.fetch --cuda 13 --offline '$ARTIFACTS' &&
  python3 -m build_tools.fetch --cutlass --offline '$ARTIFACTS' &&
  python3 -m build_tools.offline_deps --cuda 13 '$ARTIFACTS' && ls '$ARTIFACTS'"
# Where python3 is itself a virtual environment, --system-site-packages reaches its base
# interpreter and not PyTorch: a .pth file then adds the folder PyTorch comes from (after the
# venv's own site-packages, so what the install puts there wins).
TORCH_SITE=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
step venv 60 "rm -rf '$VENV' && python3 -m venv --system-site-packages '$VENV' &&
  { '$VENV/bin/python' -c 'import torch' 2> /dev/null ||
    echo '$TORCH_SITE' > \$('$VENV/bin/python' -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/system_torch.pth; } &&
  '$VENV/bin/python' -c 'import torch, sys; print(sys.prefix, torch.__version__)'"
# NVTE_PYTORCH_FORCE_BUILD: upstream's sdist compiles at once instead of first trying to
# download a prebuilt wheel (no network here)
step install 900 "cd '$ROOT' && NVTE_FORK_ARTIFACTS_DIR='$ARTIFACTS' NVTE_FORK_REQUIRE_EXT=1 \
  NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=\$(nproc) CPATH='$CUDNN/include':/usr/include \
  '$VENV/bin/python' -m pip install --no-build-isolation --no-index --find-links '$ARTIFACTS' . &&
  '$VENV/bin/python' -m pip list 2> /dev/null | grep -i -E 'transformer|nvidia-cutlass'"
# CUDNN_HOME: upstream's loader takes PyTorch's cuDNN, not the toolkit's older copy (which disables
# TE's FusedAttention: CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED; docs/building.md)
RUNTIME="cd /tmp && CUDNN_HOME='$CUDNN' LD_LIBRARY_PATH='$CUDNN/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
step checks 120 "$RUNTIME '$VENV/bin/python' -m transformer_engine._fork_build_info &&
  $RUNTIME '$VENV/bin/python' - <<'PY'
import sys
import torch
import transformer_engine as te
import transformer_engine.pytorch  # upstream's import-time sanity and version checks
import transformer_engine_exact_fp8 as ext
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels
assert te.__file__.startswith(sys.prefix), f'transformer_engine from {te.__file__}, not the venv'
assert ext.__file__.startswith(sys.prefix), f'the extension from {ext.__file__}'
print('transformer_engine', te.__version__, 'from', te.__file__)
print('extension', ext.__file__, 'sm_90a kernel:', hasattr(ext, 'attention_sm90_fwd'))
print('kernel backend chosen here:', kernels.select_backend(), torch.cuda.get_device_name())
PY"
step audit 600 "$RUNTIME '$VENV/bin/te-fp8-causality-audit' --json '$OUT/audit_install.json' &&
  test -s '$OUT/audit_install.json'"

echo "== install check (step | exit | time | last line)"
cat "$SUMMARY"
exit "$failed"
