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
#include "tile_scheduler.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// tOrO: the thread's 64 x d fp32 accumulator; tOcO: its (row, d) coordinates in the tile;
// Element: the output dtype.
// o_rows: the warp's staging rows in shared memory (SharedStorage::o_rows).
template <int kHeadDim, class Element, class FragO, class CoordO>
CUTLASS_DEVICE void store_output(AttentionParams const &p, Sequence const &s,
                                 OnlineSoftmax const &softmax, float u, FragO const &tOrO,
                                 CoordO const &tOcO, int head, int q0, uint16_t *o_rows) {
  constexpr float kLn2 = 0.6931471805599453f;
  float *lse = p.lse + static_cast<int64_t>(head) * p.tokens_q + s.tok_q;  // [span_q] fp32
  float inv_l[2];  // 1 / l, correctly rounded (1 for a row that is not written from acc)
  bool seen[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q0 + get<0>(tOcO(2 * h));  // the thread's row of row half h
    const float l = quad_sum(softmax.l[h]);
    // l is 0 exactly for a row that sees nothing; a NaN l (from a NaN score the row sees, a
    // NaN in Q or in a visible key's K) counts as seen, so the row's output and LSE are NaN,
    // as BF16 attention's are
    seen[h] = row < s.len_q && l != 0.0f;
    inv_l[h] = __frcp_rn(seen[h] ? l : 1.0f);
    if (row < s.span_q && (threadIdx.x & 3) == 0) {
      lse[row] = seen[h] ? (softmax.m[h] + log2f(l) - kLog2PScale) * kLn2 : -INFINITY;
    }
  }
  // O in the output dtype, 64 columns at a time through the warp's rows in shared memory
  // (o_rows: [16 rows, 64 + 8] 16-bit): stmatrix writes the accumulator layout's 16-bit pairs
  // as rows, then each lane loads 16 bytes of a row and stores them to global memory, four rows
  // of 128 bytes a warp instruction, where the accumulator layout itself stores 8 rows of 16
  // bytes a 4-byte store (docs/attention_kernel_sm90.md, item 21).
  const int lane = static_cast<int>(thread_index_per_tile() & 31);
  const int warp_row0 = q0 + get<0>(tOcO(0)) - (lane >> 2);  // the warp's first row
  uint16_t *out = static_cast<uint16_t *>(p.out) + s.out0 + static_cast<int64_t>(head) * kHeadDim;
  const uint32_t buf = cute::cast_smem_ptr_to_uint(o_rows);
  // stmatrix: lane i gives row i % 8 of matrix i / 8; matrix k of a store is the 8 x 8 block of
  // row half k % 2 and column group 2 m + k / 2 of the chunk
  const uint32_t st_addr =
      buf + (((lane >> 3) & 1) * 8 + (lane & 7)) * kEpiloguePitch * 2 + (lane >> 4) * 16;
#pragma unroll
  for (int c = 0; c < kHeadDim / kEpilogueCols; ++c) {
    __syncwarp();  // the warp's reads of the last chunk (or tile) are done
#pragma unroll
    for (int m = 0; m < kEpilogueCols / 16; ++m) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int h = k & 1, g = kEpilogueCols / 8 * c + 2 * m + (k >> 1);  // row half, group
        const int v = 4 * g + 2 * h;
        // acc / l (acc / l <= 448: no overflow), then the unit of the accumulator; 0 for a row
        // that sees no key (a select)
        const float o0 = seen[h] ? (tOrO(v) * inv_l[h]) * u : 0.0f;
        const float o1 = seen[h] ? (tOrO(v + 1) * inv_l[h]) * u : 0.0f;
        w[k] = pack_16bit_pair<Element>(o0, o1);
      }
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                       st_addr + m * 32),
                   "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kEpilogueRows / 4; ++k) {
      const int r = (lane >> 3) + 4 * k;  // the staged row
      uint4 data;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(data.x), "=r"(data.y), "=r"(data.z), "=r"(data.w)
                   : "r"(buf + r * kEpiloguePitch * 2 + (lane & 7) * 16)
                   : "memory");
      const int row = warp_row0 + r;
      if (row < s.span_q) {
        *reinterpret_cast<uint4 *>(out + static_cast<int64_t>(row) * p.out_stride_seq +
                                   kEpilogueCols * c + 8 * (lane & 7)) = data;
      }
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
