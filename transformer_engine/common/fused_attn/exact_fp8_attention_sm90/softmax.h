/*
 * Online softmax of the sm90 mask-exact FP8 attention forward, and the conversion of P to the
 * register operand of the P.V WGMMA. Numerics: Note [Mask-exact FP8 scaling] and Note [V scale in
 * the rescale] (exact_fp8/formats.py), as the Triton kernel implements them:
 *
 *   s = (Q8 . K8^T)[r, n] * k_scale[n] * (q_scale[r] * softmax_scale * log2(e))   (log2 units)
 *   m' = max(m, max_n s),  m_ref = (m' == -inf ? 0 : m'),  alpha = exp2(m - m_ref)
 *   p = exp2(s - (m_ref - log2(P_SCALE)))      (P_SCALE * softmax numerator, <= P_SCALE)
 *   l = l * alpha + sum_n p
 *
 * Accumulator fragments here are those of a 64 x N F32 WGMMA (cute's CLayout_64xN): thread
 * (lane q = lane % 4) holds value v = c + 2 h + 4 j at row lane / 4 + 8 h (+ 16 warp) and column
 * 8 j + 2 q + c. Each thread thus owns two rows (h = 0, 1), each spread over the 4 lanes of a quad.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_SOFTMAX_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_SOFTMAX_H_

#include <cuda_fp8.h>

#include <cute/tensor.hpp>

#include "kernel_traits.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

CUTLASS_DEVICE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}

CUTLASS_DEVICE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// 2^x on the MUFU unit (what the Triton kernel's tl.math.exp2 compiles to; subnormals kept).
CUTLASS_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Row state of the online softmax for the two rows a thread owns.
struct OnlineSoftmax {
  float m[2];  // running max of s (log2 units); -inf until the row has seen a key
  float l[2];  // this thread's share of the running sum of p (quad_sum gives the row's)

  CUTLASS_DEVICE void init() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
    }
  }

  // s: the 64 scores of a 64 x 128 fragment in log2 units (-inf where masked); overwritten
  // with p. Returns alpha of each row in `alpha`.
  template <class Frag>
  CUTLASS_DEVICE void step(Frag &s, float (&alpha)[2]) {
    static_assert(decltype(size(s))::value == 64, "a 64 x 128 F32 accumulator fragment");
    float m_new[2] = {m[0], m[1]};
#pragma unroll
    for (int v = 0; v < 64; ++v) m_new[(v >> 1) & 1] = fmaxf(m_new[(v >> 1) & 1], s(v));
    float bias[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_new[h] = quad_max(m_new[h]);
      const float m_ref = m_new[h] == -INFINITY ? 0.0f : m_new[h];
      alpha[h] = fast_exp2(m[h] - m_ref);
      bias[h] = m_ref - kLog2PScale;
      m[h] = m_new[h];
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int v = 0; v < 64; ++v) {
      const int h = (v >> 1) & 1;
      s(v) = fast_exp2(s(v) - bias[h]);
      sum[h] += s(v);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
  }
};

// P (fp32, the 64 x 128 accumulator fragment of S) -> the E4M3 A operand of the P.V WGMMA
// (cute's ALayout_64x32 per 32 keys: word w of 4 E4M3 holds row half w & 1, keys
// 32 (w >> 2) + 16 ((w >> 1) & 1) + 4 q + {0..3}).
//
// Lane q of a quad holds keys 8 j' + 2 q + {0, 1} of each 32-key block but needs keys
// 4 q + {0..3} and 16 + 4 q + {0..3}: the key pairs move between the lanes of the quad with four
// shuffles per (block, row half). V8^T stays in its natural key order.
template <class FragS, class FragA>
CUTLASS_DEVICE void p_to_fp8_operand(FragS const &p, FragA &a) {
  static_assert(decltype(size(p))::value == 64 && decltype(size(a))::value == 64, "P fragments");
  uint32_t *words = reinterpret_cast<uint32_t *>(raw_pointer_cast(a.data()));
  const int lane = threadIdx.x & 31;
  const int q = lane & 3;
  const int src0 = (lane & ~3) | ((2 * q) & 3);
  const int src1 = (lane & ~3) | ((2 * q + 1) & 3);
  const uint32_t select = (q >> 1) ? 0x7632u : 0x5410u;  // high or low key pair of the words
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t pair[4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int v = 2 * h + 4 * (4 * kb + jj);
        pair[jj] = __nv_cvt_float2_to_fp8x2(make_float2(p(v), p(v + 1)), __NV_SATFINITE, __NV_E4M3);
      }
      const uint32_t lo = pair[0] | (pair[1] << 16);  // key pairs j' = 0, 1
      const uint32_t hi = pair[2] | (pair[3] << 16);  // key pairs j' = 2, 3
      const uint32_t x0 = __shfl_sync(0xffffffff, lo, src0);
      const uint32_t x1 = __shfl_sync(0xffffffff, lo, src1);
      const uint32_t y0 = __shfl_sync(0xffffffff, hi, src0);
      const uint32_t y1 = __shfl_sync(0xffffffff, hi, src1);
      words[4 * kb + h] = __byte_perm(x0, x1, select);
      words[4 * kb + 2 + h] = __byte_perm(y0, y1, select);
    }
  }
}

// P (fp32) -> the bf16 A operand of the boundary tiles' P.V WGMMA. cute's ALayout_64x16 per 16
// keys orders values as the accumulator does (value i of both is the same (row, key)).
template <class FragS, class FragA>
CUTLASS_DEVICE void p_to_bf16_operand(FragS const &p, FragA &a) {
  static_assert(decltype(size(p))::value == 64 && decltype(size(a))::value == 64, "P fragments");
#pragma unroll
  for (int v = 0; v < 64; ++v) a(v) = static_cast<KernelTraits::Bf16>(p(v));
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_SOFTMAX_H_
