"""The GPU timing helpers that the benchmarks share (exact_fp8.testing): what each one counts.

Timed work is torch.cuda._sleep, a kernel that spins for a number of clock cycles, so the expected
ratios hold whatever the GPU: a sleep of N cycles takes about N / clock, the same clock for all.
"""

import time

import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (
    gpu_ms_after,
    gpu_ms_per_call,
)

if not torch.cuda.is_available():
    pytest.skip("the GPU timing helpers need a CUDA GPU", allow_module_level=True)

LONG, SHORT = 20_000_000, 2_000_000  # clock cycles: ~10 ms and ~1 ms at H100 / H200 clocks


def test_gpu_ms_after_times_fn_alone_on_what_prepare_returned():
    seen = []

    def prepare():
        torch.cuda._sleep(LONG)
        return len(seen)

    def fn(prepared):
        seen.append(prepared)
        torch.cuda._sleep(SHORT)

    long_ms = gpu_ms_per_call(lambda: torch.cuda._sleep(LONG), warmup=1, calls=3)
    ms = gpu_ms_after(prepare, fn, warmup=1, calls=3)
    assert seen == [0, 1, 2, 3]  # one prepare per call, its result handed to fn
    # fn's sleep is a tenth of prepare's: counted, and prepare's not
    assert 0.05 * long_ms < ms < 0.3 * long_ms, (ms, long_ms)


def test_gpu_ms_after_does_not_count_the_host_time_of_fn():
    def fn(_):
        time.sleep(0.02)  # host work before the launch, as a slow Python layer has
        torch.cuda._sleep(SHORT)

    long_ms = gpu_ms_per_call(lambda: torch.cuda._sleep(LONG), warmup=1, calls=3)
    ms = gpu_ms_after(lambda: None, fn, warmup=1, calls=3)
    # the 20 ms on the host pass while the GPU runs the helper's sleep kernel
    assert ms < 0.3 * long_ms, (ms, long_ms)
