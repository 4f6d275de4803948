/*
 * Parameters of one sm90 mask-exact FP8 attention backward, in one struct, and the kernel's TMA
 * descriptors. Shapes: see exact_fp8_attention_sm90.h
 * (NVTEExactFP8AttentionSm90BwdArgs).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_PARAMS_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_PARAMS_H_

#include <stdint.h>

#include <cute/tensor.hpp>

#include "backward_traits.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

struct BackwardParams {
  // [3, h, b, rows_pad] fp32: the forward's row scale (q_scale * softmax_scale * log2 e), the
  // LSE in log2 units and D = rowsum(dO * O) of each (head, sample, row); (1, +inf, 0) past s_q
  const float *row_values;
  // [h_kv, b, keys_pad] fp32: scale_inv of each (kv-head, sample, key) of K8; 0 past s_kv
  const float *k_scale;
  void *dq;  // [b, s_q, h, d] bf16 or fp16, strides dq_stride_* (heads d apart)
  void *dk;  // [b, s_kv, h_kv, d] bf16 or fp16, strides dkv_stride_* (heads d apart)
  void *dv;  // [b, s_kv, h_kv, d] bf16 or fp16, as dk
  int64_t dq_stride_batch;
  int64_t dq_stride_seq;
  int64_t dkv_stride_batch;
  int64_t dkv_stride_seq;
  // [h, b, row_blocks, 2, 8, 128, 4] fp32: the dQ accumulator, dQ / softmax_scale of every
  // (head, sample, 64-row block) in the consumer threads' fragment order (Note [Ordered dQ
  // accumulation]); any contents on entry (the first contribution stores)
  float *dq_accum;
  // [h, b, row_blocks] int32: contributions added so far to each block's accumulator; 0 on
  // entry
  int *dq_count;
  int row_blocks;  // ceil(s_q / kBwdStep)
  int batch;
  int seqlen_q;
  int seqlen_kv;
  int heads;
  int heads_kv;
  int rows_pad;  // s_q rounded up to kBwdTile
  int keys_pad;  // s_kv rounded up to kBwdTile
  bool causal;   // top-left causal (row i sees keys j <= i) or no mask
  float softmax_scale;
};

// Every global operand as cute's (rows, d, head, sample): Q8, Q_dq [h, b * s_q, d], K8, K_dq
// [h_kv, b * s_kv, d], V [b, s_kv, h_kv, d], dO [b, s_q, h, d]. Per sample, so that a tile's
// rows past the sample's length arrive as 0 (TMA bounds). The 16-bit operands' tensor maps are
// typed bf16 and move fp16 words as they are.
struct BackwardGmem {
  using Fp8 = BackwardTraits::Fp8;
  using Bf16 = BackwardTraits::Bf16;
  using Shape4 = Shape<int32_t, int32_t, int32_t, int32_t>;
  using Stride4 = Stride<int64_t, _1, int64_t, int64_t>;
  template <class T, class SmemLayout>
  using Tma = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<T const *>(nullptr)), Shape4{}, Stride4{}),
      SmemLayout{}));
  using TmaFp8Tile = Tma<Fp8, BackwardTraits::SmemFp8Tile>;
  using TmaFp8Step = Tma<Fp8, BackwardTraits::SmemFp8Step>;
  using Tma16Tile = Tma<Bf16, BackwardTraits::Smem16Tile>;
  using Tma16Step = Tma<Bf16, BackwardTraits::Smem16Step>;
};

struct BackwardKernelParams {
  BackwardParams p;
  BackwardGmem::Shape4 q_shape;         // (s_q, d, h, b)
  BackwardGmem::Shape4 kv_shape;        // (s_kv, d, h_kv, b)
  BackwardGmem::TmaFp8Tile tma_k8;      // K8 [128 keys, 128 d]
  BackwardGmem::Tma16Tile tma_v;      // V [128 keys, 128 d]
  BackwardGmem::Tma16Tile tma_k_dq;   // K_dq [128 keys, 128 d]
  BackwardGmem::TmaFp8Step tma_q8;      // Q8 [64 rows, 128 d]
  BackwardGmem::Tma16Step tma_q_dq;   // Q_dq [64 rows, 128 d]
  BackwardGmem::Tma16Step tma_d_out;  // dO [64 rows, 128 d]
};

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_PARAMS_H_
