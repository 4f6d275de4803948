/*
 * What the current-scaling V cast (exact_fp8_transposed_current.cu) builds on besides the helpers
 * that it shares with the MXFP8 cast (exact_fp8_transposed.cuh): the work items' order, the
 * sm90_pv key order of its stores and the dispatch over element type, head dim and chunk size.
 * See Note [Mask-exact FP8 scaling] (exact_fp8/formats.py).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CURRENT_CUH_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CURRENT_CUH_

#include <type_traits>

#include "exact_fp8_transposed.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace transposed {

constexpr int kMaxHeadDim = 256;

/* The 16 E4M3 bytes of one channel and 16-token group (word w: tokens 4 w .. 4 w + 3) in
 * NVTE_EXACT_FP8_KEYS_SM90_PV order: word q of the result holds tokens 2 q, 2 q + 1, 8 + 2 q,
 * 9 + 2 q (the keys that lane q of a quad holds in the sm90 kernel's P fragment), i.e. the
 * (q % 2)-th token pair of words q / 2 and 2 + q / 2. */
__device__ __forceinline__ void to_sm90_pv_key_order(uint32_t (&bytes)[4]) {
  const uint32_t natural[4] = {bytes[0], bytes[1], bytes[2], bytes[3]};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    bytes[q] = __byte_perm(natural[q / 2], natural[2 + q / 2], (q % 2) ? 0x7632u : 0x5410u);
  }
}

/* The lane's 8 channels of a 16-aligned token group (complete, or a sequence's short last group
 * in the aligned layout: cast_and_store_lane): one 16-byte store per channel into the data_t row
 * at `dst` (row stride `stride` bytes), in the sm90_pv key order if kPermute. */
template <typename T, bool kNoNaN, bool kPermute>
__device__ __forceinline__ void cast_and_store_group(
    const uint32_t (&rows)[kTokensPerLane][kWordsPerRow], float scale, uint8_t *dst,
    int64_t stride) {
#pragma unroll
  for (int ch = 0; ch < kChannelsPerLane; ++ch) {
    uint32_t bytes[4];
    cast_channel<T, kNoNaN>(rows, ch, scale, bytes);
    if (kPermute) to_sm90_pv_key_order(bytes);
    *reinterpret_cast<uint4 *>(dst + ch * stride) =
        make_uint4(bytes[0], bytes[1], bytes[2], bytes[3]);
  }
}

/* A lane's 8 channels from `channel` on, its `valid` real tokens times `scale` (the chunk's: see
 * Note [Mask-exact FP8 scaling]), into data_t ([heads, head_dim, data_t_stride] E4M3) from
 * column `column` on; a complete 16-token group in the sm90_pv key order where p asks for it, a
 * short one in token order. rows: [token, channel pair] raw 16-bit pairs, 0 from row `valid` on;
 * kNoNaN: none of them is NaN. A group that store_channel would write whole takes straight-line
 * code with no byte-store branches. */
template <typename T, bool kNoNaN>
__device__ __forceinline__ void cast_and_store_lane(
    const ChunkParams &p, int head, const uint32_t (&rows)[kTokensPerLane][kWordsPerRow],
    float scale, int channel, int64_t column, int valid) {
  const bool complete = valid >= kTokensPerLane;
  if (column % kTokensPerLane == 0 && (complete || p.columns != nullptr)) {  // see store_channel
    uint8_t *dst = data_t_row(p, head, channel) + column;
    if (p.sm90_pv_keys && complete) {
      cast_and_store_group<T, kNoNaN, true>(rows, scale, dst, p.data_t_stride);
    } else {
      cast_and_store_group<T, kNoNaN, false>(rows, scale, dst, p.data_t_stride);
    }
    return;
  }
  const bool permute = p.sm90_pv_keys && complete;  // complete, unaligned
#pragma unroll
  for (int ch = 0; ch < kChannelsPerLane; ++ch) {  // unaligned, or short and not aligned layout
    uint32_t bytes[4];
    cast_channel<T, kNoNaN>(rows, ch, scale, bytes);
    if (permute) to_sm90_pv_key_order(bytes);
    store_channel(p, head, channel + ch, column, valid, bytes);
  }
}

/* The grid of the current cast: blockIdx.x is the item's span and blockIdx.y its head, so the
 * blocks at work at once take neighbouring spans of one head and write neighbouring columns of
 * the same data_t rows: on the H200 the transposed writes of head-fastest items (the blocks at
 * work spread over every head's rows) cost 6-10 points of the copy's bandwidth
 * (benchmarks/results/quantize_bandwidth.md). */
constexpr int kMaxGridHeads = 65535;  // gridDim.y

template <int kValue>
using Int = std::integral_constant<int, kValue>;

/* launch(T{}, Int<kHeadDim>{}, Int<kChunk>{}) for the element type, head dim (64, 128, else 256)
 * and chunk (16, 32, 64, else 128) of a launch. */
template <typename Launch>
cudaError_t dispatch_current(NVTEExactFP8DType dtype, int head_dim, int chunk, Launch &&launch) {
  auto with_chunk = [&](auto type_tag, auto head_dim_tag) {
    switch (chunk) {
      case 16:
        return launch(type_tag, head_dim_tag, Int<16>{});
      case 32:
        return launch(type_tag, head_dim_tag, Int<32>{});
      case 64:
        return launch(type_tag, head_dim_tag, Int<64>{});
      default:
        return launch(type_tag, head_dim_tag, Int<128>{});
    }
  };
  auto with_head_dim = [&](auto type_tag) {
    switch (head_dim) {
      case 64:
        return with_chunk(type_tag, Int<64>{});
      case 128:
        return with_chunk(type_tag, Int<128>{});
      default:
        return with_chunk(type_tag, Int<kMaxHeadDim>{});
    }
  };
  if (dtype == NVTE_EXACT_FP8_BFLOAT16) return with_head_dim(__nv_bfloat16{});
  return with_head_dim(__half{});
}

}  // namespace transposed
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CURRENT_CUH_
