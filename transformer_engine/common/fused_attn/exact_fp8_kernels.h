/*
 * Launchers of the mask-exact FP8 quantization kernels (internal to the C API in
 * exact_fp8_quantize.cu, which validates every argument before calling them).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_KERNELS_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_KERNELS_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "transformer_engine/exact_fp8_quantize.h"

namespace transformer_engine {
namespace exact_fp8 {

/* The aligned layout of the transposed V outputs (NVTEExactFP8Chunks::columns) rounds each
 * sequence's span up to a multiple of kSpanColumns: 32 columns, one DRAM sector, so that chunks of
 * 32 tokens or more start and end on a sector and the casts write whole sectors (vt_layout.py). */
constexpr int kSpanColumns = 32;

/* Which scale each row kernel computes. See Note [Mask-exact FP8 scaling]. */
enum class RowRule {
  kPerToken,  // one current scale per (token, head)
  kMxfp8,     // one E8M0 code per 32 channels of a (token, head)
};

/* Options of the current-scaling rule (ignored by the MXFP8 rules). */
struct ScaleOptions {
  bool use_power_2_scales;
  float amax_epsilon;
};

/* Whether 16-byte vector loads may read the view: `data` 16-byte aligned and every stride that
 * matters (of a dimension longer than 1) a multiple of 8 elements. */
inline bool is_vectorizable(const NVTEExactFP8TokenView &x) {
  const bool aligned = reinterpret_cast<uintptr_t>(x.data) % 16 == 0;
  auto ok = [](int64_t extent, int64_t stride) { return extent <= 1 || stride % 8 == 0; };
  return aligned && ok(x.batch, x.stride_batch) && ok(x.seqlen, x.stride_seq) &&
         ok(x.heads, x.stride_head);
}

/* x -> data [heads, tokens, head_dim] (E4M3 bytes) and scales: per token fp32 scale_inv
 * [heads, tokens], MXFP8 E8M0 codes [heads, tokens, head_dim / 32]. */
cudaError_t launch_rowwise_cast(RowRule rule, const NVTEExactFP8TokenView &x, ScaleOptions opts,
                                uint8_t *data, void *scales, cudaStream_t stream);

/* launch_rowwise_cast(kPerToken) of a and of b in one launch (attention's Q and K): the views'
 * dtype, head_dim and batch alike (the caller checks). */
cudaError_t launch_per_token_cast_pair(const NVTEExactFP8TokenView &a, uint8_t *data_a,
                                       float *scale_inv_a, const NVTEExactFP8TokenView &b,
                                       uint8_t *data_b, float *scale_inv_b, ScaleOptions opts,
                                       cudaStream_t stream);

/* v -> data_t [heads, head_dim, data_t_stride] (E4M3 bytes) and scale_inv [heads, num_chunks]
 * fp32: one current scale per (head, chunk). */
cudaError_t launch_current_cast_transposed(const NVTEExactFP8TokenView &v,
                                           const NVTEExactFP8Chunks &chunks, ScaleOptions opts,
                                           uint8_t *data_t, int64_t data_t_stride, float *scale_inv,
                                           cudaStream_t stream);

/* v -> data_t [heads, head_dim, data_t_stride] (E4M3 bytes) and scales [heads, num_chunks,
 * head_dim] E8M0 codes: one per (head, chunk of 32 tokens, channel). */
cudaError_t launch_mxfp8_cast_transposed(const NVTEExactFP8TokenView &v,
                                         const NVTEExactFP8Chunks &chunks, uint8_t *data_t,
                                         int64_t data_t_stride, uint8_t *scales,
                                         cudaStream_t stream);

/* Offsets of a thd pack's sequences ([num_seqs + 1] int32 each, columns may be null): see
 * nvte_exact_fp8_sequence_offsets. */
cudaError_t launch_sequence_offsets(const int32_t *cu_seqlens, int num_seqs, int chunk,
                                    int32_t *cu_chunks, int32_t *columns, cudaStream_t stream);

}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_KERNELS_H_
