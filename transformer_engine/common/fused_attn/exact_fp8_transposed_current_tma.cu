/*
 * The current-scaling V cast with tensor-tile copies (TMA): the outputs of the cp.async cast
 * (exact_fp8_transposed_current.cu) bit for bit, for every view that a tensor map describes (data
 * 16-byte aligned, strides multiples of 16 bytes). One scale per (head, chunk of tokens of one
 * sequence), the amax over the chunk's tokens and all head_dim channels; see Note [Mask-exact FP8
 * scaling] (exact_fp8/formats.py): chunks start at each sequence's first token and never cross a
 * sequence.
 *
 * Persistent blocks walk the same items (a span of 128 tokens of one head, head fastest) through a
 * ring of kStages tiles in shared memory, one tile per item: [head_dim / 64 boxes][128 token rows]
 * [128 bytes], 128-byte swizzled by the copy engine. A block is head_dim / 32 consumer warps and
 * one producer warp:
 *  - producer (one thread): waits until the consumers have freed a tile, records the item's
 *    chunks next to it and copies the item in with one [128 tokens x 64 channels] box per 64
 *    channels (16 KiB each), or, for a span whose chunks are not 128 consecutive tokens of one
 *    sample (a sequence's last chunk, chunks of different samples), [16 tokens x 64 channels] boxes
 *    over each chunk's real tokens only; the tile's full barrier completes when the bytes land.
 *    Nothing ties the copies to the cast: all kStages tiles are in flight while the consumers wait.
 *  - consumers: lane (token group g, piece k) of warp w (box w % boxes, token half w / boxes)
 *    holds tokens 64 half + 16 g .. + 15 of channels 64 box + 8 k .. + 7 in registers (8 lanes of
 *    one token group read 8 different pieces of a row: free of bank conflicts under the swizzle),
 *    frees the tile, folds its chunk's amax over its real tokens (rows past a chunk's last token
 *    may hold another sequence's tokens: never read into an amax or a store), reduces it over
 *    the warp, meets the other consumer warps at one named barrier for the chunk's scale, casts
 *    and stores each channel's 16 E4M3 bytes with one 16-byte store (4 lanes write 64 contiguous
 *    bytes of each of 8 data_t rows per store instruction).
 */
#include <cuda.h>

#include <cstdlib>
#include <cstring>

#include "exact_fp8_tensor_map.h"
#include "exact_fp8_tma.cuh"
#include "exact_fp8_transposed_current.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

using namespace transposed;  // NOLINT(build/namespaces): the shared constants and helpers

constexpr int kStages = 3;                     // tiles in the ring
constexpr int kGroupRows = kTokensPerLane;     // token rows of the small box
constexpr int kRowBytes = kBoxChannels * 2;    // a box row: 64 16-bit channels
constexpr int kPiecesPerRow = kRowBytes / 16;  // 16-byte pieces of a box row
constexpr int kSwizzleBytes = 1024;            // the 128-byte swizzle's period (8 rows)
constexpr int kConsumerBarrier = 1;            // named barrier of the consumer warps

/* The block shape of a head dim. */
template <int kHeadDim>
struct TmaShape {
  static constexpr int kBoxes = kHeadDim / kBoxChannels;      // boxes per tile
  static constexpr int kWarps = kHeadDim / kChannelsPerWarp;  // consumer warps: 2 per box
  static constexpr int kConsumers = kWarps * kWarpSize;
  static constexpr int kThreads = kConsumers + kWarpSize;  // + the producer warp
  static constexpr int kWarpTokens = kSpanTokens * kBoxes / kWarps;  // a warp's tokens of a box
  static constexpr int kBoxBytes = kSpanTokens * kRowBytes;          // 16 KiB
  static constexpr int kTileBytes = kBoxes * kBoxBytes;
  static constexpr int kSmemBytes = kStages * kTileBytes + kSwizzleBytes;  // + alignment slack
  static constexpr int kBlocksPerSm = 256 / kHeadDim;  // what the ring lets fit
};
static_assert(TmaShape<kMaxHeadDim>::kSmemBytes <= 227 * 1024, "the ring fits one SM");
static_assert(TmaShape<128>::kWarpTokens == 4 * kTokensPerLane, "4 token groups per warp");

/* The ring's mbarriers and what the producer tells the consumers about each tile's item. */
template <int kHeadDim, int kChunk>
struct Ring {
  static constexpr int kCount = SpanChunks<kChunk>::kCount;
  uint64_t full[kStages];   // the tile's bytes have landed (1 arrival + bytes)
  uint64_t empty[kStages];  // every consumer warp holds its rows (one arrival per warp)
  SpanChunks<kChunk> chunks[kStages];
  float partial[kStages][TmaShape<kHeadDim>::kWarps][kCount];  // the warps' chunk amaxes
};

/* Whether the item's chunks are 128 consecutive real tokens of one sample (one box height). */
template <int kChunk>
__device__ bool whole_span(const ChunkSpan (&s)[SpanChunks<kChunk>::kCount]) {
  bool whole = true;
#pragma unroll
  for (int c = 0; c < SpanChunks<kChunk>::kCount; ++c) {
    whole = whole && s[c].len == kChunk && s[c].sample == s[0].sample &&
            s[c].token == s[0].token + c * kChunk;
  }
  return whole;
}

/* Copies item `item` (span item / heads, head item % heads) into `tile` ([boxes][128 rows][128
 * bytes] swizzled) and records its chunks; the bytes complete on `full`. span_map, group_map:
 * boxes of 128 and 16 token rows (exact_fp8_tensor_map.h). */
template <int kHeadDim, int kChunk>
__device__ void load_item(const ChunkParams &p, const CUtensorMap *span_map,
                          const CUtensorMap *group_map, int64_t item, uint8_t *tile,
                          SpanChunks<kChunk> &chunks, uint64_t *full) {
  using S = TmaShape<kHeadDim>;
  constexpr int kCount = SpanChunks<kChunk>::kCount;
  const int span = static_cast<int>(item / p.heads);
  const int head = static_cast<int>(item - static_cast<int64_t>(span) * p.heads);
  ChunkSpan s[kCount];
  int groups = 0;  // 16-row boxes per 64 channels
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
    s[c] = locate_chunk<kChunk>(p, span * kCount + c);
    chunks.column[c] = s[c].column;
    chunks.len[c] = s[c].len;
    groups += (s[c].len + kGroupRows - 1) / kGroupRows;
  }
  const bool whole = whole_span<kChunk>(s);
  const uint32_t bytes = whole ? S::kTileBytes : groups * kGroupRows * kRowBytes * S::kBoxes;
  tma::barrier_arrive_expect(full, bytes);  // releases the chunks written above
  if (whole) {
#pragma unroll
    for (int b = 0; b < S::kBoxes; ++b) {
      tma::load_box_4d(tile + b * S::kBoxBytes, span_map, b * kBoxChannels, head, s[0].token,
                       s[0].sample, full);
    }
    return;
  }
#pragma unroll
  for (int c = 0; c < kCount; ++c) {
    for (int r = 0; r < s[c].len; r += kGroupRows) {
#pragma unroll
      for (int b = 0; b < S::kBoxes; ++b) {
        tma::load_box_4d(tile + b * S::kBoxBytes + (c * kChunk + r) * kRowBytes, group_map,
                         b * kBoxChannels, head, s[c].token + r, s[c].sample, full);
      }
    }
  }
}

/* The producer thread: every item of the block, each into the next tile once it is free. */
template <int kHeadDim, int kChunk>
__device__ void produce(const ChunkParams &p, const CUtensorMap *span_map,
                        const CUtensorMap *group_map, int64_t items, uint8_t *tiles,
                        Ring<kHeadDim, kChunk> &ring) {
  tma::prefetch_map(span_map);
  tma::prefetch_map(group_map);
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    tma::barrier_wait(&ring.empty[stage], phase ^ 1);  // the first round finds every tile free
    load_item<kHeadDim, kChunk>(p, span_map, group_map, item,
                                tiles + stage * TmaShape<kHeadDim>::kTileBytes, ring.chunks[stage],
                                &ring.full[stage]);
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

/* Where a consumer lane works within a tile. */
template <int kHeadDim, int kChunk>
struct Lane {
  int box;    // 64-channel box: channels 64 box + 8 piece .. + 7
  int piece;  // 16-byte piece of the box row
  int token;  // first of its 16 tokens within the span
  int chunk;  // the chunk of the span that holds them
  int first;  // the first token's index within that chunk

  __device__ Lane() {
    using S = TmaShape<kHeadDim>;
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    box = warp % S::kBoxes;
    piece = lane % kPiecesPerRow;
    token = warp / S::kBoxes * S::kWarpTokens + lane / kPiecesPerRow * kTokensPerLane;
    chunk = token / kChunk;
    first = token - chunk * kChunk;
  }
};

/* The lane's 16 token rows x 8 channels (raw 16-bit pairs) from `tile` ([boxes][128 rows]
 * [128 bytes], the 16-byte piece k of row r at piece k ^ (r % 8)). */
template <int kHeadDim, int kChunk>
__device__ void read_rows(const uint8_t *tile, const Lane<kHeadDim, kChunk> &lane,
                          uint32_t (&rows)[kTokensPerLane][kWordsPerRow]) {
  // lane.token is a multiple of 16, so row lane.token + j has swizzle j % 8
  const uint8_t *base = tile + lane.box * TmaShape<kHeadDim>::kBoxBytes + lane.token * kRowBytes;
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
    const uint4 raw = *reinterpret_cast<const uint4 *>(base + j * kRowBytes +
                                                       ((lane.piece ^ (j % 8)) * 16));
    rows[j][0] = raw.x;
    rows[j][1] = raw.y;
    rows[j][2] = raw.z;
    rows[j][3] = raw.w;
  }
}

/* The amax of the lane's chunk over the `valid` real rows of every lane of the warp that holds
 * tokens of it (exact, on the packed 16-bit pairs; a NaN decides no scale); the chunk's first
 * such lane writes it to partial ([chunks of a span] fp32, the warp's row). */
template <typename T, int kHeadDim, int kChunk>
__device__ void warp_chunk_amax(const uint32_t (&rows)[kTokensPerLane][kWordsPerRow], int valid,
                                const Lane<kHeadDim, kChunk> &lane, float *partial) {
  // lanes 8 g .. 8 g + 7 hold token group g: a chunk's lanes are aligned and consecutive
  constexpr int kLanes = kChunk / kTokensPerLane * kPiecesPerRow;
  constexpr int kChunkLanes = kLanes < kWarpSize ? kLanes : kWarpSize;
  uint32_t pairs = 0;  // running max of |x|, packed like the input
#pragma unroll
  for (int j = 0; j < kTokensPerLane; ++j) {
    if (j < valid) {
      pairs = abs_max2<T>(
          abs_max2<T>(abs_max2<T>(abs_max2<T>(pairs, rows[j][0]), rows[j][1]), rows[j][2]),
          rows[j][3]);
    }
  }
  const float2 pair = to_float2(pairs, T{});
  const float amax = group_max(fmaxf(pair.x, pair.y), kChunkLanes);
  if (threadIdx.x % kChunkLanes == 0) partial[lane.chunk] = amax;
}

/* The scale of the lane's chunk from the warps' partial amaxes ([warps][chunks of a span] fp32:
 * the warps whose token half overlaps the chunk); the chunk's first lane of box 0 writes its
 * scale_inv (p.scales: [heads, num_chunks] fp32) when the chunk holds tokens. */
template <int kHeadDim, int kChunk>
__device__ float chunk_scale(const ChunkParams &p, int span, int head,
                             const Lane<kHeadDim, kChunk> &lane, int len,
                             const float (*partial)[SpanChunks<kChunk>::kCount]) {
  using S = TmaShape<kHeadDim>;
  // See Note [Mask-exact FP8 scaling]: one scale over this chunk's tokens and channels.
  const int lo = lane.chunk * kChunk;  // the chunk's tokens within the span
  float amax = 0.0f;                   // every partial is >= 0 and not NaN
#pragma unroll
  for (int w = 0; w < S::kWarps; ++w) {
    const int half = w / S::kBoxes * S::kWarpTokens;  // the warp's tokens within the span
    if (half < lo + kChunk && lo < half + S::kWarpTokens) {
      amax = fmaxf(amax, partial[w][lane.chunk]);
    }
  }
  const float scale = compute_scale_from_amax(amax, p.opts.use_power_2_scales, p.opts.amax_epsilon);
  if (lane.box == 0 && lane.piece == 0 && lane.first == 0 && len > 0) {
    const int64_t chunk = static_cast<int64_t>(span) * SpanChunks<kChunk>::kCount + lane.chunk;
    static_cast<float *>(p.scales)[head * static_cast<int64_t>(p.num_chunks) + chunk] =
        scale_inverse(scale);
  }
  return scale;
}

/* A consumer warp: every item of the block, tile by tile. */
template <typename T, int kHeadDim, int kChunk>
__device__ void consume(const ChunkParams &p, int64_t items, const uint8_t *tiles,
                        Ring<kHeadDim, kChunk> &ring) {
  using S = TmaShape<kHeadDim>;
  const Lane<kHeadDim, kChunk> lane;
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    tma::barrier_wait(&ring.full[stage], phase);
    const int len = ring.chunks[stage].len[lane.chunk];
    const int64_t column = ring.chunks[stage].column[lane.chunk] + lane.first;
    uint32_t rows[kTokensPerLane][kWordsPerRow];  // [token, channel pair] raw 16-bit pairs
    read_rows<kHeadDim, kChunk>(tiles + stage * S::kTileBytes, lane, rows);
    __syncwarp();
    if (threadIdx.x % kWarpSize == 0) tma::barrier_arrive(&ring.empty[stage]);  // tile read
    const int valid = len - lane.first;  // the lane's real tokens (<= 0: none)
    warp_chunk_amax<T, kHeadDim, kChunk>(rows, valid, lane,
                                         ring.partial[stage][threadIdx.x / kWarpSize]);
    // Every warp's partials of this item are written (those of an item kStages on reuse the
    // row: every warp has read it before it reaches the next item's barrier).
    tma::named_barrier(kConsumerBarrier, S::kConsumers);
    const int span = static_cast<int>(item / p.heads);
    const int head = static_cast<int>(item - static_cast<int64_t>(span) * p.heads);
    const float scale =
        chunk_scale<kHeadDim, kChunk>(p, span, head, lane, len, ring.partial[stage]);
    const int channel = lane.box * kBoxChannels + lane.piece * kChannelsPerLane;
    if (valid > 0) cast_and_store_lane<T>(p, head, rows, scale, channel, column, valid);
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

/* Grid: persistent blocks (what fits on the device, at most one per item); `items`: spans x
 * heads. The consumers also zero their share of the columns that belong to no sequence. */
template <typename T, int kHeadDim, int kChunk>
__global__ void __launch_bounds__(TmaShape<kHeadDim>::kThreads, TmaShape<kHeadDim>::kBlocksPerSm)
    tma_cast_transposed_kernel(const ChunkParams p, const __grid_constant__ CUtensorMap span_map,
                               const __grid_constant__ CUtensorMap group_map,
                               const int64_t items) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using S = TmaShape<kHeadDim>;
  extern __shared__ uint8_t smem[];  // [kStages][boxes][128 rows][128 bytes], after alignment
  __shared__ Ring<kHeadDim, kChunk> ring;
  const uint32_t misalignment = tma::smem_address(smem) % kSwizzleBytes;
  uint8_t *tiles = smem + (misalignment == 0 ? 0 : kSwizzleBytes - misalignment);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(&ring.full[s], 1);
      tma::barrier_init(&ring.empty[s], S::kWarps);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= S::kConsumers) {
    if (threadIdx.x == S::kConsumers) {
      produce<kHeadDim, kChunk>(p, &span_map, &group_map, items, tiles, ring);
    }
    return;
  }
  zero_unowned_columns(p, static_cast<int64_t>(blockIdx.x) * S::kConsumers + threadIdx.x,
                       static_cast<int64_t>(gridDim.x) * S::kConsumers);
  consume<T, kHeadDim, kChunk>(p, items, tiles, ring);
#endif
}

template <typename T, int kHeadDim, int kChunk>
cudaError_t launch_shaped(const ChunkParams &p, const CUtensorMap &span_map,
                          const CUtensorMap &group_map, int64_t items, cudaStream_t stream) {
  using S = TmaShape<kHeadDim>;
  static std::atomic<int> cache[kMaxDevices];  // resident blocks per device, 0: not yet known
  auto kernel = tma_cast_transposed_kernel<T, kHeadDim, kChunk>;
  int blocks = 0;
  const cudaError_t err = resident_blocks(kernel, S::kThreads, S::kSmemBytes, cache, &blocks);
  if (err != cudaSuccess) return err;
  const int64_t grid = items < blocks ? items : blocks;
  kernel<<<static_cast<unsigned>(grid), S::kThreads, S::kSmemBytes, stream>>>(p, span_map,
                                                                             group_map, items);
  return cudaGetLastError();
}

/* NVTE_EXACT_FP8_V_CAST_TMA=0 turns the TMA cast off (read once). */
bool tma_enabled() {
  static const bool enabled = [] {
    const char *value = std::getenv("NVTE_EXACT_FP8_V_CAST_TMA");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

/* Whether the current device has tensor maps (compute capability 9.0 or newer). */
bool device_has_tma() {
  int device = 0;
  int major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 9;
}

}  // namespace

cudaError_t launch_current_cast_transposed_tma(const NVTEExactFP8TokenView &v,
                                               const ChunkParams &p, int chunk,
                                               cudaStream_t stream) {
  const int64_t items = static_cast<int64_t>(p.num_spans) * p.heads;
  if (!tma_enabled() || items < 1 || !device_has_tma()) return cudaErrorNotSupported;
  CUtensorMap span_map;   // boxes [1 sample, 128 tokens, 1 head, 64 channels] of v
  CUtensorMap group_map;  // boxes [1 sample, 16 tokens, 1 head, 64 channels] of v
  if (!make_token_box_map(v, kSpanTokens, &span_map) ||
      !make_token_box_map(v, kGroupRows, &group_map)) {
    return cudaErrorNotSupported;
  }
  return dispatch_current(v.dtype, p.head_dim, chunk, [&](auto type, auto dim, auto chunk_tag) {
    return launch_shaped<decltype(type), decltype(dim)::value, decltype(chunk_tag)::value>(
        p, span_map, group_map, items, stream);
  });
}

}  // namespace exact_fp8
}  // namespace transformer_engine
