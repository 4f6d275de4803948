/*
 * What the two transposed V casts share (exact_fp8_transposed.cu: MXFP8, one E8M0 code per
 * (head, 32-token chunk, channel); exact_fp8_transposed_current.cu: current scaling, one scale
 * per (head, chunk)): where a chunk's tokens are, the cast of one lane's 16 tokens x 8 channels
 * and its stores into data_t, and the zeroing of the columns that belong to no sequence.
 *
 * A lane of either kernel ends up holding 16 consecutive tokens of 8 channels of one head (one
 * 16-bit pair per 32-bit word), so each channel's 16 E4M3 bytes leave as one 16-byte store. See
 * Note [Mask-exact FP8 scaling] (exact_fp8/formats.py): chunks start at each sequence's first
 * token and never cross a sequence.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CUH_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CUH_

#include "exact_fp8_kernels.h"
#include "exact_fp8_numerics.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace transposed {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr int kSpanTokens = 128;                    // tokens of a span: 128 / chunk chunks
constexpr int kTokensPerLane = 16;                  // tokens of one channel per lane
constexpr int kChannelsPerLane = kVecElems;         // channels per lane: one 16-byte row
constexpr int kWordsPerRow = kChannelsPerLane / 2;  // 32-bit words (channel pairs) per lane row
constexpr int kTokenGroups = kSpanTokens / kTokensPerLane;           // 8 lanes along the tokens
constexpr int kChannelGroups = kWarpSize / kTokenGroups;             // 4 lanes along the channels
constexpr int kChannelsPerWarp = kChannelGroups * kChannelsPerLane;  // 32: a warp's slice

/* Division of non-negative 31-bit integers by a divisor fixed at launch, in one multiply-high,
 * one add and one shift (an integer division is a ~20-instruction subroutine on the GPU): with
 * s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, n / d = (umulhi(n, m) + n) >> s for
 * 0 <= n < 2^31 (Granlund and Montgomery, PLDI 1994, section 4). */
struct InvariantDivisor {
  uint32_t divisor;
  uint32_t multiplier;
  uint32_t shift;

  static InvariantDivisor of(int divisor) {  // divisor >= 1
    const uint32_t d = static_cast<uint32_t>(divisor > 0 ? divisor : 1);
    uint32_t s = 0;
    while ((uint64_t{1} << s) < d) ++s;
    const uint64_t m = (uint64_t{1} << 32) * ((uint64_t{1} << s) - d) / d + 1;
    return {d, static_cast<uint32_t>(m), s};
  }
  __host__ __device__ __forceinline__ int divide(int n) const {  // 0 <= n < 2^31
    const uint32_t u = static_cast<uint32_t>(n);
#ifdef __CUDA_ARCH__
    const uint32_t high = __umulhi(u, multiplier);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{u} * multiplier) >> 32);
#endif
    return static_cast<int>((high + u) >> shift);
  }
};

/* What both kernels read: the view, its sequences and the outputs. */
struct ChunkParams {
  const void *v;  // [batch, seqlen, heads, head_dim] view, element strides below
  int64_t stride_batch;
  int64_t stride_seq;
  int64_t stride_head;
  int seqlen;
  int batch;
  int heads;
  int head_dim;               // a multiple of kChannelsPerWarp (checked by the C API)
  const int32_t *cu_seqlens;  // [num_seqs + 1] token offsets; null: one sequence per sample
  const int32_t *cu_chunks;   // [num_seqs + 1] chunk offsets (with cu_seqlens)
  const int32_t *columns;     // [num_seqs + 1] first column of each sequence; null: token index
  bool sm90_pv_keys;          // NVTE_EXACT_FP8_KEYS_SM90_PV: complete 16-token groups permuted
  int num_seqs;
  int num_chunks;
  InvariantDivisor chunks_per_sample;  // without cu_seqlens
  int num_spans;    // spans of 128 / chunk consecutive chunks (the last may be partial)
  int64_t tokens;   // batch * seqlen
  uint8_t *data_t;  // [heads, head_dim, data_t_stride] E4M3
  int64_t data_t_stride;
  void *scales;  // current: [heads, num_chunks] fp32 scale_inv; MXFP8: [heads, num_chunks,
                 // head_dim] E8M0 codes
  ScaleOptions opts;
};

/* The parameters of a launch (num_spans for chunks of `chunk` tokens). */
inline ChunkParams make_chunk_params(const NVTEExactFP8TokenView &v,
                                     const NVTEExactFP8Chunks &chunks, ScaleOptions opts,
                                     uint8_t *data_t, int64_t data_t_stride, void *scales) {
  const int chunks_per_span = kSpanTokens / chunks.chunk;
  const int num_chunks = static_cast<int>(chunks.num_chunks);
  return ChunkParams{
      v.data,
      v.stride_batch,
      v.stride_seq,
      v.stride_head,
      static_cast<int>(v.seqlen),
      static_cast<int>(v.batch),
      static_cast<int>(v.heads),
      static_cast<int>(v.head_dim),
      chunks.cu_seqlens,
      chunks.cu_chunks,
      chunks.columns,
      chunks.key_order == NVTE_EXACT_FP8_KEYS_SM90_PV,
      static_cast<int>(chunks.num_seqs),
      num_chunks,
      InvariantDivisor::of(static_cast<int>((v.seqlen + chunks.chunk - 1) / chunks.chunk)),
      (num_chunks + chunks_per_span - 1) / chunks_per_span,
      v.batch * v.seqlen,
      data_t,
      data_t_stride,
      scales,
      opts};
}

/* Where a chunk's tokens are. */
struct ChunkSpan {
  int64_t src_offset;  // elements from the view's origin to the chunk's first token
  int64_t column;      // column of that token in data_t (its token index, or aligned)
  int len;             // tokens in the chunk (the last chunk of a sequence may be short; 0: none)
};

/* Chunk `chunk` of a sample (no cu_seqlens): arithmetic only. */
template <int kChunk>
__device__ ChunkSpan chunk_of_sample(const ChunkParams &p, int chunk) {
  const int sample = p.chunks_per_sample.divide(chunk);
  const int first = (chunk - sample * static_cast<int>(p.chunks_per_sample.divisor)) * kChunk;
  const int64_t column0 =
      p.columns != nullptr ? __ldg(p.columns + sample) : static_cast<int64_t>(sample) * p.seqlen;
  return {sample * p.stride_batch + first * p.stride_seq, column0 + first,
          min(kChunk, p.seqlen - first)};
}

/* Chunk `chunk` of a thd pack, held by sequence `seq`. */
template <int kChunk>
__device__ ChunkSpan chunk_of_sequence(const ChunkParams &p, int chunk, int seq) {
  const int start = __ldg(p.cu_seqlens + seq);
  const int first = start + (chunk - __ldg(p.cu_chunks + seq)) * kChunk;
  const int end = __ldg(p.cu_seqlens + seq + 1);
  const int64_t column = p.columns != nullptr ? __ldg(p.columns + seq) + (first - start) : first;
  return {first * p.stride_seq, column, min(kChunk, end - first)};
}

/* Whether `chunk` holds no token: past the last span's last chunk, or (thd) past
 * cu_chunks[num_seqs] (num_chunks may be a bound computed without reading cu_seqlens back). */
__device__ __forceinline__ bool chunk_is_empty(const ChunkParams &p, int chunk) {
  return chunk >= p.num_chunks ||
         (p.cu_seqlens != nullptr && chunk >= __ldg(p.cu_chunks + p.num_seqs));
}

/* Where chunk `chunk` is, for one thread. The sequence of a thd chunk is the last n with
 * cu_chunks[n] <= chunk (which skips empty sequences): a binary search. */
template <int kChunk>
__device__ ChunkSpan locate_chunk(const ChunkParams &p, int chunk) {
  if (chunk_is_empty(p, chunk)) return {0, 0, 0};
  if (p.cu_seqlens == nullptr) return chunk_of_sample<kChunk>(p, chunk);
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
  return chunk_of_sequence<kChunk>(p, chunk, lo);
}

/* locate_chunk for a whole warp that asks for the same chunk (every lane must call it): a 32-ary
 * search, one round of loads and a ballot per factor of 32 in num_seqs, whose last round also
 * loads what the chunk's location needs (the sequence's cu_seqlens pair and first column) and
 * whose first also loads cu_chunks[num_seqs]: up to 32 sequences cost one dependent round trip,
 * instead of the log2(num_seqs) + 2 of locate_chunk. */
template <int kChunk>
__device__ ChunkSpan locate_chunk_warp(const ChunkParams &p, int chunk) {
  if (chunk >= p.num_chunks || (p.cu_seqlens != nullptr && p.num_seqs < 1)) {
    return {0, 0, 0};
  }
  if (p.cu_seqlens == nullptr) return chunk_of_sample<kChunk>(p, chunk);
  const int lane = threadIdx.x % kWarpSize;
  const int total = __ldg(p.cu_chunks + p.num_seqs);  // the real chunks (num_chunks may bound them)
  int lo = 0;  // the sequence is in [lo, hi], and cu_chunks[lo] <= chunk
  int hi = p.num_seqs - 1;
  while (true) {
    const int step = (hi - lo + kWarpSize) / kWarpSize;  // candidates lo + step * lane
    const bool candidate = lo + step * lane <= hi;
    const int n = candidate ? lo + step * lane : hi;  // a valid index either way
    const int first_chunk = __ldg(p.cu_chunks + n);
    const bool at_or_before_chunk = candidate && first_chunk <= chunk;  // a prefix of the lanes
    if (step == 1) {  // the last round: lane i holds sequence lo + i's offsets
      const int start = __ldg(p.cu_seqlens + n);
      const int end = __ldg(p.cu_seqlens + n + 1);
      const int column0 = p.columns != nullptr ? __ldg(p.columns + n) : start;
      if (chunk >= total) return {0, 0, 0};
      const unsigned at_or_before = __ballot_sync(kFullWarp, at_or_before_chunk);
      const int src = kWarpSize - 1 - __clz(at_or_before);  // the last such lane; lane 0 is one
      const int first = __shfl_sync(kFullWarp, start, src) +
                        (chunk - __shfl_sync(kFullWarp, first_chunk, src)) * kChunk;
      const int len = min(kChunk, __shfl_sync(kFullWarp, end, src) - first);
      const int64_t column = static_cast<int64_t>(__shfl_sync(kFullWarp, column0, src)) +
                             (first - __shfl_sync(kFullWarp, start, src));
      return {first * p.stride_seq, column, len};
    }
    const unsigned at_or_before = __ballot_sync(kFullWarp, at_or_before_chunk);
    lo += step * (kWarpSize - 1 - __clz(at_or_before));
    hi = min(hi, lo + step - 1);
  }
}

/* Channel c (0..7) of a lane row, as fp32 (exact). */
template <typename T>
__device__ __forceinline__ float channel_value(const uint32_t (&row)[kWordsPerRow], int c) {
  const float2 pair = to_float2(row[c / 2], T{});
  return c % 2 == 0 ? pair.x : pair.y;
}

/* The lane's 16 tokens of channel c times `multiplier` -> 16 E4M3 bytes in token order.
 * kNoNaN: the caller knows that none of the 16 values is NaN (no NaN-sign fix-up). */
template <typename T, bool kNoNaN = false>
__device__ void cast_channel(const uint32_t (&rows)[kTokensPerLane][kWordsPerRow], int c,
                             float multiplier, uint32_t (&bytes)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = channel_value<T>(rows[4 * q + k], c);
    bytes[q] = kNoNaN ? cast4_to_e4m3_no_nan(x, multiplier) : cast4_to_e4m3(x, multiplier);
  }
}

/* Channel `channel` of head `head`: its data_t row ([heads, head_dim, data_t_stride] E4M3). */
__device__ __forceinline__ uint8_t *data_t_row(const ChunkParams &p, int head, int channel) {
  return p.data_t + (static_cast<int64_t>(head) * p.head_dim + channel) * p.data_t_stride;
}

/* 16 E4M3 bytes of one channel -> data_t at `column`. A lane's group leaves as one 16-byte store
 * per channel when it is complete at a 16-aligned column, and for every group of the aligned
 * layout (ChunkParams::columns: its columns are multiples of 32 and chunks multiples of 16 tokens,
 * so every group starts 16-aligned; in a sequence's short last group the tokens past `valid` are
 * loaded as 0, whose E4M3 byte is 0, and the columns after its last token up to the next multiple
 * of 16 are padding, to be 0; zero_span_tails writes the rest of the span). Otherwise only the
 * `valid` bytes are written: the columns after them belong to the next sequence.
 * cast_and_store_lane tests the same condition. Both write it out: as a shared predicate function
 * nvcc 13.0 compiled both casts differently (the MXFP8 cast 8 instructions longer and 1.5-4 %
 * slower on the H200); the aligned layout's zeros in the byte loop's bound (a path no aligned view
 * takes) likewise keep the MXFP8 cast free of spills. */
__device__ __forceinline__ void store_channel(const ChunkParams &p, int head, int channel,
                                              int64_t column, int valid,
                                              const uint32_t (&bytes)[4]) {
  if (valid <= 0) return;
  uint8_t *dst = data_t_row(p, head, channel) + column;
  if (column % kTokensPerLane == 0 && (valid >= kTokensPerLane || p.columns != nullptr)) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(bytes[0], bytes[1], bytes[2], bytes[3]);
    return;
  }
  const int written = p.columns != nullptr ? kTokensPerLane : valid;
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
    if (j < written) dst[j] = j < valid ? static_cast<uint8_t>(bytes[j / 4] >> (8 * (j % 4))) : 0;
  }
}

/* The aligned layout's padding that no lane writes (ChunkParams::columns; kSpanColumns): the lane
 * of a sequence's last token writes the zeros up to the end of its 16-column group
 * (store_channel), and when the
 * sequence ends in the first half of a 32-column span the second half is padding too. Thread
 * `rank` of `count` zeroes every count-th such 16-column group ((sequence, head x channel row)
 * pairs, sequence fastest). */
__device__ __forceinline__ void zero_span_tails(const ChunkParams &p, int64_t rank, int64_t count) {
  if (p.columns == nullptr) return;
  const int seqs = p.cu_seqlens != nullptr ? p.num_seqs : p.batch;
  const int64_t groups = static_cast<int64_t>(seqs) * p.heads * p.head_dim;
  for (int64_t k = rank; k < groups; k += count) {
    const int64_t row = k / seqs;  // (head, channel) row of data_t
    const int n = static_cast<int>(k - row * seqs);
    const int len =
        p.cu_seqlens != nullptr ? __ldg(p.cu_seqlens + n + 1) - __ldg(p.cu_seqlens + n) : p.seqlen;
    const int tail = len % kSpanColumns;  // the sequence's tokens in its last 32-column span
    if (tail == 0 || tail > kTokensPerLane) continue;
    uint8_t *dst =
        p.data_t + row * p.data_t_stride + __ldg(p.columns + n) + (len - tail + kTokensPerLane);
    *reinterpret_cast<uint4 *>(dst) = uint4{};
  }
}

/* The columns of data_t that belong to no sequence (past the last token, or past the last
 * sequence's aligned columns, up to the row stride), of every head: thread `rank` of `count`
 * zeroes every count-th byte. */
__device__ __forceinline__ void zero_unowned_columns(const ChunkParams &p, int64_t rank,
                                                     int64_t count) {
  int64_t end = p.cu_seqlens != nullptr ? __ldg(p.cu_seqlens + p.num_seqs) : p.tokens;
  if (p.columns != nullptr) end = __ldg(p.columns + p.num_seqs);
  const int64_t width = p.data_t_stride - end;
  const int64_t rows = static_cast<int64_t>(p.heads) * p.head_dim;  // (head, channel) rows
  if (width <= 0 || rank >= width * rows) return;
  if (width * rows <= INT32_MAX) {  // 32-bit index math (a 64-bit division is a subroutine)
    const int w = static_cast<int>(width);
    for (int64_t k = rank; k < width * rows; k += count) {
      const int row = static_cast<int>(k) / w;
      p.data_t[row * p.data_t_stride + end + (static_cast<int>(k) - row * w)] = 0;
    }
    return;
  }
  for (int64_t k = rank; k < width * rows; k += count) {
    const int64_t row = k / width;
    p.data_t[row * p.data_t_stride + end + k - row * width] = 0;
  }
}

/* Every data_t column that no lane writes, thread `rank` of `count`: the columns of no sequence
 * and the aligned layout's span tails. */
__device__ __forceinline__ void zero_unwritten_columns(const ChunkParams &p, int64_t rank,
                                                       int64_t count) {
  zero_unowned_columns(p, rank, count);
  zero_span_tails(p, rank, count);
}

}  // namespace transposed
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_TRANSPOSED_CUH_
