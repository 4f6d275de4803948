"""The V casts' division by a launch-time divisor (InvariantDivisor, exact_fp8_transposed.cuh)
equals integer division, checked on the host: the header's divide() is __host__ __device__, so
nvcc compiles this check without a GPU; skipped without nvcc."""

import subprocess
from pathlib import Path

import pytest

from build_tools import env

pytestmark = pytest.mark.skipif(env.find_nvcc() is None, reason="needs nvcc (the CUDA compiler)")

CHECK = r"""
#include <cstdio>
#include "fused_attn/exact_fp8_transposed.cuh"
using transformer_engine::exact_fp8::transposed::InvariantDivisor;

static int failures = 0;
static void check(int d, int n) {
  const InvariantDivisor div = InvariantDivisor::of(d);
  if (div.divide(n) != n / d || static_cast<int>(div.divisor) != d) {
    if (failures++ < 10) std::printf("d=%d n=%d: %d, not %d\n", d, n, div.divide(n), n / d);
  }
}

int main() {
  const int top = 2147483647;  // 2^31 - 1, the largest n
  for (int d = 1; d <= 4096; ++d) {
    for (int n = 0; n < 3 * d + 3; ++n) check(d, n);  // every n near the first quotients
    for (int k = 0; k < 64; ++k) {
      const int n = top - k * 33331;
      check(d, n);
      check(d, n - n % d);      // a multiple of d
      check(d, n - n % d - 1);  // just below one
    }
  }
  const int large[] = {65535, 65536, 65537, 1 << 20, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, top};
  for (int d : large) {
    for (int n : {0, 1, d - 1, d, d < top ? d + 1 : top, top - 1, top}) check(d, n);
  }
  std::printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
"""


def test_divide_equals_integer_division(tmp_path):
    source = tmp_path / "check.cu"
    source.write_text(CHECK)
    binary = tmp_path / "check"
    root = Path(__file__).resolve().parents[2] / "transformer_engine" / "common"
    cmd = [str(env.find_nvcc()), "-std=c++17", "-O2", "-I", str(root / "include"), "-I", str(root)]
    compiled = subprocess.run(cmd + [str(source), "-o", str(binary)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr[-4000:]
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "0 failures" in result.stdout
