/*
 * Element-wise rules of the mask-exact FP8 quantizers: the current-scaling scale, the E8M0 code
 * of an MX block, the saturating E4M3 cast, and 16-byte loads of the 16-bit inputs.
 *
 * Each rule matches its namesake in exact_fp8/formats.py bit for bit (the reference the tests
 * compare against). Which elements feed an amax is decided by the kernels, following
 * Note [Mask-exact FP8 scaling] (exact_fp8/formats.py). Division and multiplication use the
 * round-to-nearest intrinsics, so no compiler flag (fast math, FMA contraction, flushing of
 * subnormals) can change a scale.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_NUMERICS_CUH_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_NUMERICS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>

namespace transformer_engine {
namespace exact_fp8 {

constexpr float kE4M3Max = 448.0f;
constexpr float kE4M3MaxRcp = 1.0f / 448.0f;  // float(1 / 448), the factor of TE's MXFP8 rule
constexpr uint32_t kFp32MaxBits = 0x7F7FFFFFu;
constexpr uint32_t kFp32InfBits = 0x7F800000u;
constexpr int kMxBlock = 32;  // elements per E8M0 code (OCP MX format)
constexpr int kVecElems = 8;  // 16-bit elements per 16-byte vector

/* Bit casts and correctly rounded fp32 arithmetic on the device, their IEEE equivalents on the
 * host (so the scalar rules can be checked against the reference without a GPU). */
__host__ __device__ __forceinline__ uint32_t bits_of(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t bits;
  memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

__host__ __device__ __forceinline__ float float_of(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float x;
  memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

__host__ __device__ __forceinline__ float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

__host__ __device__ __forceinline__ bool is_nan(float x) { return x != x; }

/* TE's current-scaling rule: scale = 448 / max(amax, amax_epsilon), rounded to nearest; an
 * infinite quotient becomes FP32_MAX; amax 0, inf or NaN gives 1; with use_power_2_scales the
 * mantissa is cleared. See Note [Mask-exact FP8 scaling] for which elements make up `amax`. */
__host__ __device__ __forceinline__ float compute_scale_from_amax(float amax,
                                                                  bool use_power_2_scales,
                                                                  float amax_epsilon) {
  if (amax < amax_epsilon) amax = amax_epsilon;
  const uint32_t magnitude = bits_of(amax) & 0x7FFFFFFFu;
  if (magnitude == 0u || magnitude >= kFp32InfBits) return 1.0f;
  float scale = div_rn(kE4M3Max, amax);
  if (bits_of(scale) == kFp32InfBits) scale = float_of(kFp32MaxBits);
  if (use_power_2_scales) scale = float_of(bits_of(scale) & 0xFF800000u);
  return scale;
}

/* TE stores the reciprocal of the scale, rounded to nearest. */
__host__ __device__ __forceinline__ float scale_inverse(float scale) { return div_rn(1.0f, scale); }

/* E8M0 code of an MX block from its amax: the biased exponent of amax * float(1/448), rounded up
 * to the next power of two (so the block's largest element fits under 448), except that a
 * quotient of at most 2^-127 keeps code 0 (2^-127); inf gives 254 and NaN 255.
 * See Note [Mask-exact FP8 scaling] for which elements make up `amax`. */
__host__ __device__ __forceinline__ uint8_t float_to_e8m0(float amax) {
  const float val = mul_rn(amax, kE4M3MaxRcp);
  const uint32_t bits = bits_of(val);
  if (is_nan(val)) return 0xFF;
  if ((bits & 0x7FFFFFFFu) == kFp32InfBits) return 0xFE;
  if (val == 0.0f) return 0;
  const uint32_t exponent = (bits >> 23) & 0xFFu;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  const bool round_up =
      mantissa > 0u && exponent != 0xFEu && !(exponent == 0u && mantissa <= 0x400000u);
  return static_cast<uint8_t>(exponent + (round_up ? 1u : 0u));
}

/* 2^(127 - code): the multiplier that brings an MX block into E4M3 range (255: NaN). */
__host__ __device__ __forceinline__ float e8m0_reciprocal(uint8_t code) {
  if (code == 0xFF) return float_of(0x7FC00000u);
  if (code == 0xFE) return float_of(0x00400000u);  // 2^-127
  return float_of(static_cast<uint32_t>(254 - code) << 23);
}

/* NaN in E4M3 keeps the input's sign bit, as torch's float8_e4m3fn conversion does. */
__host__ __device__ __forceinline__ uint32_t e4m3_nan(float x) {
  return 0x7Fu | ((bits_of(x) >> 24) & 0x80u);
}

/* Two fp32 -> E4M3 (low byte: lo), round to nearest even, saturating at +-448, inf included.
 * NaN gives the E4M3 NaN 0x7F (its sign is set by cast4_to_e4m3). */
__host__ __device__ __forceinline__ uint32_t cast2_to_e4m3(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

/* Whether any byte of four E4M3 codes is NaN (0x7F or 0xFF; satfinite maps no number there):
 * the low 7 bits plus one carry into bit 7 only for 0x7F. */
__host__ __device__ __forceinline__ bool has_e4m3_nan(uint32_t bytes) {
  return (((bytes & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0u;
}

/* NaN codes take the sign of their input (as torch's float8_e4m3fn conversion does): the GPU's
 * multiply returns a positive NaN, so the sign is read from the unscaled input. */
__host__ __device__ __forceinline__ uint32_t with_nan_signs(uint32_t bytes, const float *x) {
  for (int i = 0; i < 4; ++i) {
    if (is_nan(x[i])) bytes = (bytes & ~(0xFFu << (8 * i))) | (e4m3_nan(x[i]) << (8 * i));
  }
  return bytes;
}

/* cast4_to_e4m3 for four values known not to be NaN (the NaN check is the caller's). */
__host__ __device__ __forceinline__ uint32_t cast4_to_e4m3_no_nan(const float *x,
                                                                  float multiplier) {
  const uint32_t lo = cast2_to_e4m3(mul_rn(x[0], multiplier), mul_rn(x[1], multiplier));
  const uint32_t hi = cast2_to_e4m3(mul_rn(x[2], multiplier), mul_rn(x[3], multiplier));
  return lo | (hi << 16);
}

/* Four fp32 times `multiplier` -> four E4M3 bytes, little-endian in a 32-bit word. `multiplier`
 * is finite and positive, so a product is NaN exactly when its input is. */
__host__ __device__ __forceinline__ uint32_t cast4_to_e4m3(const float *x, float multiplier) {
  const uint32_t bytes = cast4_to_e4m3_no_nan(x, multiplier);
  return has_e4m3_nan(bytes) ? with_nan_signs(bytes, x) : bytes;
}

__device__ __forceinline__ float2 to_float2(uint32_t packed, __nv_bfloat16) {
  __nv_bfloat162 pair;
  *reinterpret_cast<uint32_t *>(&pair) = packed;
  return __bfloat1622float2(pair);
}

__device__ __forceinline__ float2 to_float2(uint32_t packed, __half) {
  __half2 pair;
  *reinterpret_cast<uint32_t *>(&pair) = packed;
  return __half22float2(pair);
}

/* Eight consecutive 16-bit elements as raw bits: one 16-byte load, or eight element loads when
 * the address is not known to be 16-byte aligned. kNoL1Allocate: the 16-byte load does not
 * allocate its line in L1 (ld.global.nc.L1::no_allocate; the V cast's small grids,
 * exact_fp8_transposed_current.cu). */
template <typename T, bool kVectorized, bool kNoL1Allocate = false>
__device__ __forceinline__ uint4 load_vec8(const T *src) {
  if constexpr (kVectorized && kNoL1Allocate) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(src));
    return r;
  } else if constexpr (kVectorized) {
    return __ldg(reinterpret_cast<const uint4 *>(src));
  } else {
    const uint16_t *p = reinterpret_cast<const uint16_t *>(src);
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = static_cast<uint32_t>(__ldg(p + 2 * i)) |
             (static_cast<uint32_t>(__ldg(p + 2 * i + 1)) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

/* Raw bits of eight 16-bit elements -> fp32 (exact). */
template <typename T>
__device__ __forceinline__ void unpack_vec8(const uint4 &raw, float *out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = to_float2(w[i], T{});
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

/* max over |x| of eight values; fmaxf drops NaN, so a NaN element decides no scale. */
__device__ __forceinline__ float abs_max8(const float *x, float running) {
#pragma unroll
  for (int i = 0; i < kVecElems; ++i) running = fmaxf(running, fabsf(x[i]));
  return running;
}

/* Per-half max of |x| over two packed 16-bit values (bf16x2 or f16x2 bits), exact: |x| clears
 * the sign bits, and max.{bf16,f16}x2, like fmaxf, returns the other operand when one is NaN, so
 * a NaN decides no amax (a running max that starts at 0 is never NaN). */
template <typename T>
__device__ __forceinline__ uint32_t abs_max2(uint32_t running, uint32_t packed);

template <>
__device__ __forceinline__ uint32_t abs_max2<__nv_bfloat16>(uint32_t running, uint32_t packed) {
  __nv_bfloat162 a;
  __nv_bfloat162 b;
  *reinterpret_cast<uint32_t *>(&a) = running;
  *reinterpret_cast<uint32_t *>(&b) = packed & 0x7FFF7FFFu;
  const __nv_bfloat162 m = __hmax2(a, b);
  return *reinterpret_cast<const uint32_t *>(&m);
}

template <>
__device__ __forceinline__ uint32_t abs_max2<__half>(uint32_t running, uint32_t packed) {
  __half2 a;
  __half2 b;
  *reinterpret_cast<uint32_t *>(&a) = running;
  *reinterpret_cast<uint32_t *>(&b) = packed & 0x7FFF7FFFu;
  const __half2 m = __hmax2(a, b);
  return *reinterpret_cast<const uint32_t *>(&m);
}

/* Per-half max of |x| over two packed 16-bit values that keeps NaN (one instruction: the
 * magnitudes' max, its sign the xor of the operands' signs, NaN if either is NaN). After a fold,
 * abs_max2_sign_cleared(running) holds each half's max |x|, or NaN where a NaN was folded in:
 * the fold equals abs_max2's whenever no NaN is met, so a NaN-free group (the common case) needs
 * no other check. */
template <typename T>
__device__ __forceinline__ uint32_t abs_max2_keep_nan(uint32_t running, uint32_t packed);

template <>
__device__ __forceinline__ uint32_t abs_max2_keep_nan<__nv_bfloat16>(uint32_t running,
                                                                     uint32_t packed) {
  uint32_t m;
  asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(running), "r"(packed));
  return m;
}

template <>
__device__ __forceinline__ uint32_t abs_max2_keep_nan<__half>(uint32_t running, uint32_t packed) {
  uint32_t m;
  asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(m) : "r"(running), "r"(packed));
  return m;
}

__device__ __forceinline__ uint32_t abs_max2_sign_cleared(uint32_t running) {
  return running & 0x7FFF7FFFu;
}

/* max over the `width` lanes of an aligned group (width a power of two, at most 32). */
__device__ __forceinline__ float group_max(float value, int width) {
  for (int offset = 1; offset < width; offset <<= 1) {
    value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  }
  return value;
}

}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_NUMERICS_CUH_
