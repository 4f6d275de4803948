"""The f16-score design study's emulation (benchmarks/attention/bench_f16_score_rules.py): its
roundings, its lanes, and its claims (the target-14 casts are the reference's rules-v2 casts
divided by 32; the first query tile, which has no FP8 tile, is the same in both variants)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks" / "attention"))

import bench_f16_score_rules as study  # noqa: E402


def test_f16_accumulation_rounds_after_each_k_step():
    q8 = torch.zeros(1, 1, 128, dtype=torch.float64)
    k8 = torch.zeros(1, 1, 128, dtype=torch.float64)
    q8[..., 0], k8[..., 0] = 2048.0, 1.0  # first k-step: 2048
    q8[..., 32], k8[..., 32] = 1.0, 1.0  # second: + 1, below f16's resolution at 2048
    q8[..., 64], k8[..., 64] = 3.0, 1.0  # third: + 3 -> 2052 (2051 rounds to even: 2052)
    got = study.f16_accumulate(q8, k8)
    assert got.item() == 2052.0  # 2048, then 2048 + 1 -> 2048, then 2048 + 3 -> 2052 (to even)
    q8[..., 64] = 1.0  # third: + 1 after 2048 + 1 rounded back to 2048: stays 2048
    assert study.f16_accumulate(q8, k8).item() == 2048.0  # exact sum 2050 is representable


def test_lane_sums_take_eight_values_a_lane_per_tile():
    p = torch.zeros(1, 1, 256, dtype=torch.float64)
    # lane (q = 1, c = 0, j & 1 = 0): keys 8 j + 2 + 0 for even j, in both tiles: 16 values
    keys = [tile * 128 + 8 * j + 2 for tile in (0, 1) for j in range(0, 16, 2)]
    p[..., keys] = 1.0
    assert study.lane_sums_f16(p, group=16).item() == 16.0
    # one lane past f16's integer range: 2048 + 1 + ... stays 2048 in f16, fp32 would not
    p.zero_()
    p[..., keys[0]] = 2048.0
    p[..., keys[1:]] = 1.0
    assert study.lane_sums_f16(p, group=16).item() == 2048.0
    p[..., 3] = 1.0  # another lane (q = 1, c = 1): added in fp32
    assert study.lane_sums_f16(p, group=16).item() == 2049.0


def test_target_14_casts_are_v2_divided_by_32():
    # entries within a factor 2 of their row's amax: none falls into E4M3's subnormals
    gen = torch.Generator().manual_seed(3)
    x = (torch.rand(64, 2, 128, generator=gen) + 1) * torch.randn(64, 2, 128, generator=gen).sign()
    x = x.bfloat16()
    x8_448, s_448 = (t.double() for t in study.per_token_cast_to_fp8(x))  # the reference's
    x8_14, s_14 = (t.double() for t in study.per_token_cast_target_14(x))
    assert torch.equal(x8_14 * 32, x8_448)
    assert torch.equal(s_14, s_448 * 32)
    assert x8_14.abs().max() <= study.F16_TARGET


def test_first_query_tile_is_the_same_and_later_ones_close():
    gen = torch.Generator().manual_seed(4)
    shape = (384, study.HEADS, study.HEAD_DIM)
    q, k, v = (
        (
            (torch.rand(*shape, generator=gen) + 1) * torch.randn(*shape, generator=gen).sign()
        ).bfloat16()
        for _ in range(3)
    )
    v2 = study.emulate("v2", q, k, v)
    f16 = study.emulate("f16 scores", q, k, v)
    assert torch.equal(f16[:128], v2[:128])  # the boundary tile only: the fp32 path in both
    assert not torch.equal(f16[128:], v2[128:])
    ref = study.reference(q, k, v)
    err_v2 = (v2 - ref).norm() / ref.norm()
    err_f16 = (f16 - ref).norm() / ref.norm()
    assert err_f16 <= 1.05 * err_v2  # the study's verdict, on a small case
