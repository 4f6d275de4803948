"""Element-wise FP8 rules against independent fp32 bit-level oracles (numpy, math)."""

import math

import numpy as np
import pytest
import torch

from transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.formats import (
    E4M3_MAX,
    FP32_MAX,
    cast_to_e4m3,
    compute_scale_from_amax,
    e8m0_reciprocal,
    e8m0_to_float,
    float_to_e8m0,
)


def _e4m3_values():
    """All finite non-negative E4M3 values, from the format definition (bias 7, 3 mantissa bits)."""
    vals = [m / 8 * 2.0**-6 for m in range(8)]  # subnormals
    vals += [(1 + m / 8) * 2.0**e for e in range(-6, 9) for m in range(8)]
    return sorted(v for v in vals if v <= E4M3_MAX)


def _rne_oracle(x: float) -> float:
    """Round |x| to the nearest E4M3 value, ties to the even mantissa, saturating at 448."""
    grid = _e4m3_values()
    a = min(abs(x), E4M3_MAX)
    best = min(grid, key=lambda g: (abs(g - a), grid.index(g) % 2))
    return math.copysign(best, x)


def test_cast_to_e4m3_rounds_to_nearest_even_and_saturates():
    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(2000, generator=gen)
            * 2.0 ** torch.randint(-12, 10, (2000,), generator=gen),
            torch.tensor([0.0, -0.0, 2.0**-9, 2.0**-10, 3 * 2.0**-11, 448.0, 464.0, 1e6, -1e6]),
        ]
    ).float()
    got = cast_to_e4m3(x).float()
    want = torch.tensor([_rne_oracle(float(v)) for v in x])
    assert torch.equal(got, want)


def test_cast_to_e4m3_nan_and_inf():
    got = cast_to_e4m3(torch.tensor([float("nan"), float("inf"), -float("inf")])).float()
    assert math.isnan(got[0]) and got[1] == 448 and got[2] == -448


@pytest.mark.parametrize("pow2", [False, True])
def test_compute_scale_from_amax_matches_te_rule(pow2):
    amax = np.array([1.0, 3.0, 448.0, 1e-3, 7e-39, 1e-45, 0.0, np.inf, np.nan, 2.5e38], np.float32)
    got = compute_scale_from_amax(torch.from_numpy(amax), use_power_2_scales=pow2).numpy()
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        want = np.float32(448.0) / amax  # fp32 division, round to nearest
    want = np.where(np.isinf(want), np.float32(FP32_MAX), want).astype(np.float32)
    if pow2:
        want = (want.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    want = np.where(np.isinf(amax) | np.isnan(amax) | (amax == 0), np.float32(1), want)
    assert np.array_equal(got, want.astype(np.float32))
    if pow2:
        finite = want[np.isfinite(want)]
        assert np.all(np.frexp(finite)[0] == 0.5)  # powers of two


def test_compute_scale_amax_epsilon_floor():
    """amax below epsilon (zero included) is raised to epsilon before the division (fp32)."""
    got = compute_scale_from_amax(torch.tensor([0.0, 1e-6, 2.0]), amax_epsilon=1e-3)
    floor = float(np.float32(448.0) / np.float32(1e-3))
    assert torch.equal(got, torch.tensor([floor, floor, 224.0], dtype=torch.float32))


def _e8m0_oracle(amax: float) -> int:
    """Smallest power of two >= float32(amax * float32(1/448)) as a biased exponent, clamped to
    [2^-127, 2^127]; NaN -> 255, inf -> 254."""
    val = np.float32(amax) * np.float32(1.0 / 448.0)
    if np.isnan(val):
        return 255
    if np.isinf(val):
        return 254
    if val == 0:
        return 0
    e = math.ceil(math.log2(float(val)))
    if 2.0 ** (e - 1) >= float(val):  # guard against log2 rounding
        e -= 1
    return int(min(max(e + 127, 0), 254))


def test_float_to_e8m0_rounds_the_exponent_up():
    gen = torch.Generator().manual_seed(1)
    amax = torch.cat(
        [
            torch.rand(3000, generator=gen)
            * 2.0 ** torch.randint(-140, 120, (3000,), generator=gen),
            torch.tensor([448.0, 449.0, 1.0, 2.0**-20, 2.0**-127 * 448, 3e38, 0.0, float("inf")]),
            torch.tensor([float("nan")]),
        ]
    ).float()
    got = float_to_e8m0(amax)
    want = torch.tensor([_e8m0_oracle(float(a)) for a in amax], dtype=torch.uint8)
    assert torch.equal(got, want)


def test_e8m0_decoding_edge_codes():
    codes = torch.tensor([0, 1, 126, 127, 128, 253, 254, 255], dtype=torch.uint8)
    dec = e8m0_to_float(codes)
    rcp = e8m0_reciprocal(codes)
    assert dec[0] == 2.0**-127 and dec[3] == 1.0 and dec[6] == 2.0**127 and torch.isnan(dec[7])
    assert rcp[0] == 2.0**127 and rcp[3] == 1.0 and rcp[6] == 2.0**-127 and torch.isnan(rcp[7])
    assert torch.equal((dec[:7].double() * rcp[:7].double()), torch.ones(7, dtype=torch.float64))
