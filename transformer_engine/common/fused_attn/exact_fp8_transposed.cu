/*
 * The MXFP8 V cast, written transposed (token axis last) for the attention kernel's P.V: one E8M0
 * code per (head, chunk of 32 tokens, channel). The current-scaling V cast (one scale per (head,
 * chunk)) is exact_fp8_transposed_current.cu; what both share is exact_fp8_transposed.cuh.
 *
 * One pass, registers only. A warp quantizes a tile of 32 channels of one head by a span of 128
 * tokens (4 consecutive chunks). Lane (channel group, token group) holds 16 tokens x 8 channels:
 * it reads them with 16 independent 16-byte loads (one per token row), reduces each channel's
 * amax over its tokens and then, by a shuffle, over the other lane of its chunk, and writes each
 * channel's 16 E4M3 bytes with one 16-byte store. The 8 token groups of a channel group are
 * adjacent lanes, so one store instruction of the warp writes 128 contiguous bytes into each of 4
 * data_t rows. Warps are independent (no shared memory, no block barrier). See
 * Note [Mask-exact FP8 scaling] (exact_fp8/formats.py): chunks start at each sequence's first
 * token and never cross a sequence.
 */
#include "exact_fp8_transposed.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

using namespace transposed;  // NOLINT(build/namespaces): the shared constants and helpers

constexpr int kChunk = kMxBlock;                  // tokens per MX block
constexpr int kGroups = kChunk / kTokensPerLane;  // lanes per chunk
constexpr int kWarps = 4;                         // per block: 96 registers, 20 warps per SM
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMinBlocksPerSm = 5;
constexpr int64_t kMaxTilesPerHead = 2147483647 - kWarps;  // blocks and tiles fit int

/* What one lane quantizes: 16 tokens (one token group of a chunk) x 8 channels of one head. */
struct LaneTile {
  int head;
  int chunk;    // a chunk without tokens: past the last one (the lane only joins the shuffles)
  int group;    // 16-token group of the lane within its chunk
  int channel;  // first of the lane's 8 channels
  int first_lane_of_chunk;
};

/* Warp tile of a head -> (span, 32-channel slice), slice fastest, so the warps of a block read
 * neighbouring channels of the same token rows. Lane = channel group * 8 + token group. */
__device__ LaneTile locate_lane(const ChunkParams &p, int head, int tile) {
  const int lane = threadIdx.x % kWarpSize;
  const int slices = p.head_dim / kChannelsPerWarp;
  const int span = tile / slices;
  const int slice = tile - span * slices;
  const int token_group = lane % kTokenGroups;
  const int group = token_group % kGroups;
  return {head, span * (kSpanTokens / kChunk) + token_group / kGroups, group,
          slice * kChannelsPerWarp + lane / kTokenGroups * kChannelsPerLane, lane - group};
}

/* The lane's token rows of 8 channels as raw 16-bit pairs, zeros from token `valid` on: 16
 * independent 16-byte loads (element loads for unaligned views). */
template <typename T, bool kVectorized>
__device__ void load_lane_rows(const ChunkParams &p, const LaneTile &lane, const ChunkSpan &span,
                               int valid, uint32_t (&rows)[kTokensPerLane][kWordsPerRow]) {
  const T *src = static_cast<const T *>(p.v) + span.src_offset + lane.head * p.stride_head +
                 lane.channel + static_cast<int64_t>(lane.group) * kTokensPerLane * p.stride_seq;
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    if (j < valid) raw = load_vec8<T, kVectorized>(src + j * p.stride_seq);
    rows[j][0] = raw.x;
    rows[j][1] = raw.y;
    rows[j][2] = raw.z;
    rows[j][3] = raw.w;
  }
}

/* max |x| per channel over the lane's tokens, on the packed 16-bit pairs (exact; a NaN decides
 * no scale), then as fp32. */
template <typename T>
__device__ void lane_channel_amax(const uint32_t (&rows)[kTokensPerLane][kWordsPerRow],
                                  float (&amax)[kChannelsPerLane]) {
  uint32_t pairs[kWordsPerRow] = {};  // [channel pair] running max, packed like the input
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
#pragma unroll
    for (int w = 0; w < kWordsPerRow; ++w) pairs[w] = abs_max2<T>(pairs[w], rows[j][w]);
  }
#pragma unroll
  for (int c = 0; c < kChannelsPerLane; ++c) amax[c] = channel_value<T>(pairs, c);
}

/* x[i] for an index known only at run time, without local memory: a chain of selects. */
__device__ __forceinline__ float pick(const float (&x)[kChannelsPerLane], int i) {
  float value = x[0];
#pragma unroll
  for (int c = 1; c < kChannelsPerLane; ++c) value = i == c ? x[c] : value;
  return value;
}

/* One channel's multiplier from its chunk amax; `writer` stores its E8M0 code at
 * scales[scale_index]. */
__device__ float channel_multiplier(const ChunkParams &p, float amax, int64_t scale_index,
                                    bool writer) {
  const uint8_t code = float_to_e8m0(amax);
  if (writer) static_cast<uint8_t *>(p.scales)[scale_index] = code;
  return e8m0_reciprocal(code);
}

/* Multipliers of the lane's 8 channels from their chunk amaxes (equal on the chunk's 2 lanes).
 * Lane g of the chunk computes (and, for a chunk that holds tokens, `writer`, writes the codes
 * of) channels 4 g .. 4 g + 3, then each lane gathers all 8 by shuffles. */
__device__ void channel_multipliers(const ChunkParams &p, const LaneTile &lane, bool writer,
                                    const float (&amax)[kChannelsPerLane],
                                    float (&multiplier)[kChannelsPerLane]) {
  constexpr int kOwned = kChannelsPerLane / kGroups;  // channels whose scale this lane computes
  const int64_t scale_row =  // [heads, num_chunks, head_dim] index of the lane's first channel
      (static_cast<int64_t>(lane.head) * p.num_chunks + lane.chunk) * p.head_dim + lane.channel;
  float owned[kOwned];
#pragma unroll
  for (int k = 0; k < kOwned; ++k) {
    const int c = lane.group * kOwned + k;
    owned[k] = channel_multiplier(p, pick(amax, c), scale_row + c, writer);
  }
#pragma unroll
  for (int c = 0; c < kChannelsPerLane; ++c) {
    multiplier[c] =
        __shfl_sync(kFullWarp, owned[c % kOwned], lane.first_lane_of_chunk + c / kOwned);
  }
}

/* Grid (1 + blocks per head, heads): block (0, head) zeroes the head's share of the unowned
 * columns and of the aligned layout's span tails; block (b > 0, head) holds the head's warp tiles 4
 * (b - 1) .. 4 b - 1. Whole warps leave together, so every lane of a working warp takes part in the
 * shuffles. */
template <typename T, bool kVectorized>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    mxfp8_cast_transposed_kernel(const ChunkParams p, const int tiles_per_head) {
  const int head = blockIdx.y;
  if (blockIdx.x == 0) {
    zero_unwritten_columns(p, static_cast<int64_t>(head) * kThreads + threadIdx.x,
                           static_cast<int64_t>(p.heads) * kThreads);
    return;
  }
  const int tile = (blockIdx.x - 1) * kWarps + threadIdx.x / kWarpSize;
  if (tile >= tiles_per_head) return;
  const LaneTile lane = locate_lane(p, head, tile);
  const ChunkSpan span = locate_chunk<kChunk>(p, lane.chunk);
  const int valid = span.len - lane.group * kTokensPerLane;  // the lane's real tokens (<= 0: none)
  uint32_t rows[kTokensPerLane][kWordsPerRow];  // [token, channel pair] raw 16-bit pairs
  load_lane_rows<T, kVectorized>(p, lane, span, valid, rows);
  float amax[kChannelsPerLane];  // per channel: over the lane's tokens, then over the chunk's
  lane_channel_amax<T>(rows, amax);
#pragma unroll
  for (int c = 0; c < kChannelsPerLane; ++c) {
    // See Note [Mask-exact FP8 scaling]: amax over this chunk's tokens only.
    amax[c] = group_max(amax[c], kGroups);
  }
  float multiplier[kChannelsPerLane];
  channel_multipliers(p, lane, span.len > 0, amax, multiplier);
  const int64_t column = span.column + lane.group * kTokensPerLane;
#pragma unroll
  for (int c = 0; c < kChannelsPerLane; ++c) {
    uint32_t bytes[4];
    cast_channel<T>(rows, c, multiplier[c], bytes);
    store_channel(p, lane.head, lane.channel + c, column, valid, bytes);
  }
}

template <typename T>
cudaError_t launch_typed(const ChunkParams &p, bool vectorized, cudaStream_t stream) {
  const int64_t tiles_per_head =
      static_cast<int64_t>(p.num_spans) * (p.head_dim / kChannelsPerWarp);
  if (tiles_per_head > kMaxTilesPerHead) return cudaErrorInvalidConfiguration;
  const int tiles = static_cast<int>(tiles_per_head);
  const dim3 grid(1 + (tiles + kWarps - 1) / kWarps, p.heads);
  auto kernel =
      vectorized ? mxfp8_cast_transposed_kernel<T, true> : mxfp8_cast_transposed_kernel<T, false>;
  kernel<<<grid, kThreads, 0, stream>>>(p, tiles);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_mxfp8_cast_transposed(const NVTEExactFP8TokenView &v,
                                         const NVTEExactFP8Chunks &chunks, uint8_t *data_t,
                                         int64_t data_t_stride, uint8_t *scales,
                                         cudaStream_t stream) {
  const ChunkParams p =
      make_chunk_params(v, chunks, ScaleOptions{false, 0.0f}, data_t, data_t_stride, scales);
  const bool vectorized = is_vectorizable(v);
  if (v.dtype == NVTE_EXACT_FP8_BFLOAT16) return launch_typed<__nv_bfloat16>(p, vectorized, stream);
  return launch_typed<__half>(p, vectorized, stream);
}

}  // namespace exact_fp8
}  // namespace transformer_engine
