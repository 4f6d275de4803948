/*
 * Epilogue of the sm90 mask-exact FP8 attention forward: O = (acc * (1 / l)) * u in the input
 * dtype (bf16 or fp16) and the LSE, as the Triton kernel writes them (Note [V scale in the
 * rescale]: acc is kept in units of u, the V scale of the last tile; l includes P_SCALE; 1 / l
 * correctly rounded once per row). Rows past the sequence's real length (padding) and rows
 * that see no key get O = 0 and LSE = -inf; rows past its allocation (span_q) are not written.
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

// tOrO: the thread's 64 x d fp32 accumulator; tOcO: its (row, d) coordinates in the tile;
// Element: the output dtype.
template <int kHeadDim, class Element, class FragO, class CoordO>
CUTLASS_DEVICE void store_output(AttentionParams const &p, Sequence const &s,
                                 OnlineSoftmax const &softmax, float u, FragO const &tOrO,
                                 CoordO const &tOcO, int head, int q0) {
  constexpr float kLn2 = 0.6931471805599453f;
  float *lse = p.lse + static_cast<int64_t>(head) * p.tokens_q + s.tok_q;  // [span_q] fp32
  float inv_l[2];  // 1 / l, correctly rounded (1 for a row that is not written from acc)
  bool seen[2];
  int row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row[h] = q0 + get<0>(tOcO(2 * h));
    const float l = quad_sum(softmax.l[h]);
    seen[h] = row[h] < s.len_q && l > 0.0f;
    inv_l[h] = __frcp_rn(seen[h] ? l : 1.0f);
    if (row[h] < s.span_q && (threadIdx.x & 3) == 0) {
      lse[row[h]] = seen[h] ? (softmax.m[h] + log2f(l) - kLog2PScale) * kLn2 : -INFINITY;
    }
  }
  // Each row's output pointer once: the thread's columns are get<1>(tOcO(v)) = col0 + a
  // constant of v, so every store below takes an immediate offset, predicated on its row (a
  // branch per store made the epilogue ~4 % of the kernel's time at s = 8k, 2026-12-07).
  const int col0 = get<1>(tOcO(0));
  uint16_t *out = static_cast<uint16_t *>(p.out) + s.out0 + static_cast<int64_t>(head) * kHeadDim;
  uint16_t *row_out[2];
  bool write[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    write[h] = row[h] < s.span_q;
    row_out[h] = out + static_cast<int64_t>(row[h]) * p.out_stride_seq + col0;
  }
#pragma unroll
  for (int v = 0; v < size(tOrO); v += 2) {
    const int h = (v >> 1) & 1;
    // acc / l (acc / l <= 448: no overflow), then the unit of the accumulator; 0 for a row that
    // sees no key (a select)
    const float o0 = seen[h] ? (tOrO(v) * inv_l[h]) * u : 0.0f;
    const float o1 = seen[h] ? (tOrO(v + 1) * inv_l[h]) * u : 0.0f;
    if (write[h]) {
      *reinterpret_cast<uint32_t *>(row_out[h] + (get<1>(tOcO(v)) - col0)) =
          pack_16bit_pair<Element>(o0, o1);
    }
  }
}

// thd: the grid covers p.num_q_tiles * kQTile rows of each sequence (the longest real one); the
// rows of a longer (padded) allocation past them are padding: O = 0 and LSE = -inf, written by
// the consumers of the sequence's query tile 0 (thread t of 256: 16 bytes of a row at a time).
template <int kHeadDim>
CUTLASS_DEVICE void store_rows_past_grid(AttentionParams const &p, Sequence const &s, int head,
                                         int mma_thread) {
  const int first = p.num_q_tiles * kQTile;
  float *lse = p.lse + static_cast<int64_t>(head) * p.tokens_q + s.tok_q;
  uint16_t *out = static_cast<uint16_t *>(p.out) + s.out0 + static_cast<int64_t>(head) * kHeadDim;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks of a row
  for (int i = mma_thread; i < (s.span_q - first) * kChunks; i += kMmaThreads) {
    const int row = first + i / kChunks;
    *reinterpret_cast<uint4 *>(out + row * p.out_stride_seq + 8 * (i % kChunks)) =
        uint4{0, 0, 0, 0};
    if (i % kChunks == 0) lse[row] = -INFINITY;
  }
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_EPILOGUE_H_
