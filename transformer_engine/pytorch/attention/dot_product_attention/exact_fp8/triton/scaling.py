"""In-kernel FP8 scale rules (Triton JIT helpers), bit for bit those of formats.py on the GPU.

The attention kernel quantizes Q itself (one pass fewer over Q) with these, and decodes the E8M0
scale codes of MXFP8 K and V. Each function mirrors the formats.py function of the same name:

  scale_from_amax            formats.compute_scale_from_amax (div_rn: TE divides with IEEE rounding)
  cast_to_e4m3               formats.cast_to_e4m3 (RNE, satfinite, NaN kept)
  e8m0_from_amax             formats.float_to_e8m0
  e8m0_to_fp32               formats.e8m0_to_float (code 0 = 2^-127, 255 = NaN)
  e8m0_reciprocal            formats.e8m0_reciprocal
  per_token_cast_to_fp8      quantize_reference.per_token_cast_to_fp8 on [rows, d]
  per_block_cast_to_mxfp8    quantize_reference.per_block_cast_to_mxfp8_rowwise on [rows, 32]

Triton's CPU interpreter casts fp32 to float8e4nv wrongly (see docs/attention_kernel.md), so the
casts are checked on the GPU; the integer code paths are checked under the interpreter too.
"""

import triton
import triton.language as tl

from ..formats import E4M3_MAX as _E4M3_MAX, FP32_MAX as _FP32_MAX

__all__ = [
    "abs_ignoring_nan",
    "scale_from_amax",
    "cast_to_e4m3",
    "e8m0_from_amax",
    "e8m0_to_fp32",
    "e8m0_reciprocal",
    "per_token_cast_to_fp8",
    "per_block_cast_to_mxfp8",
]

E4M3_MAX = tl.constexpr(_E4M3_MAX)
E4M3_MAX_RCP = tl.constexpr(1.0 / _E4M3_MAX)  # rounded to fp32 where used, as formats.py does
FP32_MAX = tl.constexpr(_FP32_MAX)
FP32_MIN_SUBNORMAL_E8M0_BITS = tl.constexpr(0x400000)  # 2^-127, the value of E8M0 code 0
FP32_NAN_BITS = tl.constexpr(0x7FC00000)


@triton.jit
def abs_ignoring_nan(x):
    """|x| with NaN read as 0: amax reductions drop NaN like CUDA's fmaxf."""
    a = tl.abs(x)
    return tl.where(a != a, 0.0, a)


@triton.jit
def scale_from_amax(amax, amax_epsilon, power_2):
    """FP8 scale (x_fp8 = x * scale) from an fp32 amax, element-wise (TE's rule).

    power_2 (bool or int): clear the mantissa, rounding the scale down to a power of two.
    """
    amax = tl.where(amax < amax_epsilon, amax_epsilon, amax)
    scale = tl.math.div_rn(E4M3_MAX, amax)
    scale = tl.where(scale == float("inf"), FP32_MAX, scale)
    scale_pow2 = (scale.to(tl.int32, bitcast=True) & -0x800000).to(tl.float32, bitcast=True)
    scale = tl.where(power_2 != 0, scale_pow2, scale)
    degenerate = (amax == float("inf")) | (amax != amax) | (amax == 0.0)
    return tl.where(degenerate, 1.0, scale)


@triton.jit
def cast_to_e4m3(x):
    """fp32 -> E4M3, round to nearest even, saturating to +-448; NaN stays NaN."""
    return tl.clamp(x, -E4M3_MAX, E4M3_MAX, propagate_nan=tl.PropagateNan.ALL).to(tl.float8e4nv)


@triton.jit
def e8m0_from_amax(amax):
    """E8M0 code (int32) of an MX block from its amax: biased exponent of amax / 448 rounded up."""
    val = amax * E4M3_MAX_RCP
    bits = val.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    round_up = (mantissa > 0) & (exponent != 0xFE) & ((exponent != 0) | (mantissa > 0x400000))
    code = exponent + round_up.to(tl.int32)
    code = tl.where(val == 0.0, 0, code)
    code = tl.where(val == float("inf"), 0xFE, code)
    return tl.where(val != val, 0xFF, code)


@triton.jit
def e8m0_to_fp32(code):
    """2^(code - 127) in fp32, exactly: code 0 is the subnormal 2^-127, code 255 is NaN."""
    code = code.to(tl.int32)
    bits = tl.where(code == 0, FP32_MIN_SUBNORMAL_E8M0_BITS, code << 23)
    bits = tl.where(code == 255, FP32_NAN_BITS, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e8m0_reciprocal(code):
    """2^(127 - code) in fp32: the multiplier that brings a block into E4M3 range."""
    bits = tl.maximum(254 - code, 0) << 23
    bits = tl.where(code == 254, FP32_MIN_SUBNORMAL_E8M0_BITS, bits)
    bits = tl.where(code == 255, FP32_NAN_BITS, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def per_token_cast_to_fp8(x, amax_epsilon, power_2):
    """x [rows, d] fp32 -> (data [rows, d] e4m3, scale_inv [rows] fp32), amax over d.

    See Note [Mask-exact FP8 scaling]: one scale per token, so a row's scale is its own business.
    """
    scale = scale_from_amax(tl.max(abs_ignoring_nan(x), axis=1), amax_epsilon, power_2)
    data = cast_to_e4m3(x * scale[:, None])
    return data, tl.math.div_rn(1.0, scale)


@triton.jit
def per_block_cast_to_mxfp8(x):
    """x [rows, 32] fp32 -> (data [rows, 32] e4m3, code [rows] int32): one MX block per row.

    See Note [Mask-exact FP8 scaling]: the block runs along d, inside one token.
    """
    code = e8m0_from_amax(tl.max(abs_ignoring_nan(x), axis=1))
    data = cast_to_e4m3(x * e8m0_reciprocal(code)[:, None])
    return data, code
