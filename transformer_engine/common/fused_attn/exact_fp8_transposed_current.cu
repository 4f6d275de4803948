/*
 * The current-scaling V cast, written transposed (token axis last) for the attention kernel's
 * P.V: E4M3 with one scale per (head, chunk of tokens of one sequence), the amax over the chunk's
 * tokens and all head_dim channels. See Note [Mask-exact FP8 scaling] (exact_fp8/formats.py):
 * chunks start at each sequence's first token and never cross a sequence.
 *
 * One pass, registers only, one block per work item. An item is a span of 128 tokens (128 / chunk
 * consecutive chunks) of one head; the grid runs the spans fastest. A block is
 * head_dim / 32 warps: warp w holds tokens 64 (w / slices) .. + 63 of the span for channels
 * 64 (w % slices) .. + 63 (slices = head_dim / 64), and its lane (token group g = lane / 8, piece
 * k = lane % 8) holds tokens 16 g .. + 15 of those 64 for channels 8 k .. + 7:
 *  - load: 16 independent 16-byte loads per lane, one per token row (element loads for unaligned
 *    views); rows past the chunk's last token are never read (they may hold another sequence);
 *  - amax: each lane folds its real rows on the packed 16-bit pairs (one instruction per pair,
 *    NaN kept: a lane that meets a NaN folds again without it, and only such a lane's cast fixes
 *    NaN signs), the chunk's lanes of the warp reduce by xor shuffles, the warp's partial goes to
 *    shared memory and ONE block barrier publishes the partials; each lane takes its chunk's scale
 *    from the warps that hold its tokens;
 *  - cast and store: each channel's 16 E4M3 bytes leave as one 16-byte store; one store
 *    instruction of a warp writes 64 contiguous bytes into each of 8 data_t rows.
 * No shared-memory tiles and no pipeline: 5 blocks per SM are resident at head_dim 128 (96
 * registers), and a block's loads are in flight only until it casts, so a partial last wave of
 * blocks holds few bytes in flight. A grid of fewer than two waves of resident blocks loads
 * without allocating in L1 (use_no_l1_loads): there the 16-byte loads of the default policy fell
 * short of the copy's bandwidth and the ones that skip L1 did not; larger grids keep the
 * default, which is faster for them (benchmarks/results/quantize_bandwidth.md, 2026-12-06).
 */
#include <cstdlib>
#include <cstring>

#include "exact_fp8_device_info.h"
#include "exact_fp8_transposed_current.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

using namespace transposed;  // NOLINT(build/namespaces): the shared constants and helpers

constexpr int kWarpTokens = 64;                                // a warp's tokens of the span
constexpr int kWarpChannels = 64;                              // a warp's channels
constexpr int kLaneGroups = kWarpTokens / kTokensPerLane;      // 4 token groups per warp
constexpr int kLanePieces = kWarpChannels / kChannelsPerLane;  // 8 channel pieces per warp
static_assert(kLaneGroups * kLanePieces == kWarpSize, "a warp is 4 token groups x 8 pieces");

/* The block shape of a head dim. */
template <int kHeadDim>
struct Shape {
  static constexpr int kSlices = kHeadDim / kWarpChannels;              // 64-channel slices
  static constexpr int kWarps = kSlices * (kSpanTokens / kWarpTokens);  // 2 token halves each
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kMinBlocksPerSm = 640 / kHeadDim;  // 96 registers at head_dim 128
};

/* Where a lane works within its item. */
template <int kChunk>
struct Lane {
  int slice;  // 64-channel slice of the warp
  int half;   // token half of the span (tokens 64 half .. + 63)
  int piece;  // channels 64 slice + 8 piece .. + 7
  int token;  // first of its 16 tokens within the span
  int chunk;  // the chunk of the span that holds them
  int first;  // the first token's index within that chunk

  template <int kSlices>
  __device__ static Lane of_thread() {
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    Lane l;
    l.slice = warp % kSlices;
    l.half = warp / kSlices;
    l.piece = lane % kLanePieces;
    l.token = l.half * kWarpTokens + lane / kLanePieces * kTokensPerLane;
    l.chunk = l.token / kChunk;
    l.first = l.token - l.chunk * kChunk;
    return l;
  }
};

/* The lane's chunk (warp-collective: every lane of the warp calls it): the warp's tokens lie in
 * kWarpTokens / kChunk chunks (1 for kChunk >= 64), each located once for the whole warp. */
template <int kChunk>
__device__ ChunkSpan lane_chunk(const ChunkParams &p, int span, const Lane<kChunk> &lane) {
  constexpr int kCount = kSpanTokens / kChunk;
  constexpr int kWarpChunks = kWarpTokens > kChunk ? kWarpTokens / kChunk : 1;
  const int first_chunk = lane.half * kWarpTokens / kChunk;  // the warp's first chunk in the span
  ChunkSpan mine = locate_chunk_warp<kChunk>(p, span * kCount + first_chunk);
#pragma unroll
  for (int k = 1; k < kWarpChunks; ++k) {
    const ChunkSpan s = locate_chunk_warp<kChunk>(p, span * kCount + first_chunk + k);
    if (lane.chunk == first_chunk + k) mine = s;
  }
  return mine;
}

/* The lane's 16 token rows x 8 channels as raw 16-bit pairs, zeros from row `valid` on. */
template <typename T, bool kVectorized, bool kNoL1>
__device__ void load_rows(const ChunkParams &p, int head, int channel, const ChunkSpan &s,
                          int first, int valid, uint32_t (&rows)[kTokensPerLane][kWordsPerRow]) {
  // [batch, seqlen, heads, head_dim] view at the lane's first token, head and channel
  const T *src = static_cast<const T *>(p.v) + s.src_offset + head * p.stride_head + channel +
                 static_cast<int64_t>(first) * p.stride_seq;
  if (valid >= kTokensPerLane) {  // the common case: 16 loads, no branches between them
#pragma unroll
    for (int j = 0; j < kTokensPerLane; ++j) {
      const uint4 raw = load_vec8<T, kVectorized, kNoL1>(src + j * p.stride_seq);
      rows[j][0] = raw.x;
      rows[j][1] = raw.y;
      rows[j][2] = raw.z;
      rows[j][3] = raw.w;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
    uint4 raw = make_uint4(0u, 0u, 0u, 0u);
    if (j < valid) raw = load_vec8<T, kVectorized, kNoL1>(src + j * p.stride_seq);
    rows[j][0] = raw.x;
    rows[j][1] = raw.y;
    rows[j][2] = raw.z;
    rows[j][3] = raw.w;
  }
}

/* Per-half max |x| over the lane's rows, packed like the input: one chain per channel pair (16
 * dependent maxima, not 64), then the four chains. kKeepNaN: NaN wins (abs_max2_keep_nan; the
 * signs are then garbage, see abs_max2_sign_cleared), else NaN is skipped (abs_max2). */
template <typename T, bool kKeepNaN>
__device__ __forceinline__ uint32_t
fold_rows(const uint32_t (&rows)[kTokensPerLane][kWordsPerRow]) {
  static_assert(kWordsPerRow == 4, "the chains fold as two pairs");
  auto max2 = [](uint32_t a, uint32_t b) {
    return kKeepNaN ? abs_max2_keep_nan<T>(a, b) : abs_max2<T>(a, b);
  };
  uint32_t pairs[kWordsPerRow] = {};
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
#pragma unroll
    for (int w = 0; w < kWordsPerRow; ++w) pairs[w] = max2(pairs[w], rows[j][w]);
  }
  return max2(max2(pairs[0], pairs[1]), max2(pairs[2], pairs[3]));
}

/* The lane's max |x| over its rows (exact, on the packed 16-bit pairs; the rows past its real
 * tokens are 0), and whether one of them holds a NaN. A NaN decides no scale: its amax is then
 * the max over the other values (a second fold, on the rare lanes that hold a NaN). */
template <typename T>
__device__ float lane_amax(const uint32_t (&rows)[kTokensPerLane][kWordsPerRow], bool *has_nan) {
  // rows from `valid` on are 0 (load_rows), so folding all 16 gives the same max
  float2 pair = to_float2(abs_max2_sign_cleared(fold_rows<T, true>(rows)), T{});
  *has_nan = is_nan(pair.x) || is_nan(pair.y);
  if (*has_nan) pair = to_float2(fold_rows<T, false>(rows), T{});
  return fmaxf(pair.x, pair.y);
}

/* The amax of the lane's chunk over the lanes of the warp that hold tokens of it (lane_amax of
 * each); the chunk's first such lane writes it to partial ([chunks of a span] fp32, the warp's
 * row). */
template <int kChunk>
__device__ void warp_chunk_amax(float amax, const Lane<kChunk> &lane, float *partial) {
  // lanes 8 g .. 8 g + 7 hold token group g: a chunk's lanes are aligned and consecutive
  constexpr int kLanes = kChunk / kTokensPerLane * kLanePieces;
  constexpr int kChunkLanes = kLanes < kWarpSize ? kLanes : kWarpSize;
  amax = group_max(amax, kChunkLanes);
  if (threadIdx.x % kChunkLanes == 0) partial[lane.chunk] = amax;
}

/* The scale of the lane's chunk from the warps' partial amaxes ([warps][chunks of a span] fp32:
 * the warps whose token half overlaps the chunk); the chunk's first lane of slice 0 writes its
 * scale_inv (p.scales: [heads, num_chunks] fp32) when the chunk holds tokens. */
template <int kHeadDim, int kChunk>
__device__ float chunk_scale(const ChunkParams &p, int span, int head, const Lane<kChunk> &lane,
                             int len, const float (*partial)[kSpanTokens / kChunk]) {
  using S = Shape<kHeadDim>;
  // See Note [Mask-exact FP8 scaling]: one scale over this chunk's tokens and channels.
  const int lo = lane.chunk * kChunk;  // the chunk's tokens within the span
  float amax = 0.0f;                   // every partial is >= 0 and not NaN
#pragma unroll
  for (int w = 0; w < S::kWarps; ++w) {
    const int half = w / S::kSlices * kWarpTokens;  // the warp's tokens within the span
    if (half < lo + kChunk && lo < half + kWarpTokens) amax = fmaxf(amax, partial[w][lane.chunk]);
  }
  const float scale = compute_scale_from_amax(amax, p.opts.use_power_2_scales, p.opts.amax_epsilon);
  if (lane.slice == 0 && lane.piece == 0 && lane.first == 0 && len > 0) {
    const int64_t chunk = static_cast<int64_t>(span) * (kSpanTokens / kChunk) + lane.chunk;
    static_cast<float *>(p.scales)[head * static_cast<int64_t>(p.num_chunks) + chunk] =
        scale_inverse(scale);
  }
  return scale;
}

/* Item (span, head): load, amax, ONE block barrier, cast and store. */
template <typename T, int kHeadDim, int kChunk, bool kVectorized, bool kNoL1>
__device__ __forceinline__ void cast_item(const ChunkParams &p, int span, int head,
                                          float (*partial)[kSpanTokens / kChunk]) {
  using S = Shape<kHeadDim>;
  const Lane<kChunk> lane = Lane<kChunk>::template of_thread<S::kSlices>();
  const ChunkSpan s = lane_chunk<kChunk>(p, span, lane);
  const int channel = lane.slice * kWarpChannels + lane.piece * kChannelsPerLane;
  const int valid = s.len - lane.first;         // the lane's real tokens (<= 0: none)
  uint32_t rows[kTokensPerLane][kWordsPerRow];  // [token, channel pair] raw 16-bit pairs
  load_rows<T, kVectorized, kNoL1>(p, head, channel, s, lane.first, valid, rows);
  bool has_nan = false;
  const float amax = lane_amax<T>(rows, &has_nan);
  warp_chunk_amax<kChunk>(amax, lane, partial[threadIdx.x / kWarpSize]);
  __syncthreads();  // every warp's partials are written
  const float scale = chunk_scale<kHeadDim, kChunk>(p, span, head, lane, s.len, partial);
  const int64_t column = s.column + lane.first;
  if (valid > 0 && !has_nan) {
    cast_and_store_lane<T, true>(p, head, rows, scale, channel, column, valid);
  } else if (valid > 0) {
    cast_and_store_lane<T, false>(p, head, rows, scale, channel, column, valid);
  }
}

/* Grid: [spans, heads] blocks (at least one); every block also zeroes its share of the columns
 * that belong to no sequence and of the aligned layout's span tails. kNoL1: the 16-byte loads do
 * not allocate in L1 (use_no_l1_loads). */
template <typename T, int kHeadDim, int kChunk, bool kVectorized, bool kNoL1>
__global__ void __launch_bounds__(Shape<kHeadDim>::kThreads, Shape<kHeadDim>::kMinBlocksPerSm)
    current_cast_transposed_kernel(const ChunkParams p) {
  using S = Shape<kHeadDim>;
  __shared__ float partial[S::kWarps][kSpanTokens / kChunk];  // the warps' chunk amaxes
  const int span = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  if (span < p.num_spans && head < p.heads) {
    cast_item<T, kHeadDim, kChunk, kVectorized, kNoL1>(p, span, head, partial);
  }
  const int64_t block = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  zero_unwritten_columns(p, block * S::kThreads + threadIdx.x,
                         static_cast<int64_t>(gridDim.x) * gridDim.y * S::kThreads);
}

/* Whether a grid of `blocks` loads without allocating in L1: when it is shorter than two waves of
 * resident blocks (blocks_per_sm a multiprocessor). Measured at d = 128 (2026-12-06,
 * benchmarks/results/quantize_bandwidth.md): at 1.55 waves (bshd b=2 h_kv=16 s=4k, GQA b=1
 * h_kv=8 s=16k) such loads took the cast from 76-77 % to 82-83 % of the copy's bandwidth on the
 * H200 and from 82-83 % to 92-94 % on the H100; from 3.1 waves on (8k, 16k, the thd pack) they
 * cost 2-4 points on the H100. NVTE_EXACT_FP8_V_CAST_NO_L1=1
 * or 0 forces the choice (tests, benchmarks). */
bool use_no_l1_loads(int64_t blocks, int blocks_per_sm, cudaError_t *err) {
  if (const char *force = std::getenv("NVTE_EXACT_FP8_V_CAST_NO_L1")) {
    if (std::strcmp(force, "1") == 0) return true;
    if (std::strcmp(force, "0") == 0) return false;
  }
  int sms = 0;
  *err = current_device_sm_count(&sms);
  return *err == cudaSuccess && blocks < 2LL * sms * blocks_per_sm;
}

template <typename T, int kHeadDim, int kChunk>
cudaError_t launch_shaped(const ChunkParams &p, bool vectorized, cudaStream_t stream) {
  using S = Shape<kHeadDim>;
  if (p.heads > kMaxGridHeads) return cudaErrorInvalidConfiguration;
  const dim3 grid(p.num_spans > 0 ? p.num_spans : 1, p.heads > 0 ? p.heads : 1);
  cudaError_t err = cudaSuccess;
  const bool no_l1 = vectorized && use_no_l1_loads(static_cast<int64_t>(grid.x) * grid.y,
                                                   S::kMinBlocksPerSm, &err);
  if (err != cudaSuccess) return err;
  auto kernel = !vectorized ? current_cast_transposed_kernel<T, kHeadDim, kChunk, false, false>
                : no_l1     ? current_cast_transposed_kernel<T, kHeadDim, kChunk, true, true>
                            : current_cast_transposed_kernel<T, kHeadDim, kChunk, true, false>;
  kernel<<<grid, S::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_current_cast_transposed(const NVTEExactFP8TokenView &v,
                                           const NVTEExactFP8Chunks &chunks, ScaleOptions opts,
                                           uint8_t *data_t, int64_t data_t_stride, float *scale_inv,
                                           cudaStream_t stream) {
  const ChunkParams p = make_chunk_params(v, chunks, opts, data_t, data_t_stride, scale_inv);
  const bool vectorized = is_vectorizable(v);
  return dispatch_current(v.dtype, p.head_dim, chunks.chunk, [&](auto type, auto dim, auto size) {
    using T = decltype(type);
    return launch_shaped<T, decltype(dim)::value, decltype(size)::value>(p, vectorized, stream);
  });
}

}  // namespace exact_fp8
}  // namespace transformer_engine
