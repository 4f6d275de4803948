/*
 * Chunk kernels of the mask-exact FP8 quantizers, written transposed (token axis last) for the
 * attention kernel's P.V: V with one current scale per (head, chunk of tokens of one sequence),
 * and MXFP8 V with one E8M0 code per (head, chunk of 32 tokens, channel).
 *
 * One pass, registers only. A warp quantizes a tile of 32 channels of one head by a span of 128
 * tokens (128 / chunk consecutive chunks). Lane (channel group, token group) holds 16 tokens x 8
 * channels: it reads them with 16 independent 16-byte loads (one per token row), reduces each
 * channel's amax over its tokens and then, by shuffles, over the lanes that hold the chunk's
 * other tokens, and writes each channel's 16 E4M3 bytes with one 16-byte store. The 8 token groups
 * of a channel group are adjacent lanes, so one store instruction of the warp writes 128
 * contiguous bytes into each of 4 data_t rows. The current rule's amax runs on over the chunk's
 * channels: over the lane's 8, over the warp's 4 channel groups (shuffles), and over the warps of
 * the block that hold the span's other 32-channel slices (shared memory; a block holds whole
 * spans). See Note [Mask-exact FP8 scaling] (exact_fp8/formats.py): chunks start at each
 * sequence's first token and never cross a sequence.
 */
#include "exact_fp8_kernels.h"
#include "exact_fp8_numerics.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kTokensPerLane = 16;           // tokens of one channel per lane: one 16-byte store
constexpr int kChannelsPerLane = kVecElems;  // channels per lane: one 16-byte load per token
constexpr int kWordsPerRow = kChannelsPerLane / 2;  // 32-bit words (channel pairs) per lane row
constexpr int kTokenGroups = 8;                     // lanes along the token axis of a warp tile
constexpr int kSpanTokens = kTokenGroups * kTokensPerLane;  // 128 tokens per warp tile
constexpr int kChannelGroups = kWarpSize / kTokenGroups;
constexpr int kChannelsPerWarp = kChannelGroups * kChannelsPerLane;  // 32: divides every head dim
constexpr int kMaxHeadDim = 256;                                      // of the current rule

/* Warps per block and the occupancy they are compiled for: 4 warps (96 registers per thread, no
 * spills: 20 warps per SM), or 8 for the current rule at head dim 256, whose block must hold a
 * whole span (a multiple of head_dim / 32 warps) so that the chunk's amax over all channels stays
 * in the block. */
template <int kWarps>
struct BlockShape {
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kMinBlocksPerSm = kWarps == 4 ? 5 : 2;
};
constexpr int kWarpsWide = kMaxHeadDim / kChannelsPerWarp;  // 8: the current rule at d = 256
constexpr int64_t kMaxTilesPerHead = 2147483647 - kWarpsWide;  // blocks and tiles fit int

struct ChunkParams {
  const void *v;  // [batch, seqlen, heads, head_dim] view, element strides below
  int64_t stride_batch;
  int64_t stride_seq;
  int64_t stride_head;
  int seqlen;
  int heads;
  int head_dim;               // a multiple of kChannelsPerWarp (checked by the C API)
  const int32_t *cu_seqlens;  // [num_seqs + 1] token offsets; null: one sequence per sample
  const int32_t *cu_chunks;   // [num_seqs + 1] chunk offsets (with cu_seqlens)
  const int32_t *columns;     // [num_seqs + 1] first column of each sequence; null: token index
  int num_seqs;
  int num_chunks;
  int chunks_per_sample;  // without cu_seqlens
  int num_spans;          // spans of 128 / chunk consecutive chunks (the last may be partial)
  int tiles_per_head;     // warp tiles of one head: num_spans * head_dim / 32
  int64_t tokens;         // batch * seqlen
  uint8_t *data_t;        // [heads, head_dim, data_t_stride] E4M3
  int64_t data_t_stride;
  void *scales;  // [heads, num_chunks, head_dim]: fp32 scale_inv or E8M0 codes
  ScaleOptions opts;
};

/* Where a chunk's tokens are. */
struct ChunkSpan {
  int64_t src_offset;  // elements from the view's origin to the chunk's first token
  int64_t column;      // column of that token in data_t (its token index, or aligned)
  int len;             // tokens in the chunk (the last chunk of a sequence may be short)
};

template <int kChunk>
__device__ ChunkSpan locate_chunk(const ChunkParams &p, int chunk) {
  if (p.cu_seqlens == nullptr) {
    const int sample = chunk / p.chunks_per_sample;
    const int first = (chunk - sample * p.chunks_per_sample) * kChunk;
    const int64_t column0 = p.columns != nullptr ? __ldg(p.columns + sample)
                                                 : static_cast<int64_t>(sample) * p.seqlen;
    return {sample * p.stride_batch + first * p.stride_seq, column0 + first,
            min(kChunk, p.seqlen - first)};
  }
  // num_chunks may exceed the real count (a bound computed without reading cu_seqlens back):
  // chunks from cu_chunks[num_seqs] on hold no token.
  if (chunk >= __ldg(p.cu_chunks + p.num_seqs)) return {0, 0, 0};
  // The sequence of `chunk`: the last n with cu_chunks[n] <= chunk (skips empty sequences).
  int lo = 0;
  int hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(p.cu_chunks + mid) <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int start = __ldg(p.cu_seqlens + lo);
  const int first = start + (chunk - __ldg(p.cu_chunks + lo)) * kChunk;
  const int end = __ldg(p.cu_seqlens + lo + 1);
  const int64_t column = p.columns != nullptr ? __ldg(p.columns + lo) + (first - start) : first;
  return {first * p.stride_seq, column, min(kChunk, end - first)};
}

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
template <int kChunk>
__device__ LaneTile locate_lane(const ChunkParams &p, int head, int tile) {
  constexpr int kGroups = kChunk / kTokensPerLane;  // lanes per chunk
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

/* Channel c (0..7) of a lane row, as fp32 (exact). */
template <typename T>
__device__ __forceinline__ float channel_value(const uint32_t (&row)[kWordsPerRow], int c) {
  const float2 pair = to_float2(row[c / 2], T{});
  return c % 2 == 0 ? pair.x : pair.y;
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

/* One MXFP8 channel's multiplier from its chunk amax; `writer` stores its E8M0 code at
 * scales[scale_index]. */
__device__ float channel_multiplier_mxfp8(const ChunkParams &p, float amax, int64_t scale_index,
                                          bool writer) {
  const uint8_t code = float_to_e8m0(amax);
  if (writer) static_cast<uint8_t *>(p.scales)[scale_index] = code;
  return e8m0_reciprocal(code);
}

/* MXFP8: multipliers of the lane's 8 channels from their chunk amaxes (equal on the chunk's
 * lanes). The chunk's G lanes share the work: lane g computes (and, for a chunk that holds
 * tokens, `writer`, writes the codes of) channels g * 8 / G .. (g + 1) * 8 / G - 1, then each
 * lane gathers all 8 by shuffles. */
template <int kChunk>
__device__ void channel_multipliers(const ChunkParams &p, const LaneTile &lane, bool writer,
                                    const float (&amax)[kChannelsPerLane],
                                    float (&multiplier)[kChannelsPerLane]) {
  constexpr int kGroups = kChunk / kTokensPerLane;
  constexpr int kOwned = kChannelsPerLane / kGroups;  // channels whose scale this lane computes
  const int64_t scale_row =  // [heads, num_chunks, head_dim] index of the lane's first channel
      (static_cast<int64_t>(lane.head) * p.num_chunks + lane.chunk) * p.head_dim + lane.channel;
  float owned[kOwned];
#pragma unroll
  for (int k = 0; k < kOwned; ++k) {
    const int c = lane.group * kOwned + k;
    owned[k] = channel_multiplier_mxfp8(p, pick(amax, c), scale_row + c, writer);
  }
#pragma unroll
  for (int c = 0; c < kChannelsPerLane; ++c) {
    if constexpr (kGroups == 1) {
      multiplier[c] = owned[c];
    } else {
      multiplier[c] =
          __shfl_sync(kFullWarp, owned[c % kOwned], lane.first_lane_of_chunk + c / kOwned);
    }
  }
}

/* Current rule: the amax of the lane's chunk over its tokens and ALL head_dim channels, equal
 * on every lane of the block that holds the chunk. channel_amax: the lane's 8 channels, already
 * reduced over the chunk's token groups. Every warp of the block calls this (a barrier). */
template <int kChunk, int kWarps>
__device__ float chunk_amax_all_channels(const ChunkParams &p,
                                         const float (&channel_amax)[kChannelsPerLane]) {
  constexpr int kGroups = kChunk / kTokensPerLane;
  constexpr int kChunksPerSpan = kSpanTokens / kChunk;
  __shared__ float warp_amax[kWarps][kChunksPerSpan];
  float amax = channel_amax[0];
#pragma unroll
  for (int c = 1; c < kChannelsPerLane; ++c) amax = fmaxf(amax, channel_amax[c]);
  // over the warp's channel groups (lanes 8 and 16 apart hold the same tokens)
  for (int offset = kTokenGroups; offset < kWarpSize; offset <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, offset));
  }
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  if (lane < kTokenGroups && lane % kGroups == 0) warp_amax[warp][lane / kGroups] = amax;
  __syncthreads();
  // over the warps that hold the span's other 32-channel slices (a block holds whole spans)
  const int slices = p.head_dim / kChannelsPerWarp;
  const int first_warp = warp - warp % slices;
  const int chunk_in_span = lane % kTokenGroups / kGroups;
  amax = warp_amax[first_warp][chunk_in_span];
  for (int w = 1; w < slices; ++w) amax = fmaxf(amax, warp_amax[first_warp + w][chunk_in_span]);
  return amax;
}

/* Current rule: the one multiplier of the lane's chunk; the chunk's first lane of the span's first
 * slice writes its scale_inv at scales[head, chunk] when the chunk holds tokens (`writer`). */
template <int kChunk>
__device__ float chunk_multiplier_current(const ChunkParams &p, const LaneTile &lane, bool writer,
                                          float amax) {
  const float scale =
      compute_scale_from_amax(amax, p.opts.use_power_2_scales, p.opts.amax_epsilon);
  const bool first_lane = threadIdx.x % kWarpSize < kTokenGroups && lane.group == 0;
  if (writer && first_lane && lane.channel == 0) {
    static_cast<float *>(p.scales)[static_cast<int64_t>(lane.head) * p.num_chunks + lane.chunk] =
        scale_inverse(scale);
  }
  return scale;
}

/* The lane's 16 tokens of channel c times `multiplier` -> 16 E4M3 bytes in token order. */
template <typename T>
__device__ void cast_channel(const uint32_t (&rows)[kTokensPerLane][kWordsPerRow], int c,
                             float multiplier, uint32_t (&bytes)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = channel_value<T>(rows[4 * q + k], c);
    bytes[q] = cast4_to_e4m3(x, multiplier);
  }
}

/* 16 E4M3 bytes of one channel -> data_t at `column`: one 16-byte store when the column is
 * 16-aligned and all 16 tokens are real, byte stores of the `valid` real tokens otherwise. In the
 * aligned layout the columns after a sequence's last token up to the next multiple of 16 are
 * padding: the lane of that last token writes them 0. */
__device__ void store_channel(const ChunkParams &p, int head, int channel, int64_t column,
                              int valid, const uint32_t (&bytes)[4]) {
  if (valid <= 0) return;
  uint8_t *dst = p.data_t +
                 (static_cast<int64_t>(head) * p.head_dim + channel) * p.data_t_stride + column;
  if (valid >= kTokensPerLane && column % 16 == 0) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(bytes[0], bytes[1], bytes[2], bytes[3]);
    return;
  }
  const int written = p.columns != nullptr ? kTokensPerLane : valid;
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
    if (j < written) dst[j] = j < valid ? static_cast<uint8_t>(bytes[j / 4] >> (8 * (j % 4))) : 0;
  }
}

/* The head's columns of data_t that belong to no sequence (past the last token, or past the
 * last sequence's aligned columns, up to the row stride). */
__device__ void zero_unowned_columns(const ChunkParams &p, int head) {
  int64_t end = p.cu_seqlens != nullptr ? __ldg(p.cu_seqlens + p.num_seqs) : p.tokens;
  if (p.columns != nullptr) end = __ldg(p.columns + p.num_seqs);
  const int64_t width = p.data_t_stride - end;
  uint8_t *rows = p.data_t + static_cast<int64_t>(head) * p.head_dim * p.data_t_stride + end;
  for (int64_t k = threadIdx.x; k < width * p.head_dim; k += blockDim.x) {
    const int64_t row = k / width;
    rows[row * p.data_t_stride + k - row * width] = 0;
  }
}

/* Grid (1 + blocks per head, heads): block (0, head) zeroes the head's unowned columns; block
 * (b > 0, head) holds the head's warp tiles W (b - 1) .. W b - 1 (W warps per block). Whole
 * warps leave together, so every lane of a working warp takes part in the shuffles; under the
 * current rule a warp past the head's last tile stays (its chunk has no tokens: it loads and
 * stores nothing) to take part in the barrier. */
template <typename T, int kChunk, ChunkRule kRule, bool kVectorized, int kWarps>
__global__ void __launch_bounds__(BlockShape<kWarps>::kThreads, BlockShape<kWarps>::kMinBlocksPerSm)
    chunk_cast_transposed_kernel(const ChunkParams p) {
  const int head = blockIdx.y;
  if (blockIdx.x == 0) {
    zero_unowned_columns(p, head);
    return;
  }
  const int tile = (blockIdx.x - 1) * kWarps + threadIdx.x / kWarpSize;
  if (kRule == ChunkRule::kMxfp8 && tile >= p.tiles_per_head) return;  // no barrier to join
  const LaneTile lane = locate_lane<kChunk>(p, head, tile);
  const ChunkSpan span =
      lane.chunk < p.num_chunks ? locate_chunk<kChunk>(p, lane.chunk) : ChunkSpan{0, 0, 0};
  const int valid = span.len - lane.group * kTokensPerLane;  // the lane's real tokens (<= 0: none)
  uint32_t rows[kTokensPerLane][kWordsPerRow];  // [token, channel pair] raw 16-bit pairs
  load_lane_rows<T, kVectorized>(p, lane, span, valid, rows);
  float amax[kChannelsPerLane];  // per channel: over the lane's tokens, then over the chunk's
  lane_channel_amax<T>(rows, amax);
#pragma unroll
  for (int c = 0; c < kChannelsPerLane; ++c) {
    // See Note [Mask-exact FP8 scaling]: amax over this chunk's tokens only.
    amax[c] = group_max(amax[c], kChunk / kTokensPerLane);
  }
  float multiplier[kChannelsPerLane];
  if constexpr (kRule == ChunkRule::kCurrent) {
    // See Note [Mask-exact FP8 scaling]: one scale over this chunk's tokens and channels.
    const float scale = chunk_multiplier_current<kChunk>(
        p, lane, span.len > 0, chunk_amax_all_channels<kChunk, kWarps>(p, amax));
#pragma unroll
    for (int c = 0; c < kChannelsPerLane; ++c) multiplier[c] = scale;
  } else {
    channel_multipliers<kChunk>(p, lane, span.len > 0, amax, multiplier);
  }
  const int64_t column = span.column + lane.group * kTokensPerLane;
#pragma unroll
  for (int c = 0; c < kChannelsPerLane; ++c) {
    uint32_t bytes[4];
    cast_channel<T>(rows, c, multiplier[c], bytes);
    store_channel(p, lane.head, lane.channel + c, column, valid, bytes);
  }
}

template <typename T, int kChunk, ChunkRule kRule, int kWarps>
cudaError_t launch_shaped(ChunkParams p, bool vectorized, cudaStream_t stream) {
  constexpr int kChunksPerSpan = kSpanTokens / kChunk;
  p.num_spans = (p.num_chunks + kChunksPerSpan - 1) / kChunksPerSpan;
  const int64_t tiles_per_head =
      static_cast<int64_t>(p.num_spans) * (p.head_dim / kChannelsPerWarp);
  if (tiles_per_head > kMaxTilesPerHead) return cudaErrorInvalidConfiguration;
  p.tiles_per_head = static_cast<int>(tiles_per_head);
  const dim3 grid(1 + (p.tiles_per_head + kWarps - 1) / kWarps, p.heads);
  auto kernel = vectorized ? chunk_cast_transposed_kernel<T, kChunk, kRule, true, kWarps>
                           : chunk_cast_transposed_kernel<T, kChunk, kRule, false, kWarps>;
  kernel<<<grid, BlockShape<kWarps>::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

/* 4 warps per block, or 8 where the current rule's span of 32-channel slices needs them. */
template <typename T, int kChunk, ChunkRule kRule>
cudaError_t launch_typed(const ChunkParams &p, bool vectorized, cudaStream_t stream) {
  if constexpr (kRule == ChunkRule::kCurrent) {
    if (p.head_dim > 4 * kChannelsPerWarp) {
      return launch_shaped<T, kChunk, kRule, kWarpsWide>(p, vectorized, stream);
    }
  }
  return launch_shaped<T, kChunk, kRule, 4>(p, vectorized, stream);
}

template <typename T, ChunkRule kRule>
cudaError_t launch_chunk_size(int chunk, const ChunkParams &p, bool vectorized,
                              cudaStream_t stream) {
  if constexpr (kRule == ChunkRule::kMxfp8) {
    return launch_typed<T, kMxBlock, kRule>(p, vectorized, stream);
  } else {
    switch (chunk) {
      case 16:
        return launch_typed<T, 16, kRule>(p, vectorized, stream);
      case 32:
        return launch_typed<T, 32, kRule>(p, vectorized, stream);
      case 64:
        return launch_typed<T, 64, kRule>(p, vectorized, stream);
      default:
        return launch_typed<T, 128, kRule>(p, vectorized, stream);
    }
  }
}

template <ChunkRule kRule>
cudaError_t launch_rule(const NVTEExactFP8TokenView &v, int chunk, const ChunkParams &p,
                        cudaStream_t stream) {
  const bool vectorized = is_vectorizable(v);
  if (v.dtype == NVTE_EXACT_FP8_BFLOAT16) {
    return launch_chunk_size<__nv_bfloat16, kRule>(chunk, p, vectorized, stream);
  }
  return launch_chunk_size<__half, kRule>(chunk, p, vectorized, stream);
}

}  // namespace

cudaError_t launch_chunk_cast_transposed(ChunkRule rule, const NVTEExactFP8TokenView &v,
                                         const NVTEExactFP8Chunks &chunks, ScaleOptions opts,
                                         uint8_t *data_t, int64_t data_t_stride, void *scales,
                                         cudaStream_t stream) {
  const ChunkParams p{v.data,
                      v.stride_batch,
                      v.stride_seq,
                      v.stride_head,
                      static_cast<int>(v.seqlen),
                      static_cast<int>(v.heads),
                      static_cast<int>(v.head_dim),
                      chunks.cu_seqlens,
                      chunks.cu_chunks,
                      chunks.columns,
                      static_cast<int>(chunks.num_seqs),
                      static_cast<int>(chunks.num_chunks),
                      static_cast<int>((v.seqlen + chunks.chunk - 1) / chunks.chunk),
                      0,
                      0,
                      v.batch * v.seqlen,
                      data_t,
                      data_t_stride,
                      scales,
                      opts};
  if (rule == ChunkRule::kCurrent) {
    return launch_rule<ChunkRule::kCurrent>(v, chunks.chunk, p, stream);
  }
  return launch_rule<ChunkRule::kMxfp8>(v, chunks.chunk, p, stream);
}

}  // namespace exact_fp8
}  // namespace transformer_engine
