/*
 * What the two current-scaling V casts share (exact_fp8_transposed_current.cu: cp.async ring,
 * any view; exact_fp8_transposed_current_tma.cu: tensor-tile copies, the fast path): the chunks of
 * a span as the cast sees them, the sm90_pv key order, the resident-block count of a launch and
 * the dispatch over element type, head dim and chunk size. See Note [Mask-exact FP8 scaling]
 * (exact_fp8/formats.py).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CURRENT_CUH_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CURRENT_CUH_

#include <atomic>
#include <type_traits>

#include "exact_fp8_transposed.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace transposed {

constexpr int kMaxDevices = 64;  // devices whose launch shape is cached
constexpr int kMaxHeadDim = 256;

/* What a chunk of the span looks like to the cast: the chunks of one item, 0 tokens past the
 * last. */
template <int kChunk>
struct SpanChunks {
  static constexpr int kCount = kSpanTokens / kChunk;
  int64_t column[kCount];  // data_t column of each chunk's first token
  int len[kCount];         // its tokens
};

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

/* A lane's 8 channels from `channel` on, its `valid` real tokens times `scale` (the chunk's: see
 * Note [Mask-exact FP8 scaling]), into data_t ([heads, head_dim, data_t_stride] E4M3) from
 * column `column` on; a complete 16-token group in the sm90_pv key order where p asks for it.
 * rows: [token, channel pair] raw 16-bit pairs. */
template <typename T>
__device__ __forceinline__ void cast_and_store_lane(
    const ChunkParams &p, int head, const uint32_t (&rows)[kTokensPerLane][kWordsPerRow],
    float scale, int channel, int64_t column, int valid) {
  const bool permute = p.sm90_pv_keys && valid >= kTokensPerLane;
#pragma unroll
  for (int ch = 0; ch < kChannelsPerLane; ++ch) {
    uint32_t bytes[4];
    cast_channel<T>(rows, ch, scale, bytes);
    if (permute) to_sm90_pv_key_order(bytes);
    store_channel(p, head, channel + ch, column, valid, bytes);
  }
}

/* Blocks of `kernel` that the device runs at once (its shared memory opted in first), cached
 * per device. */
template <typename Kernel>
cudaError_t resident_blocks(Kernel kernel, int threads, int smem_bytes,
                            std::atomic<int> (&cache)[kMaxDevices], int *blocks) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device < kMaxDevices && (*blocks = cache[device].load(std::memory_order_relaxed)) > 0) {
    return cudaSuccess;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  int per_sm = 0;
  int sms = 0;
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes);
  }
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  *blocks = per_sm * sms > 0 ? per_sm * sms : 1;
  if (device < kMaxDevices) cache[device].store(*blocks, std::memory_order_relaxed);
  return cudaSuccess;
}

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

/* The TMA cast of `v` (exact_fp8_transposed_current_tma.cu) with the parameters `p`;
 * cudaErrorNotSupported, having launched nothing, where it does not apply (the view's layout, the
 * device, no items, or NVTE_EXACT_FP8_V_CAST_TMA=0). */
cudaError_t launch_current_cast_transposed_tma(const NVTEExactFP8TokenView &v,
                                               const transposed::ChunkParams &p, int chunk,
                                               cudaStream_t stream);

}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CURRENT_CUH_
