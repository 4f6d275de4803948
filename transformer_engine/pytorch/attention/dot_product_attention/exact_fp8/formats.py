"""Constants and element-wise casts of the FP8 formats used by mask-exact FP8 attention.

Everything here is pure PyTorch and runs on CPU and GPU alike. The casts reproduce the rounding of
TE's CUDA quantizers bit for bit, so they serve as the oracle for the CUDA and Triton kernels.

# Note [Mask-exact FP8 scaling]
#
# Invariant: for every output row i, O[i] is, bit for bit, a function of Q[i] and of K[j], V[j]
# for the positions j that the attention mask lets row i see, and of nothing else.
#
# A quantization scale is a reduction (an amax) over some set of elements. If that set contains a
# position that row i may not see, the masked value can change the FP8 representation of a visible
# value (by re-rounding it, or by pushing it under the smallest subnormal), and O[i] changes. So:
#
#   * Q and K get one scale per (batch, token, head), amax over the head dim d only. The scales
#     factor out of Q.K^T exactly as a row and a column scale of the product.
#   * V (current scaling, rules v2) gets ONE scale per (batch, kv-head, chunk of C =
#     V_CHUNK_CURRENT = 128 tokens): amax over the chunk's tokens and all d channels of the
#     kv-head, a scalar per FP8 KV tile. MXFP8 V keeps the format's own block: one E8M0 code per
#     (batch, kv-head, chunk of C = MX_BLOCK = 32 tokens, channel). Chunks start at each
#     sequence's first token, so they never cross a sequence (thd) or a sample (bshd/sbhd).
#   * A query tile (Q_TILE rows) uses the FP8 copy of a KV tile (KV_TILE tokens, a whole number of
#     V chunks) only if every row of the tile may see every position of the KV tile. Otherwise that
#     (query tile, KV tile) pair uses the unquantized V (the input dtype) under the ordinary mask.
#     This splits each V scale reduction at the prefix boundaries: no scale used for row i reduces
#     over a position row i cannot see. Rows past a sequence's real length do not count.
#   * P (the softmax numerator) is cast to FP8 with the fixed scale P_SCALE, which depends on no
#     data.
#
#   * The backward (docs/backward.md, Note [Backward of the FP8 forward] in te/autograd.py)
#     recomputes the scores from these same per-token Q8, K8 and scales; V, dO and O enter it
#     unquantized, so it adds no scale of its own.
#
# Only data-independent choices (mask geometry, shapes and the constants below) decide which
# representation a value gets. Q_TILE, KV_TILE and the chunk sizes are constants of the format,
# not tuning knobs: a kernel may use other block sizes internally, but must make the same
# FP8/unquantized decision per (Q_TILE, KV_TILE) pair.
#
# Why one V scale per (chunk, kv-head) rather than per (chunk, kv-head, channel) (rules v1, the
# fork's first rule, kept in the reference as path "fork-current-v1" for the accuracy benchmark):
# the scalar folds into the per-row rescale the online softmax already does (Note [V scale in
# the rescale]), so it costs nothing per element and needs no second [rows, d] accumulator; the
# per-channel scale was the most expensive part of the kernel's inner loop and kept 128-row
# programs out of the registers. Its error is that of v1 within 2% (fp64 emulation, three input
# families) and below upstream's one-amax rule; docs/mask_exact_fp8.md has the H200 table.
#
# Note [V scale in the rescale]
#
# A current-scaling FP8 KV tile j contributes P8_j . V8_j * s_j to a row's numerator, s_j the
# scale_inv of its V chunk (a scalar: rules v2). The kernel keeps the accumulator in units of
# the last tile's V scale u (u = 1 before any FP8 tile, and for tiles with unquantized V):
#
#     acc <- acc * (alpha * (u / s_j)) + P8_j . V8_j,   u <- s_j,   at the end O = (acc * r) * u
#
# with r = 1 / l correctly rounded once per row (a correctly rounded division per element brings
# a slow-path branch each: 7 % of the sm90 kernel's warp samples at s = 8k; the two roundings
# more stay far below the output's bf16 or fp16 step), and alpha the online softmax's per-row
# factor. u / s_j is one fp32 division per tile (within 2 ulp, exactly 1 for equal units: a
# deterministic function of the two scales) and
# alpha * (u / s_j) one multiply per row: the per-element work is the rescale that online softmax
# does anyway, plus one fp32 add of the tile's fresh P8_j . V8_j product (accumulating inside the
# MMA instead made ptxas serialize the kernel's wgmmas, and keeps the sum in the FP8 MMA's
# reduced accumulation precision). Exactness: the sequence of u's is that of the
# tiles a program visits, all of which every row of its query tile sees (or unquantized), so
# it depends on nothing a row may not see; which representation (FP8 or unquantized) a value
# gets is decided before, by the tile map, never by a scale.
# Range: 1 / FP32_MAX <= s <= 2^128 / 448 (a finite amax; 2^120 with power-of-two scales), so
# u / s_j overflows only for chunk amaxes 2^128 apart or more; the kernel clamps it to FP32_MAX,
# so that a row whose alpha underflowed to 0 gets 0 * FP32_MAX = 0, not 0 * inf = NaN (the first
# ratio, 1 / s_j, is the chunk's scale: finite). acc / l <= 448, so the final (acc * r) * u has
# the output's own magnitude. acc is bounded by l * 448 in units of u (P8 <= P_SCALE,
# |V8| <= 448): it overflows only if a row's true numerator exceeds FP32_MAX * s_j, i.e. when a
# tile of tiny V (amax < ~2^-60) follows tiles whose weighted values are ~2^60 larger; such rows
# give +-inf (or NaN) where BF16 attention stays finite. Contributions below 2^-149 * u
# underflow to 0: values ~2^140 below the current tile's largest V, far below what the E4M3 cast
# of that tile keeps. The roundings of u / s_j and of the products differ from the reference's
# exact arithmetic by a few fp32 ulps per tile (tested within tolerance, not bitwise).
#
# Note [Two-level P.V accumulation]
#
# The running numerator acc is an fp32 value that no FP8 MMA ever accumulates into: each tile's
# P8_j . V8_j (or bf16 P . V on a boundary tile) is computed into a fresh accumulator (the MMA
# starts from zero) and added to acc on the CUDA cores, acc <- acc * factor + T_j, one FFMA per
# element (the rescale of Note [V scale in the rescale] fused with the add). Hopper's FP8 MMA
# adds its products to the accumulator it is given with only ~13-14 bits kept (DeepSeek-V3's
# report says ~14); fed the running sum, every later tile's contribution loses the low bits
# that the sum's magnitude pushes out. Measured on the H200 (benchmarks/results/
# attention_forward_sm90.md, 2026-12-04): the sm90 kernel that accumulated across tiles inside
# the WGMMA had relative error 4.3e-2 at s = 4k and 1.6e-1 at 16k (2.5e-1 on the last 1024 rows)
# for V ~ N(4, 1) against fp64 attention, where the Triton kernel (a fresh dot per tile) has
# 3.1e-3 and 2.9e-3; zero-mean V hid it (the running sum stays small). A tile's own product
# (128 keys) still runs in the MMA's precision, as in every FP8 attention kernel. The row sums l
# are fp32 sums of the fp32 p on the CUDA cores for the same reason (a ones column in the P.V
# MMA, l = sum of P8, gave 3.1e-1 on the last 1024 rows at 16k).
"""

import torch

__all__ = [
    "RECIPES",
    "check_recipe",
    "E4M3_MAX",
    "MX_BLOCK",
    "V_CHUNK_CURRENT",
    "Q_TILE",
    "KV_TILE",
    "P_SCALE",
    "FP32_MAX",
    "cast_to_e4m3",
    "compute_scale_from_amax",
    "float_to_e8m0",
    "e8m0_to_float",
    "e8m0_reciprocal",
]

RECIPES = ("current", "mxfp8")
"""The two rule sets: "current" (Float8CurrentScaling) and "mxfp8" (MXFP8BlockScaling)."""

E4M3_MAX = 448.0
"""Largest finite E4M3 value."""

MX_BLOCK = 32
"""Elements per E8M0 scale in MXFP8 (fixed by the OCP MX format)."""

V_CHUNK_CURRENT = 128
"""Tokens per V scale (one per kv-head) for current scaling. See Note [Mask-exact FP8 scaling].

Equal to KV_TILE, so that an FP8 KV tile has one scalar V scale, folded into the accumulator's
rescale (Note [V scale in the rescale])."""

Q_TILE = 128
"""Query rows that share one FP8/unquantized decision per KV tile."""

KV_TILE = 128
"""Key/value positions that share one FP8/unquantized decision. A multiple of both chunk sizes."""

P_SCALE = 256.0
"""Fixed power-of-two scale of P in [0, 1] before the FP8 cast: P = 1 maps to 256, exactly."""

FP32_MAX = torch.finfo(torch.float32).max


def check_recipe(recipe: str) -> None:
    """Raise ValueError unless `recipe` names one of RECIPES."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")


_E4M3_MAX_RCP = torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)  # float(1/448), as TE rounds it


def cast_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> E4M3, round to nearest even, saturating to +-448 (CUDA's satfinite cast).

    NaN stays NaN.
    """
    assert x.dtype == torch.float32
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def compute_scale_from_amax(
    amax: torch.Tensor, *, use_power_2_scales: bool = False, amax_epsilon: float = 0.0
) -> torch.Tensor:
    """FP8 scale (x_fp8 = x * scale) from an fp32 amax, element-wise, as TE's current scaling does.

    Rule (TE's compute_scale_from_amax): amax is floored at amax_epsilon; an amax that is 0, inf or
    NaN gives scale 1; otherwise scale = 448 / amax rounded to nearest, an infinite result becomes
    FP32_MAX, and with use_power_2_scales the mantissa bits are cleared (rounding down to a power of
    two, so that x * scale never exceeds 448).
    """
    amax = amax.float()
    amax = torch.where(amax < amax_epsilon, torch.full_like(amax, amax_epsilon), amax)
    scale = torch.full_like(amax, E4M3_MAX) / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FP32_MAX), scale)
    if use_power_2_scales:
        scale = (scale.view(torch.int32) & -0x800000).view(torch.float32)  # keep sign + exponent
    degenerate = torch.isinf(amax) | torch.isnan(amax) | (amax == 0)
    return torch.where(degenerate, torch.ones_like(scale), scale)


def float_to_e8m0(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 scale code (uint8) of an MX block from its fp32 amax, as TE's MXFP8 quantizer does.

    The code is the biased exponent of amax * float(1/448), rounded up to the next power of two
    (so the block's largest element fits under 448 after division); 2^-127 (code 0) is kept for
    values at most 2^-127, NaN gives 255 and inf 254.
    """
    val = amax.float() * _E4M3_MAX_RCP
    bits = val.view(torch.int32).to(torch.int64)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    code = exponent + round_up.to(torch.int64)
    code = torch.where(val == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isinf(val), torch.full_like(code, 0xFE), code)
    code = torch.where(torch.isnan(val), torch.full_like(code, 0xFF), code)
    return code.to(torch.uint8)


def e8m0_to_float(code: torch.Tensor) -> torch.Tensor:
    """2^(code - 127) in fp32; code 0 is the subnormal 2^-127 and code 255 is NaN."""
    code = code.to(torch.int32)
    out = (code << 23).view(torch.float32)
    out = torch.where(code == 0, torch.full_like(out, 2.0**-127), out)
    return torch.where(code == 255, torch.full_like(out, float("nan")), out)


def e8m0_reciprocal(code: torch.Tensor) -> torch.Tensor:
    """2^(127 - code) in fp32: the multiplier that brings a block into E4M3 range (255: NaN)."""
    code = code.to(torch.int32)
    out = ((254 - code).clamp(min=0) << 23).view(torch.float32)
    out = torch.where(code == 254, torch.full_like(out, 2.0**-127), out)
    return torch.where(code == 255, torch.full_like(out, float("nan")), out)
