#!/usr/bin/env bash
# The sm90 CUDA attention backward on an H100/H200, in one run, from a prebuilt extension:
#
#   OUT=/some/dir LIB=build/bwd/lib bash tools/gpu_sm90_bwd_check.sh
#
# LIB holds a built transformer_engine_exact_fp8 (python -m build_tools.cmake_build ...
# --install-dir LIB, for the GPU machine's Python). Steps (STEPS, default "smoke tests speed"):
#   smoke  one small backward through each backend, compared (catches a hang or a wrong layout
#          in seconds);
#   tests  tests/pytorch/attention/test_exact_fp8_backward_sm90.py (TESTS_K selects), then
#          test_exact_fp8_backward.py -k BACKWARD_K (default: the current-scaling checks that
#          take the CUDA backward, and the leaky controls on the Triton one);
#   speed  benchmarks/attention/bench_backward.py (ROUNDS, SPEED_ARGS), its table printed last;
#   profile  Nsight Compute (full set) on the backward kernel and the dQ store of one causal backward at
#          SHAPE (default 2,16,16,8192): $OUT/bwd.ncu-rep, its details page $OUT/ncu_bwd.txt;
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck on the backward kernels over
#          the small shapes of profile_sm90.py --backward --small ($OUT/sanitizer_*.txt).
# Logs: $OUT/log.txt, $OUT/tests_*.log, $OUT/attention_backward.md, $OUT/bench_backward.json.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu_out}
STEPS=${STEPS:-smoke tests speed}
LIB=$(cd "${LIB:?LIB: the build folder}" && pwd)
export PYTHONPATH=$LIB:$ROOT${PYTHONPATH:+:$PYTHONPATH}
source "$ROOT/tools/gpu_common.sh"
start_run
gpu_environment
rc=0

if has_step smoke; then
  log "smoke: one backward on each backend"
  timeout 120 python3 - >> "$LOG" 2>&1 <<'PY'
import torch
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8 import kernels
from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    rel_frobenius_error,
)
torch.manual_seed(0)
for mask, (b, s, h, hk) in (("causal", (2, 300, 4, 2)), ("no_mask", (1, 256, 2, 2))):
    q, do = (torch.randn(b, s, h, 128, device="cuda").bfloat16() for _ in range(2))
    k, v = (torch.randn(b, s, hk, 128, device="cuda").bfloat16() for _ in range(2))
    kw = dict(recipe="current", attn_mask_type=mask)
    out, lse = kernels.attention_forward(q, k, v, backend="cuda", **kw)
    c = kernels.attention_backward(q, k, v, out, do, lse, backend="cuda", **kw)
    torch.cuda.synchronize()
    t = kernels.attention_backward(q, k, v, out, do, lse, backend="triton", **kw)
    errs = [rel_frobenius_error(a.float().cpu(), b_.float().cpu()) for a, b_ in zip(c, t)]
    print(f"smoke {mask}: cuda vs triton rel. error dq, dk, dv = {errs}", flush=True)
import triton
for mask in ("no_mask", "causal"):  # one 8k timing of each backend (b = 2, h = 16)
    q, k, v, do = (torch.randn(2, 8192, 16, 128, device="cuda").bfloat16() for _ in range(4))
    kw = dict(recipe="current", attn_mask_type=mask)
    out, lse = kernels.attention_forward(q, k, v, backend="cuda", **kw)
    ms = {
        b: triton.testing.do_bench(
            lambda: kernels.attention_backward(q, k, v, out, do, lse, backend=b, **kw)
        )
        for b in ("cuda", "triton")
    }
    print(f"smoke {mask} 8k backward: cuda {ms['cuda']:.3f} ms, triton {ms['triton']:.3f} ms")
PY
  status=$?
  tail -n 3 "$LOG"
  [ $status -eq 0 ] || { log "smoke failed ($status): stopping"; exit 1; }
fi

if has_step tests; then
  log "tests: test_exact_fp8_backward_sm90.py ${TESTS_K:+-k $TESTS_K}"
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s -p no:cacheprovider -rfE \
    tests/pytorch/attention/test_exact_fp8_backward_sm90.py ${TESTS_K:+-k "$TESTS_K"} \
    > "$OUT/tests_sm90.log" 2>&1 || rc=1
  tail -n 3 "$OUT/tests_sm90.log" | tee -a "$LOG"
  k=${BACKWARD_K:-"(future_values or accuracy or deterministic or leaky or batch) and not through_te"}
  log "tests: test_exact_fp8_backward.py -k $k"
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -s -p no:cacheprovider -rfE \
    tests/pytorch/attention/test_exact_fp8_backward.py -k "$k" > "$OUT/tests_backward.log" 2>&1 \
    || rc=1
  grep -E "^exactness|^negative|^accuracy" "$OUT/tests_backward.log" >> "$LOG"
  tail -n 3 "$OUT/tests_backward.log" | tee -a "$LOG"
fi

if has_step speed; then
  log "speed: bench_backward.py --rounds ${ROUNDS:-2} ${SPEED_ARGS:---recipes current --no-alternatives}"
  timeout "${SPEED_TIMEOUT:-300}" python3 benchmarks/attention/bench_backward.py --out "$OUT" \
    --rounds "${ROUNDS:-2}" ${SPEED_ARGS:---recipes current --no-alternatives} >> "$LOG" 2>&1 \
    || rc=1
  [ -f "$OUT/attention_backward.md" ] && cat "$OUT/attention_backward.md"
fi
if has_step profile; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | tail -n 1)
  log "profile: ncu on the backward kernels at ${SHAPE:-2,16,16,8192}"
  timeout 300 "$NCU" --clock-control none --set full --import-source no \
    -k regex:attention_bwd --launch-skip 2 --launch-count 2 -f -o "$OUT/bwd" \
    python3 benchmarks/attention/profile_sm90.py --backward --calls 2 \
    --shape "${SHAPE:-2,16,16,8192}" > "$OUT/ncu.log" 2>&1 || rc=1
  "$NCU" -i "$OUT/bwd.ncu-rep" --page details > "$OUT/ncu_bwd.txt" 2>&1
  grep -E "attention_bwd|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Achieved Occupancy|Shared Memory|Tensor|Bank" \
    "$OUT/ncu_bwd.txt" | grep -v "^ *-" | head -n 60 | tee -a "$LOG"
fi
if has_step sanitize; then
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
    2> /dev/null | tail -n 1)
  for tool in memcheck racecheck synccheck; do
    timeout 240 "$SANITIZER" --tool "$tool" --kernel-name kns=attention_bwd \
      python3 benchmarks/attention/profile_sm90.py --backward --small \
      > "$OUT/sanitizer_$tool.txt" 2>&1 || rc=1
    log "sanitize $tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|finite False" \
      "$OUT/sanitizer_$tool.txt" | tail -n 2 | tr '\n' ' ')"
  done
fi
exit $rc
