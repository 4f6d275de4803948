#!/usr/bin/env bash
# GPU check of the sm_90a CUDA attention forward (exact_fp8/cuda/, fused_attn/exact_fp8_attention_sm90/),
# from the repository root of an H100/H200 machine:
#
#   OUT=/some/dir bash tools/gpu_sm90_check.sh
#
# The machine needs no network when the pinned CUTLASS wheel is at hand: put it in an offline
# folder first (python -m build_tools.fetch --cutlass --cache-dir build/artifacts, on a machine
# with network) and bring that folder along; NVTE_FORK_ARTIFACTS_DIR names another folder.
#
# 1. builds transformer_engine_exact_fp8 for sm_90 (the quantizers) and sm_90a (the attention
#    kernel) into build/exact_fp8_sm90/lib, and checks that it holds attention_sm90_fwd;
# 2. a smoke call (60 s limit: a hang is reported, not waited on): one causal and one no-mask
#    forward against the fp64 reference, errors printed;
# 3. the GPU tests tests/pytorch/attention/test_exact_fp8_attention_sm90.py;
# 4. the speed table (benchmarks/attention/bench_sm90_forward.py: s = 4k, 8k, 16k, b = 2,
#    h = 16, d = 128, causal, next to the Triton kernel and torch's BF16 SDPA), printed last.
# STEPS (default "build smoke tests speed") selects steps; ROUNDS the speed table's rounds.
# Logs: $OUT/log.txt (everything), $OUT/build.log, $OUT/smoke.log, $OUT/tests.log,
# $OUT/sm90_forward.{md,json}. Exit status: the first failing step's.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-build smoke tests speed}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: > "$LOG"
cd "$ROOT"
export PYTHONUNBUFFERED=1
EXT_DIR=$ROOT/build/exact_fp8_sm90
export PYTHONPATH=$EXT_DIR/lib:$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ -z "${NVTE_FORK_ARTIFACTS_DIR:-}" ] && [ -d "$ROOT/build/artifacts" ]; then
  export NVTE_FORK_ARTIFACTS_DIR=$ROOT/build/artifacts
fi
TEST_FILE=tests/pytorch/attention/test_exact_fp8_attention_sm90.py

source "$ROOT/tools/gpu_common.sh"
rc=0
fail() { log "FAILED: $*"; [ "$rc" -eq 0 ] && rc=1; }

log "environment"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
  nvcc --version | tail -n 2
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'capability', torch.cuda.get_device_capability())"
  python3 -c "import triton; print('triton', triton.__version__)" || echo "no triton"
  echo "CUTLASS wheel from: ${NVTE_FORK_ARTIFACTS_DIR:-the artifact cache (download)}"
} 2>&1 | tee -a "$LOG"

if has_step build; then
  log "build the extension: sm_90 quantizers + sm_90a attention kernel"
  start=$(date +%s)
  python3 -m build_tools.cmake_build --build-dir "$EXT_DIR/cmake" --install-dir "$EXT_DIR/lib" \
    --arch 90 > "$OUT/build.log" 2>&1 || fail "the extension did not build ($OUT/build.log)"
  tail -n 3 "$OUT/build.log" | tee -a "$LOG"
  log "build took $(( $(date +%s) - start )) s"
  python3 -c "import transformer_engine_exact_fp8 as m; assert hasattr(m, 'attention_sm90_fwd')" \
    2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "the module has no attention_sm90_fwd"
fi

if has_step smoke; then
  log "smoke call (60 s limit)"
  timeout 60 python3 - > "$OUT/smoke.log" 2>&1 <<'PY'
import torch
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.reference.attention import (
    reference_attention,
)
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    rel_frobenius_error,
)

print("backend_available('cuda'):", kernels.backend_available("cuda"))
gen = torch.Generator().manual_seed(0)
for mask, s in (("causal", 300), ("no_mask", 300), ("causal", 1024)):
    q, k, v = (torch.randn(2, s, 4, 128, generator=gen).bfloat16() for _ in range(3))
    kw = dict(recipe="current", qkv_format="bshd", attn_mask_type=mask)
    out, lse = kernels.attention_forward(q.cuda(), k.cuda(), v.cuda(), backend="cuda", **kw)
    torch.cuda.synchronize()
    ref = dict(qkv_format="bshd", attn_mask_type=mask)
    truth = reference_attention("bf16", q, k, v, **ref)
    fork = reference_attention("fork-current", q, k, v, **ref)
    print(
        f"{mask} s={s}: error vs fp64 {rel_frobenius_error(out.cpu(), truth.out):.3e}"
        f" (the rules' own {rel_frobenius_error(fork.out, truth.out):.3e}),"
        f" vs the rules {rel_frobenius_error(out.cpu(), fork.out):.3e},"
        f" max |lse - rules| {(lse.cpu().double() - fork.lse).abs().max():.3e},"
        f" finite {bool(torch.isfinite(out).all())}"
    )
PY
  smoke_rc=$?
  cat "$OUT/smoke.log" | tee -a "$LOG"
  [ "$smoke_rc" -eq 124 ] && log "the smoke call did not finish in 60 s (a hang?)"
  [ "$smoke_rc" -eq 0 ] || fail "smoke call (exit $smoke_rc)"
fi

if has_step tests; then
  log "GPU tests ($TEST_FILE, 900 s limit)"
  timeout 900 python3 -m pytest -q -p no:cacheprovider -rs "$TEST_FILE" > "$OUT/tests.log" 2>&1 ||
    fail "GPU tests ($OUT/tests.log)"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -n 20 | tee -a "$LOG"
  tail -n 1 "$OUT/tests.log" | tee -a "$LOG"
fi

if has_step speed; then
  log "speed table"
  timeout 600 python3 benchmarks/attention/bench_sm90_forward.py --out "$OUT" \
    --rounds "${ROUNDS:-3}" >> "$LOG" 2>&1 || fail "speed table"
  [ -f "$OUT/sm90_forward.md" ] && cat "$OUT/sm90_forward.md"
fi
exit "$rc"
