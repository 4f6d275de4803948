/*
 * TMA descriptors of a 16-bit token view (the V operand of the TMA V cast,
 * exact_fp8_transposed_current_tma.cu).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TENSOR_MAP_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TENSOR_MAP_H_

#include <cuda.h>

#include "transformer_engine/exact_fp8_quantize.h"

namespace transformer_engine {
namespace exact_fp8 {

constexpr int kBoxChannels = 64;  // channels of a box: 128 bytes, the 128-byte swizzle's row

/* A rank-4 map of the view [batch, seqlen, heads, head_dim] (dimensions innermost first:
 * head_dim, heads, seqlen, batch) whose box is [1 sample, `rows` tokens, 1 head, 64 channels]:
 * `rows` rows of 128 bytes in shared memory, 128-byte swizzled (the 16-byte piece k of row r at
 * piece k ^ (r % 8) of a 1024-byte aligned box), zeros for tokens past seqlen. False when the
 * driver has no tensor maps or the view cannot be described (16-bit elements only; data 16-byte
 * aligned, strides multiples of 16 bytes).*/
bool make_token_box_map(const NVTEExactFP8TokenView &v, int rows, CUtensorMap *map);

}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TENSOR_MAP_H_
