/*
 * The TMA descriptors of a token view (exact_fp8_tensor_map.h).
 */
#include <stdint.h>

#include "exact_fp8_driver.h"
#include "exact_fp8_tensor_map.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

constexpr int64_t kElemBytes = 2;  // bf16 / fp16

/* The byte stride of a dimension for the map: any multiple of 16 where the dimension has one
 * index (its stride is never used), else the view's; -1 when the map cannot use it. */
int64_t map_stride(int64_t extent, int64_t stride) {
  if (extent <= 1) return 16;
  const int64_t bytes = stride * kElemBytes;
  return bytes > 0 && bytes % 16 == 0 && bytes < (int64_t{1} << 40) ? bytes : -1;
}

}  // namespace

bool make_token_box_map(const NVTEExactFP8TokenView &v, int rows, CUtensorMap *map) {
  const EncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr || v.batch < 1 || v.seqlen < 1 || v.head_dim % kBoxChannels != 0 ||
      reinterpret_cast<uintptr_t>(v.data) % 16 != 0) {
    return false;
  }
  const int64_t strides[3] = {map_stride(v.heads, v.stride_head),
                              map_stride(v.seqlen, v.stride_seq),
                              map_stride(v.batch, v.stride_batch)};
  for (const int64_t s : strides) {
    if (s < 0) return false;
  }
  // innermost first: channels, heads, tokens, samples
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(v.head_dim), static_cast<cuuint64_t>(v.heads),
                              static_cast<cuuint64_t>(v.seqlen), static_cast<cuuint64_t>(v.batch)};
  const cuuint64_t byte_strides[3] = {static_cast<cuuint64_t>(strides[0]),
                                      static_cast<cuuint64_t>(strides[1]),
                                      static_cast<cuuint64_t>(strides[2])};
  const cuuint32_t box[4] = {kBoxChannels, 1, static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void *>(v.data), dims,
                byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace exact_fp8
}  // namespace transformer_engine
