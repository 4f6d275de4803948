/*
 * Epilogue of the sm90 mask-exact FP8 attention forward: O = (acc / l) * u in the input dtype
 * (bf16 or fp16) and the LSE,
 * as the Triton kernel writes them (Note [V scale in the rescale]: acc is kept in units of u, the
 * V scale of the last tile; l includes P_SCALE). Rows past s_q are not written; rows that see no
 * key get O = 0 and LSE = -inf.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_EPILOGUE_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_EPILOGUE_H_

#include <cute/tensor.hpp>

#include "kernel_traits.h"
#include "params.h"
#include "softmax.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// tOrO: the thread's 64 x 128 fp32 accumulator; tOcO: its (row, d) coordinates in the tile;
// Element: the output dtype.
template <class Element, class FragO, class CoordO>
CUTLASS_DEVICE void store_output(AttentionParams const &p, OnlineSoftmax const &softmax, float u,
                                 FragO const &tOrO, CoordO const &tOcO, int batch, int head,
                                 int q0) {
  constexpr float kLn2 = 0.6931471805599453f;
  const int64_t t_q = static_cast<int64_t>(p.batch) * p.seqlen_q;
  float denom[2];
  bool seen[2];
  int row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row[h] = q0 + get<0>(tOcO(2 * h));
    const float l = quad_sum(softmax.l[h]);
    seen[h] = row[h] < p.seqlen_q && l > 0.0f;
    denom[h] = seen[h] ? l : 1.0f;
    if (row[h] < p.seqlen_q && (threadIdx.x & 3) == 0) {
      const float lse = seen[h] ? (softmax.m[h] + log2f(l) - kLog2PScale) * kLn2 : -INFINITY;
      p.lse[head * t_q + static_cast<int64_t>(batch) * p.seqlen_q + row[h]] = lse;
    }
  }
  uint16_t *out = static_cast<uint16_t *>(p.out);  // [b, s_q, h, d] 16-bit words
#pragma unroll
  for (int v = 0; v < 64; v += 2) {
    const int h = (v >> 1) & 1;
    if (row[h] >= p.seqlen_q) continue;
    float o0 = 0.0f, o1 = 0.0f;
    if (seen[h]) {  // correctly rounded division, then the unit of the accumulator
      o0 = __fdiv_rn(tOrO(v), denom[h]) * u;
      o1 = __fdiv_rn(tOrO(v + 1), denom[h]) * u;
    }
    const int64_t at = batch * p.out_stride_batch + row[h] * p.out_stride_seq +
                       static_cast<int64_t>(head) * kHeadDim + get<1>(tOcO(v));
    *reinterpret_cast<uint32_t *>(out + at) = pack_16bit_pair<Element>(o0, o1);
  }
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_EPILOGUE_H_
