"""benchmarks/attention/bench_sm90_forward.py: the kernel-alone entries (the longest kernel of a
library call, testing.longest_kernel) and the ratios of its table (the GPU timings stood in for)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "attention"))

import bench_sm90_forward as bench  # noqa: E402

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.testing import (  # noqa: E402,E501
    longest_kernel,
)

MHA_8K = (2, 16, 16, 8192)


def test_longest_kernel_sums_each_name_over_the_calls():
    # two calls of a library forward: two casts, an amax reduction and the attention kernel each
    records = [("cast", 30.0), ("amax", 5.0), ("cast", 31.0), ("sdpa_fprop_fp8", 700.0)] * 2
    name, ms = longest_kernel(records, calls=2)
    assert name == "sdpa_fprop_fp8"
    assert ms == pytest.approx(0.7)
    # many short launches of one name outweigh one long kernel of another
    assert longest_kernel([("a", 100.0)] + [("b", 60.0)] * 2, calls=1)[0] == "b"


def test_longest_kernel_refuses_a_call_without_kernels():
    with pytest.raises(ValueError, match="no GPU kernel"):
        longest_kernel([], calls=10)


def test_the_kernel_entries_time_an_entry_that_exists():
    assert set(bench.KERNEL_OF) <= set(bench.ENTRIES)
    assert set(bench.KERNEL_OF.values()) <= set(bench.ENTRIES)


def _result(ms, tflops=1.0):
    return dict(ms=ms, tflops=tflops)


def test_the_table_compares_both_forwards_with_cudnns_fp8_kernel():
    results = {
        (MHA_8K, "cuda"): _result(1.00),
        (MHA_8K, "cuda kernel"): _result(0.80),
        (MHA_8K, "sdpa cudnn"): _result(1.10),
        (MHA_8K, "sdpa flash"): _result(1.20),
        (MHA_8K, "cuda profiled"): _result(0.82),
        (MHA_8K, "te delayed kernel"): _result(0.738),
    }
    row = next(line for line in bench.markdown(results, 1, "queued").splitlines() if "8k" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # cuda / best bf16 sdpa, exactness cost (no all-fp8 row), cuda and the profiled kernel of
    # cuda against cuDNN's FP8 kernel, profiled too (not "cuda kernel": timed otherwise)
    assert cells[-4:] == ["1.10x", "-", "0.74x", "0.90x"]


def test_the_table_leaves_the_cudnn_ratios_out_without_its_row():
    results = {(MHA_8K, "cuda"): _result(1.0), (MHA_8K, "cuda kernel"): _result(0.8)}
    row = next(line for line in bench.markdown(results, 1, "queued").splitlines() if "8k" in line)
    assert row.endswith("| - | - | - | - |")


def test_score_sign_families_put_the_rows_where_they_say():
    import bench_sm90_score_signs as signs

    def scores(family):
        q, k, _ = signs.score_sign_inputs(family, shape=(1, 256, 2, 128), device="cpu")
        return torch.einsum("bshd,bthd->bhst", q.double(), k.double())

    assert (scores("negative rows") < 0).all()
    mixed = scores("mixed rows")
    assert (mixed[:, :, ::16] < 0).all()
    assert (mixed.amax(dim=-1)[:, :, 1::16] > 0).all()  # the other rows reach positive maxima
    assert (scores("ordinary").amax(dim=-1) > 0).all()


def test_score_sign_table_gives_each_family_against_the_ordinary_inputs():
    import bench_sm90_score_signs as signs

    ms = {(m, f, e): 1.0 for m in signs.MASKS for f in signs.FAMILIES for e in signs.ENTRIES}
    ms[("causal", "negative rows", "cuda kernel")] = 1.03
    del ms[("no_mask", "mixed rows", "cuda")]
    lines = signs.markdown(ms, 3).splitlines()
    assert "| causal | cuda kernel | 1.000 | 1.030 (1.030x) | 1.000 (1.000x) |" in lines
    assert "| no_mask | cuda | 1.000 | 1.000 (1.000x) | - |" in lines


def test_the_table_names_its_head_dim():
    results = {(MHA_8K, "cuda kernel"): _result(0.8)}
    assert "causal bshd bf16, d=64;" in bench.markdown(results, 1, "queued", 64).splitlines()[0]
    assert "causal bshd bf16, d=128;" in bench.markdown(results, 1, "queued").splitlines()[0]
