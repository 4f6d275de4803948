/*
 * Chunk kernels of the mask-exact FP8 quantizers: V, one scale per (head, chunk of tokens of one
 * sequence, channel), written transposed (token axis last) for the attention kernel's P.V.
 *
 * A work item is one (head, chunk). Each block stays resident and takes every workers-th item,
 * staging the next item's token rows in shared memory (cp.async, 16-byte copies) while it
 * quantizes the current one: each thread takes two channels of 16 tokens, reduces the channel
 * amax with the threads holding the chunk's other tokens, then writes 16 E4M3 bytes per channel
 * as one 16-byte store into the transposed output. See Note [Mask-exact FP8 scaling]
 * (exact_fp8/formats.py): chunks start at each sequence's first token and never cross a sequence.
 */
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "exact_fp8_kernels.h"
#include "exact_fp8_numerics.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kMinThreads = 64;
constexpr int kLoadsPerThread = 4;  // independent 16-byte loads in flight per thread (sync path)
constexpr int kTokensPerThread = 16;  // tokens of one channel per thread: one 16-byte store
constexpr int kSharedWordsPerRowMultiple = 32;  // one row of banks
constexpr int kStages = 2;  // shared-memory tiles per block: the item in work, the next one
constexpr size_t kDefaultSharedBytes = 48 * 1024;

struct ChunkParams {
  const void *v;  // [batch, seqlen, heads, head_dim] view, element strides below
  int64_t stride_batch;
  int64_t stride_seq;
  int64_t stride_head;
  int seqlen;
  int heads;
  int head_dim;
  int row_words;              // 32-bit words per staged token row
  const int32_t *cu_seqlens;  // [num_seqs + 1] token offsets; null: one sequence per sample
  const int32_t *cu_chunks;   // [num_seqs + 1] chunk offsets (with cu_seqlens)
  int num_seqs;
  int num_chunks;
  int chunks_per_sample;  // without cu_seqlens
  int64_t tokens;         // batch * seqlen
  uint8_t *data_t;        // [heads, head_dim, data_t_stride] E4M3
  int64_t data_t_stride;
  void *scales;  // [heads, num_chunks, head_dim]: fp32 scale_inv or E8M0 codes
  ScaleOptions opts;
  int workers;  // blocks that quantize items; block `workers` zeroes the unowned columns
};

/* Where a chunk's tokens are. */
struct ChunkSpan {
  int64_t src_offset;  // elements from the view's origin to the chunk's first token
  int64_t column;      // column of that token in data_t (its token index)
  int len;             // tokens in the chunk (the last chunk of a sequence may be short)
};

template <int kChunk>
__device__ ChunkSpan locate_chunk(const ChunkParams &p, int chunk) {
  if (p.cu_seqlens == nullptr) {
    const int sample = chunk / p.chunks_per_sample;
    const int first = (chunk - sample * p.chunks_per_sample) * kChunk;
    return {sample * p.stride_batch + first * p.stride_seq,
            static_cast<int64_t>(sample) * p.seqlen + first, min(kChunk, p.seqlen - first)};
  }
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
  const int first = __ldg(p.cu_seqlens + lo) + (chunk - __ldg(p.cu_chunks + lo)) * kChunk;
  const int end = __ldg(p.cu_seqlens + lo + 1);
  return {first * p.stride_seq, first, min(kChunk, end - first)};
}

/* Staged rows hold two channels per 32-bit word, row_words (a multiple of 32) words per token.
 * In the column phase the G = kChunk / 16 threads of one channel pair sit in adjacent lanes and
 * read rows 16 g + j at the same j; XOR-ing the word index with g * 32 / G sends the G rows to
 * distinct banks. The XOR keeps 4-word groups together, so 16-byte staging stores stay whole. */
template <int kChunk>
__device__ __forceinline__ int swizzle(int row) {
  constexpr int kGroups = kChunk / kTokensPerThread;
  return ((row / kTokensPerThread) % kGroups) * (32 / kGroups);
}

/* 16 bytes global -> shared without a register round trip; zero bytes are read (and 16 zeros
 * written) when `real` is false. */
__device__ __forceinline__ void copy_async_16(uint32_t *dst, const void *src, bool real) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
               "r"(real ? 16 : 0)
               : "memory");
}

/* Close the group of copies issued since the previous commit. */
__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Wait until at most the last committed group is in flight (this thread's copies only). */
__device__ __forceinline__ void wait_for_all_but_last_copies() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

/* Stage the chunk's token rows into `tile` ([kChunk, row_words] words, swizzled), zeros past the
 * chunk's end. Vectorized: asynchronous 16-byte copies. Otherwise element loads, synchronous. */
template <typename T, int kChunk, bool kVectorized>
__device__ void stage_chunk(const ChunkParams &p, int head, const ChunkSpan &span,
                            uint32_t *tile) {
  const T *src = static_cast<const T *>(p.v) + span.src_offset + head * p.stride_head;
  const int vecs = p.head_dim / kVecElems;
  const int total = kChunk * vecs;
  if constexpr (kVectorized) {
    for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
      const int row = idx / vecs;
      const int vec = idx - row * vecs;
      const bool real = row < span.len;
      const T *from = real ? src + row * p.stride_seq + vec * kVecElems : src;
      const int word = (vec * kVecElems / 2) ^ swizzle<kChunk>(row);
      copy_async_16(tile + row * p.row_words + word, from, real);
    }
  } else {
    for (int base = threadIdx.x; base < total; base += blockDim.x * kLoadsPerThread) {
      uint4 raw[kLoadsPerThread];
      int row[kLoadsPerThread];
      int vec[kLoadsPerThread];
#pragma unroll
      for (int k = 0; k < kLoadsPerThread; ++k) {
        const int idx = base + k * blockDim.x;
        row[k] = idx / vecs;
        vec[k] = idx - row[k] * vecs;
        raw[k] = make_uint4(0u, 0u, 0u, 0u);
        if (idx < total && row[k] < span.len) {
          raw[k] = load_vec8<T, false>(src + row[k] * p.stride_seq + vec[k] * kVecElems);
        }
      }
#pragma unroll
      for (int k = 0; k < kLoadsPerThread; ++k) {
        if (base + k * blockDim.x >= total) break;
        const int word = (vec[k] * kVecElems / 2) ^ swizzle<kChunk>(row[k]);
        *reinterpret_cast<uint4 *>(tile + row[k] * p.row_words + word) = raw[k];
      }
    }
  }
}

/* 16 E4M3 bytes of one channel -> data_t: one 16-byte store when the chunk's column is 16-aligned
 * and all 16 tokens are real, byte stores of the real tokens otherwise. */
__device__ void store_channel(const ChunkParams &p, int head, int channel, const ChunkSpan &span,
                              int group, const uint32_t *bytes) {
  const int valid = span.len - group * kTokensPerThread;
  if (valid <= 0) return;
  uint8_t *dst = p.data_t + (static_cast<int64_t>(head) * p.head_dim + channel) * p.data_t_stride +
                 span.column + group * kTokensPerThread;
  if (valid >= kTokensPerThread && span.column % 16 == 0) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(bytes[0], bytes[1], bytes[2], bytes[3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kTokensPerThread; ++j) {
    if (j < valid) dst[j] = static_cast<uint8_t>(bytes[j / 4] >> (8 * (j % 4)));
  }
}

/* Scale multipliers of two channels from their amaxes; group 0 writes their scales. */
template <ChunkRule kRule>
__device__ float2 chunk_multipliers(const ChunkParams &p, float amax_lo, float amax_hi,
                                    int64_t scale_index, bool writer) {
  if constexpr (kRule == ChunkRule::kCurrent) {
    const bool pow2 = p.opts.use_power_2_scales;
    const float lo = compute_scale_from_amax(amax_lo, pow2, p.opts.amax_epsilon);
    const float hi = compute_scale_from_amax(amax_hi, pow2, p.opts.amax_epsilon);
    if (writer) {
      *reinterpret_cast<float2 *>(static_cast<float *>(p.scales) + scale_index) =
          make_float2(scale_inverse(lo), scale_inverse(hi));
    }
    return make_float2(lo, hi);
  } else {
    const uint8_t code_lo = float_to_e8m0(amax_lo);
    const uint8_t code_hi = float_to_e8m0(amax_hi);
    if (writer) {
      *reinterpret_cast<uint16_t *>(static_cast<uint8_t *>(p.scales) + scale_index) =
          static_cast<uint16_t>(code_lo | (code_hi << 8));
    }
    return make_float2(e8m0_reciprocal(code_lo), e8m0_reciprocal(code_hi));
  }
}

/* Quantize one staged chunk. Thread (pair, group) reads the words `pair` (channels 2 pair and
 * 2 pair + 1) of tokens 16 group .. 16 group + 15 twice: once for the amax, once for the cast,
 * so that no 32 values stay live in registers. */
template <typename T, int kChunk, ChunkRule kRule>
__device__ void quantize_tile(const ChunkParams &p, int head, int chunk, const ChunkSpan &span,
                              const uint32_t *tile) {
  constexpr int kGroups = kChunk / kTokensPerThread;
  const int pairs = p.head_dim / 2;
  for (int item = threadIdx.x; item < pairs * kGroups; item += blockDim.x) {
    const int group = item % kGroups;
    const int pair = item / kGroups;
    const uint32_t *column = tile + group * kTokensPerThread * p.row_words +
                             (pair ^ swizzle<kChunk>(group * kTokensPerThread));
    float amax_lo = 0.0f;
    float amax_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < kTokensPerThread; ++j) {
      const float2 f = to_float2(column[j * p.row_words], T{});
      amax_lo = fmaxf(amax_lo, fabsf(f.x));
      amax_hi = fmaxf(amax_hi, fabsf(f.y));
    }
    // See Note [Mask-exact FP8 scaling]: amax over this chunk's tokens of one channel only.
    amax_lo = group_max(amax_lo, kGroups);
    amax_hi = group_max(amax_hi, kGroups);
    const int64_t scale_index =
        (static_cast<int64_t>(head) * p.num_chunks + chunk) * p.head_dim + 2 * pair;
    const float2 mult = chunk_multipliers<kRule>(p, amax_lo, amax_hi, scale_index, group == 0);
    uint32_t bytes_lo[4];
    uint32_t bytes_hi[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float lo[4];
      float hi[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = to_float2(column[(4 * q + j) * p.row_words], T{});
        lo[j] = f.x;
        hi[j] = f.y;
      }
      bytes_lo[q] = cast4_to_e4m3(lo, mult.x);
      bytes_hi[q] = cast4_to_e4m3(hi, mult.y);
    }
    store_channel(p, head, 2 * pair, span, group, bytes_lo);
    store_channel(p, head, 2 * pair + 1, span, group, bytes_hi);
  }
}

/* Columns of data_t that belong to no sequence (past the last token, up to the row stride). */
__device__ void zero_unowned_columns(const ChunkParams &p) {
  const int64_t end = p.cu_seqlens != nullptr ? __ldg(p.cu_seqlens + p.num_seqs) : p.tokens;
  const int64_t width = p.data_t_stride - end;
  const int64_t rows = static_cast<int64_t>(p.heads) * p.head_dim;
  for (int64_t k = threadIdx.x; k < width * rows; k += blockDim.x) {
    const int64_t row = k / width;
    p.data_t[row * p.data_t_stride + end + k - row * width] = 0;
  }
}

template <typename T, int kChunk, bool kVectorized>
__device__ void stage_item(const ChunkParams &p, int64_t item, uint32_t *tile) {
  const int head = static_cast<int>(item / p.num_chunks);
  const int chunk = static_cast<int>(item - static_cast<int64_t>(head) * p.num_chunks);
  stage_chunk<T, kChunk, kVectorized>(p, head, locate_chunk<kChunk>(p, chunk), tile);
}

template <typename T, int kChunk, ChunkRule kRule>
__device__ void quantize_item(const ChunkParams &p, int64_t item, const uint32_t *tile) {
  const int head = static_cast<int>(item / p.num_chunks);
  const int chunk = static_cast<int>(item - static_cast<int64_t>(head) * p.num_chunks);
  quantize_tile<T, kChunk, kRule>(p, head, chunk, locate_chunk<kChunk>(p, chunk), tile);
}

/* Grid: `workers` resident blocks, each taking items blockIdx.x, + workers, + 2 workers, ...
 * (item = head * num_chunks + chunk), plus one block that zeroes the unowned columns. Two tiles:
 * the next item is staged while the current one is quantized. */
template <typename T, int kChunk, ChunkRule kRule, bool kVectorized>
__global__ void __launch_bounds__(kMaxThreads) chunk_cast_transposed_kernel(const ChunkParams p) {
  extern __shared__ uint4 shared_vectors[];
  uint32_t *tiles = reinterpret_cast<uint32_t *>(shared_vectors);  // [kStages, kChunk, row_words]
  const int tile_words = kChunk * p.row_words;
  if (static_cast<int>(blockIdx.x) == p.workers) {
    zero_unowned_columns(p);
    return;
  }
  const int64_t items = static_cast<int64_t>(p.heads) * p.num_chunks;
  int64_t item = blockIdx.x;
  if (item < items) stage_item<T, kChunk, kVectorized>(p, item, tiles);
  if constexpr (kVectorized) commit_copies();
  for (int stage = 0; item < items; item += p.workers, stage ^= 1) {
    const int64_t next = item + p.workers;
    if (next < items) stage_item<T, kChunk, kVectorized>(p, next, tiles + (stage ^ 1) * tile_words);
    if constexpr (kVectorized) {
      commit_copies();  // the next tile's group (possibly empty)
      wait_for_all_but_last_copies();  // so the current tile's group is complete
    }
    __syncthreads();  // the current tile is staged by every thread
    quantize_item<T, kChunk, kRule>(p, item, tiles + stage * tile_words);
    __syncthreads();  // the current tile is read before it is staged again
  }
}

/* How many blocks of `kernel` the current device holds at once (SMs x blocks per SM), computed
 * once per (kernel, block size, shared memory, device): the launch path then makes no query. */
cudaError_t resident_blocks(const void *kernel, int threads, size_t shared_bytes, int *out) {
  static std::mutex mutex;
  static std::map<std::tuple<const void *, int, size_t, int>, int> cache;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const auto key = std::make_tuple(kernel, threads, shared_bytes, device);
  std::lock_guard<std::mutex> lock(mutex);
  const auto hit = cache.find(key);
  if (hit != cache.end()) {
    *out = hit->second;
    return cudaSuccess;
  }
  int sms = 0;
  int per_sm = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes);
  }
  if (err != cudaSuccess) return err;
  *out = cache[key] = sms * per_sm;
  return cudaSuccess;
}

template <typename T, int kChunk, ChunkRule kRule>
cudaError_t launch_typed(ChunkParams p, bool vectorized, cudaStream_t stream) {
  const size_t shared_bytes = sizeof(uint32_t) * kStages * kChunk * p.row_words;
  auto kernel = vectorized ? chunk_cast_transposed_kernel<T, kChunk, kRule, true>
                           : chunk_cast_transposed_kernel<T, kChunk, kRule, false>;
  cudaError_t err = cudaSuccess;
  if (shared_bytes > kDefaultSharedBytes) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared_bytes));
    if (err != cudaSuccess) return err;
  }
  // One thread per (channel pair, 16 tokens) in the column phase, whole warps.
  const int columns = p.head_dim / 2 * (kChunk / kTokensPerThread);
  const int threads = (std::clamp(columns, kMinThreads, kMaxThreads) + 31) / 32 * 32;
  int resident = 0;
  err = resident_blocks(reinterpret_cast<const void *>(kernel), threads, shared_bytes, &resident);
  if (err != cudaSuccess) return err;
  const int64_t items = static_cast<int64_t>(p.heads) * p.num_chunks;
  p.workers = static_cast<int>(std::min<int64_t>(items, std::max(1, resident)));
  kernel<<<p.workers + 1, threads, shared_bytes, stream>>>(p);
  return cudaGetLastError();
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
  const int words = static_cast<int>(v.head_dim / 2);
  const int multiple = kSharedWordsPerRowMultiple;
  const ChunkParams p{v.data,
                      v.stride_batch,
                      v.stride_seq,
                      v.stride_head,
                      static_cast<int>(v.seqlen),
                      static_cast<int>(v.heads),
                      static_cast<int>(v.head_dim),
                      (words + multiple - 1) / multiple * multiple,
                      chunks.cu_seqlens,
                      chunks.cu_chunks,
                      static_cast<int>(chunks.num_seqs),
                      static_cast<int>(chunks.num_chunks),
                      static_cast<int>((v.seqlen + chunks.chunk - 1) / chunks.chunk),
                      v.batch * v.seqlen,
                      data_t,
                      data_t_stride,
                      scales,
                      opts,
                      0};
  if (rule == ChunkRule::kCurrent) {
    return launch_rule<ChunkRule::kCurrent>(v, chunks.chunk, p, stream);
  }
  return launch_rule<ChunkRule::kMxfp8>(v, chunks.chunk, p, stream);
}

}  // namespace exact_fp8
}  // namespace transformer_engine
