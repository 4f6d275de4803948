/*
 * The current-scaling V cast, written transposed (token axis last) for the attention kernel's
 * P.V: E4M3 with one scale per (head, chunk of tokens of one sequence), the amax over the chunk's
 * tokens and all head_dim channels. See Note [Mask-exact FP8 scaling] (exact_fp8/formats.py):
 * chunks start at each sequence's first token and never cross a sequence.
 *
 * Persistent blocks, a pipeline over work items. An item is a span of 128 tokens (128 / chunk
 * consecutive chunks) of one head: a tile of 128 token rows x head_dim channels, 32 KiB of bf16
 * at head_dim 128. A block of head_dim threads (one warp per 32-channel slice) walks the items
 * blockIdx.x, blockIdx.x + gridDim.x, ... (head fastest, so the blocks at work read whole token
 * rows of the view between them) through a ring of kStages tiles in shared memory:
 *  - copy: 16-byte cp.async copies (zero-filled past a chunk's last token), each thread taking
 *    the same (row, 16-byte piece) slots of every tile; the copies of an item start kStages - 1
 *    items ahead of its cast, so the loads of the next items are in flight while one is cast;
 *  - amax: each thread folds the pieces it copied itself (so it waits for no other thread) per
 *    chunk, on the packed 16-bit pairs; each warp reduces by shuffles and writes its partial;
 *  - one block barrier per item publishes the tile and the warps' partials, and frees the tile
 *    that the next copies refill;
 *  - cast: lane (channel group, token group) of warp w reads 16 token rows x 8 channels of slice
 *    w from the tile (16-byte reads, swizzled so that they are free of bank conflicts), casts them
 *    with its chunk's scale and writes each channel's 16 E4M3 bytes with one 16-byte store; one
 *    store instruction of a warp writes 128 contiguous bytes into each of 4 data_t rows.
 * Unaligned views (element loads) fill the tiles with ordinary loads instead of cp.async.
 *
 * The fallback of the TMA cast (exact_fp8_transposed_current_tma.cu, the same outputs bit for
 * bit): it runs the views that no tensor map describes (unaligned data or strides), on drivers
 * without tensor maps, and with NVTE_EXACT_FP8_V_CAST_TMA=0.
 */
#include "exact_fp8_transposed_current.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

using namespace transposed;  // NOLINT(build/namespaces): the shared constants and helpers

constexpr int kStages = 3;        // tiles in the ring: copies run kStages - 1 items ahead
constexpr int kRowsPerRound = 8;  // token rows that one copy per thread covers (head_dim / 8
                                  // threads per row, head_dim threads)

/* The block shape of a head dim. */
template <int kHeadDim>
struct Shape {
  static constexpr int kThreads = kHeadDim;  // one warp per slice
  static constexpr int kWarps = kHeadDim / kChannelsPerWarp;
  static constexpr int kPieces = kHeadDim / kVecElems;           // 16-byte pieces per row
  static constexpr int kTilePieces = kSpanTokens * kPieces;      // 16-byte pieces per tile
  static constexpr int kSmemBytes = kStages * kTilePieces * 16;  // the ring
  static constexpr int kBlocksPerSm = 256 / kHeadDim;  // what the ring lets fit: 8 warps per SM
};
static_assert(Shape<kMaxHeadDim>::kSmemBytes <= 200 * 1024, "the ring fits one SM");

/* Slot of the 16-byte piece `piece` of tile row `row`: the piece's index within its 128 bytes is
 * xor-ed with the row's 16-token group, so the 8 lanes that read rows g * 16 + j (g = 0..7) of
 * one channel group hit 8 different bank groups, while each row's pieces stay a permutation of
 * their 128 bytes (the row-wise copies and amax reads stay free of conflicts too). */
template <int kPieces>
__device__ __forceinline__ int swizzled(int row, int piece) {
  return row * kPieces + (piece ^ (row / kTokensPerLane));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/* One 16-byte piece of a token row into shared memory: cp.async (16 zero bytes when `valid` is
 * false, reading nothing), or element loads for unaligned views (`vectorized` false). `fallback`:
 * any readable, 16-byte aligned address (what a zero-filled copy names). */
template <typename T>
__device__ __forceinline__ void copy_piece(const T *src, bool valid, bool vectorized,
                                           const void *fallback, uint4 *dst) {
  if (vectorized) {
    const uint32_t slot = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(slot),
                 "l"(valid ? static_cast<const void *>(src) : fallback), "r"(valid ? 16 : 0)
                 : "memory");
  } else {
    *dst = valid ? load_vec8<T, false>(src) : make_uint4(0u, 0u, 0u, 0u);
  }
}

/* Starts the copies of item `item` (span item / heads, head item % heads) into `tile`
 * ([128 rows x kPieces] 16-byte pieces, swizzled); thread 0 records the chunks in `chunks`.
 * Thread t copies piece t % kPieces of rows t / kPieces + 8 k. No item past `items`. */
template <typename T, int kHeadDim, int kChunk>
__device__ void copy_item(const ChunkParams &p, int64_t items, bool vectorized, int64_t item,
                          uint4 *tile, SpanChunks<kChunk> &chunks) {
  using S = Shape<kHeadDim>;
  if (item >= items) return;
  const int span = static_cast<int>(item / p.heads);
  const int head = static_cast<int>(item - static_cast<int64_t>(span) * p.heads);
  const int row0 = threadIdx.x / S::kPieces;
  const int piece = threadIdx.x % S::kPieces;
  // [batch, seqlen, heads, head_dim] view at (0, 0, head, 8 piece)
  const T *base = static_cast<const T *>(p.v) + head * p.stride_head + piece * kVecElems;
#pragma unroll
  for (int c = 0; c < SpanChunks<kChunk>::kCount; ++c) {
    const ChunkSpan s = locate_chunk<kChunk>(p, span * SpanChunks<kChunk>::kCount + c);
    if (threadIdx.x == 0) {
      chunks.column[c] = s.column;
      chunks.len[c] = s.len;
    }
#pragma unroll
    for (int k = 0; k < kChunk / kRowsPerRound; ++k) {
      const int token = k * kRowsPerRound + row0;  // within the chunk
      copy_piece<T>(base + s.src_offset + token * p.stride_seq, token < s.len, vectorized, p.v,
                    tile + swizzled<S::kPieces>(c * kChunk + token, piece));
    }
  }
}

/* Each chunk's amax over the pieces this thread copied (exact, on the packed 16-bit pairs; a NaN
 * decides no scale), then over the warp: lane 0 writes it to partial[warp][chunk].
 * tile: [128 rows x kPieces] 16-byte pieces, swizzled; partial: [warps][chunks of a span] fp32. */
template <typename T, int kHeadDim, int kChunk>
__device__ void warp_chunk_amax(const uint4 *tile, float (*partial)[SpanChunks<kChunk>::kCount]) {
  using S = Shape<kHeadDim>;
  constexpr int kCount = SpanChunks<kChunk>::kCount;
  const int row0 = threadIdx.x / S::kPieces;
  const int piece = threadIdx.x % S::kPieces;
  uint32_t pairs[kCount] = {};  // [chunk] running max of |x|, packed like the input
#pragma unroll
  for (int k = 0; k < kSpanTokens / kRowsPerRound; ++k) {
    const uint4 raw = tile[swizzled<S::kPieces>(k * kRowsPerRound + row0, piece)];
    uint32_t &m = pairs[k * kRowsPerRound / kChunk];
    m = abs_max2<T>(abs_max2<T>(abs_max2<T>(abs_max2<T>(m, raw.x), raw.y), raw.z), raw.w);
  }
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
    const float2 pair = to_float2(pairs[c], T{});
    const float amax = group_max(fmaxf(pair.x, pair.y), kWarpSize);
    if (threadIdx.x % kWarpSize == 0) partial[threadIdx.x / kWarpSize][c] = amax;
  }
}

/* The scale of the lane's chunk c from the warps' partial amaxes ([warps][chunks of a span]
 * fp32); the chunk's first lane of warp 0 writes its scale_inv (p.scales: [heads, num_chunks]
 * fp32) when the chunk holds tokens. */
template <int kHeadDim, int kChunk>
__device__ float chunk_scale(const ChunkParams &p, int span, int head, int c, bool first_lane,
                             int len, const float (*partial)[SpanChunks<kChunk>::kCount]) {
  // See Note [Mask-exact FP8 scaling]: one scale over this chunk's tokens and channels.
  float amax = partial[0][c];
#pragma unroll
  for (int w = 1; w < Shape<kHeadDim>::kWarps; ++w) amax = fmaxf(amax, partial[w][c]);
  const float scale = compute_scale_from_amax(amax, p.opts.use_power_2_scales, p.opts.amax_epsilon);
  if (first_lane && threadIdx.x < kWarpSize && len > 0) {
    const int64_t chunk = static_cast<int64_t>(span) * SpanChunks<kChunk>::kCount + c;
    static_cast<float *>(p.scales)[head * static_cast<int64_t>(p.num_chunks) + chunk] =
        scale_inverse(scale);
  }
  return scale;
}

/* Casts item `item` from `tile` ([128 rows x kPieces] 16-byte pieces, swizzled) into data_t
 * ([heads, head_dim, data_t_stride] E4M3): lane (channel group cg, token group g) of warp w takes
 * tokens 16 g .. 16 g + 15 of channels 32 w + 8 cg .. + 7. partial: [warps][chunks] fp32. */
template <typename T, int kHeadDim, int kChunk>
__device__ void cast_item(const ChunkParams &p, int64_t item, const uint4 *tile,
                          const SpanChunks<kChunk> &chunks,
                          const float (*partial)[SpanChunks<kChunk>::kCount]) {
  using S = Shape<kHeadDim>;
  const int span = static_cast<int>(item / p.heads);
  const int head = static_cast<int>(item - static_cast<int64_t>(span) * p.heads);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane % kTokenGroups;                  // 16-token group within the span
  const int channels = lane / kTokenGroups;               // 8-channel group within the warp's slice
  const int c = group * kTokensPerLane / kChunk;          // the lane's chunk
  const int first = group * kTokensPerLane - c * kChunk;  // its first token in the chunk
  const int len = chunks.len[c];
  const float scale =
      chunk_scale<kHeadDim, kChunk>(p, span, head, c, channels == 0 && first == 0, len, partial);
  const int valid = len - first;  // the lane's real tokens (<= 0: none)
  if (valid <= 0) return;
  uint32_t rows[kTokensPerLane][kWordsPerRow];  // [token, channel pair] raw 16-bit pairs
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
    const uint4 raw =
        tile[swizzled<S::kPieces>(group * kTokensPerLane + j, warp * kChannelGroups + channels)];
    rows[j][0] = raw.x;
    rows[j][1] = raw.y;
    rows[j][2] = raw.z;
    rows[j][3] = raw.w;
  }
  const int channel = warp * kChannelsPerWarp + channels * kChannelsPerLane;
  cast_and_store_lane<T>(p, head, rows, scale, channel, chunks.column[c] + first, valid);
}

/* Grid: persistent blocks (what fits on the device, at most one per item); `items`: spans x
 * heads. Every block also zeroes its share of the columns that belong to no sequence. */
template <typename T, int kHeadDim, int kChunk>
__global__ void __launch_bounds__(Shape<kHeadDim>::kThreads, Shape<kHeadDim>::kBlocksPerSm)
    current_cast_transposed_kernel(const ChunkParams p, const int64_t items,
                                   const bool vectorized) {
  using S = Shape<kHeadDim>;
  extern __shared__ uint4 tiles[];  // [kStages][128 rows x kPieces] 16-byte pieces, swizzled
  __shared__ SpanChunks<kChunk> chunks[kStages];
  __shared__ float partial[kStages][S::kWarps][SpanChunks<kChunk>::kCount];  // warps' amaxes
  const int64_t step = gridDim.x;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    copy_item<T, kHeadDim, kChunk>(p, items, vectorized, blockIdx.x + s * step,
                                   tiles + s * S::kTilePieces, chunks[s]);
    cp_async_commit();
  }
  zero_unowned_columns(p, static_cast<int64_t>(blockIdx.x) * S::kThreads + threadIdx.x,
                       step * S::kThreads);
  int stage = 0;
  for (int64_t item = blockIdx.x; item < items; item += step) {
    cp_async_wait<kStages - 2>();  // this thread's copies of `item` have landed
    warp_chunk_amax<T, kHeadDim, kChunk>(tiles + stage * S::kTilePieces, partial[stage]);
    // The tile and the partial amaxes of `item` are complete; every thread is done with the
    // previous item's tile, which the next copies refill.
    __syncthreads();
    const int next = stage == 0 ? kStages - 1 : stage - 1;
    copy_item<T, kHeadDim, kChunk>(p, items, vectorized, item + (kStages - 1) * step,
                                   tiles + next * S::kTilePieces, chunks[next]);
    cp_async_commit();
    cast_item<T, kHeadDim, kChunk>(p, item, tiles + stage * S::kTilePieces, chunks[stage],
                                   partial[stage]);
    stage = stage + 1 == kStages ? 0 : stage + 1;
  }
}

template <typename T, int kHeadDim, int kChunk>
cudaError_t launch_shaped(const ChunkParams &p, bool vectorized, cudaStream_t stream) {
  using S = Shape<kHeadDim>;
  static std::atomic<int> cache[kMaxDevices];  // resident blocks per device, 0: not yet known
  auto kernel = current_cast_transposed_kernel<T, kHeadDim, kChunk>;
  int blocks = 0;
  const cudaError_t err = resident_blocks(kernel, S::kThreads, S::kSmemBytes, cache, &blocks);
  if (err != cudaSuccess) return err;
  const int64_t items = static_cast<int64_t>(p.num_spans) * p.heads;
  const int64_t grid = items < blocks ? (items > 0 ? items : 1) : blocks;
  kernel<<<static_cast<unsigned>(grid), S::kThreads, S::kSmemBytes, stream>>>(p, items, vectorized);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_current_cast_transposed(const NVTEExactFP8TokenView &v,
                                           const NVTEExactFP8Chunks &chunks, ScaleOptions opts,
                                           uint8_t *data_t, int64_t data_t_stride, float *scale_inv,
                                           cudaStream_t stream) {
  const ChunkParams p = make_chunk_params(v, chunks, opts, data_t, data_t_stride, scale_inv);
  const cudaError_t err = launch_current_cast_transposed_tma(v, p, chunks.chunk, stream);
  if (err != cudaErrorNotSupported) return err;
  const bool vectorized = is_vectorizable(v);
  return dispatch_current(v.dtype, p.head_dim, chunks.chunk, [&](auto type, auto dim, auto size) {
    using T = decltype(type);
    return launch_shaped<T, decltype(dim)::value, decltype(size)::value>(p, vectorized, stream);
  });
}

}  // namespace exact_fp8
}  // namespace transformer_engine
