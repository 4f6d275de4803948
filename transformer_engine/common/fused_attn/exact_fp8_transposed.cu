/*
 * Chunk kernels of the mask-exact FP8 quantizers: V, one scale per (head, chunk of tokens of one
 * sequence, channel), written transposed (token axis last) for the attention kernel's P.V.
 *
 * One block quantizes one (chunk, head): it stages the chunk's token rows in shared memory
 * (16-byte loads), then each thread takes two channels of 16 tokens, reduces the channel amax
 * with the threads holding the chunk's other tokens, and writes 16 E4M3 bytes per channel as one
 * 16-byte store into the transposed output. See Note [Mask-exact FP8 scaling]
 * (exact_fp8/formats.py): chunks start at each sequence's first token and never cross a sequence.
 */
#include "exact_fp8_kernels.h"
#include "exact_fp8_numerics.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

constexpr int kThreads = 256;
constexpr int kLoadsPerThread = 4;  // independent 16-byte loads in flight per thread
constexpr int kTokensPerThread = 16;  // tokens of one channel per thread: one 16-byte store
constexpr int kSharedWordsPerRowMultiple = 32;  // one row of banks
constexpr size_t kDefaultSharedBytes = 48 * 1024;

struct ChunkParams {
  const void *v;  // [batch, seqlen, heads, head_dim] view, element strides below
  int64_t stride_batch;
  int64_t stride_seq;
  int64_t stride_head;
  int seqlen;
  int head_dim;
  int row_words;                // 32-bit words per staged token row
  const int32_t *cu_seqlens;    // [num_seqs + 1] token offsets; null: one sequence per sample
  const int32_t *cu_chunks;     // [num_seqs + 1] chunk offsets (with cu_seqlens)
  int num_seqs;
  int num_chunks;
  int chunks_per_sample;        // without cu_seqlens
  int64_t tokens;               // batch * seqlen
  uint8_t *data_t;              // [heads, head_dim, data_t_stride] E4M3
  int64_t data_t_stride;
  void *scales;                 // [heads, num_chunks, head_dim]: fp32 scale_inv or E8M0 codes
  ScaleOptions opts;
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

template <typename T, int kChunk, bool kVectorized>
__device__ void stage_chunk(const ChunkParams &p, int head, const ChunkSpan &span,
                            uint32_t *staged) {
  const T *src = static_cast<const T *>(p.v) + span.src_offset + head * p.stride_head;
  const int vecs = p.head_dim / kVecElems;
  const int total = kChunk * vecs;
  for (int base = threadIdx.x; base < total; base += kThreads * kLoadsPerThread) {
    uint4 raw[kLoadsPerThread];
    int row[kLoadsPerThread];
    int vec[kLoadsPerThread];
#pragma unroll
    for (int k = 0; k < kLoadsPerThread; ++k) {
      const int idx = base + k * kThreads;
      row[k] = idx / vecs;
      vec[k] = idx - row[k] * vecs;
      raw[k] = make_uint4(0u, 0u, 0u, 0u);  // tokens past the chunk's end stage as zeros
      if (idx < total && row[k] < span.len) {
        raw[k] = load_vec8<T, kVectorized>(src + row[k] * p.stride_seq + vec[k] * kVecElems);
      }
    }
#pragma unroll
    for (int k = 0; k < kLoadsPerThread; ++k) {
      if (base + k * kThreads >= total) break;
      const int word = (vec[k] * kVecElems / 2) ^ swizzle<kChunk>(row[k]);
      *reinterpret_cast<uint4 *>(staged + row[k] * p.row_words + word) = raw[k];
    }
  }
}

/* 16 tokens of one channel (times `multiplier`) -> E4M3 bytes of data_t, one 16-byte store when
 * the chunk's column is 16-aligned and all 16 tokens are real, byte stores otherwise. */
__device__ void store_channel(const ChunkParams &p, int head, int channel, const ChunkSpan &span,
                              int group, const float *x, float multiplier) {
  const int valid = span.len - group * kTokensPerThread;
  if (valid <= 0) return;
  uint8_t *dst = p.data_t + (static_cast<int64_t>(head) * p.head_dim + channel) * p.data_t_stride +
                 span.column + group * kTokensPerThread;
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = cast4_to_e4m3(x + 4 * i, multiplier);
  if (valid >= kTokensPerThread && span.column % 16 == 0) {
    *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
#pragma unroll
  for (int j = 0; j < kTokensPerThread; ++j) {
    if (j < valid) dst[j] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
  }
}

template <typename T, int kChunk, ChunkRule kRule>
__device__ void quantize_staged_columns(const ChunkParams &p, int head, const ChunkSpan &span,
                                        const uint32_t *staged) {
  constexpr int kGroups = kChunk / kTokensPerThread;
  const int pairs = p.head_dim / 2;
  for (int item = threadIdx.x; item < pairs * kGroups; item += kThreads) {
    const int group = item % kGroups;
    const int pair = item / kGroups;
    const int word = pair ^ swizzle<kChunk>(group * kTokensPerThread);
    float lo[kTokensPerThread];  // channel 2 * pair
    float hi[kTokensPerThread];  // channel 2 * pair + 1
    float amax_lo = 0.0f;
    float amax_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < kTokensPerThread; ++j) {
      const float2 f = to_float2(staged[(group * kTokensPerThread + j) * p.row_words + word], T{});
      lo[j] = f.x;
      hi[j] = f.y;
      amax_lo = fmaxf(amax_lo, fabsf(f.x));
      amax_hi = fmaxf(amax_hi, fabsf(f.y));
    }
    // See Note [Mask-exact FP8 scaling]: amax over this chunk's tokens of one channel only.
    amax_lo = group_max(amax_lo, kGroups);
    amax_hi = group_max(amax_hi, kGroups);
    const int64_t scale_index =
        (static_cast<int64_t>(head) * p.num_chunks + blockIdx.x) * p.head_dim + 2 * pair;
    float mult_lo;
    float mult_hi;
    if constexpr (kRule == ChunkRule::kCurrent) {
      const bool pow2 = p.opts.use_power_2_scales;
      mult_lo = compute_scale_from_amax(amax_lo, pow2, p.opts.amax_epsilon);
      mult_hi = compute_scale_from_amax(amax_hi, pow2, p.opts.amax_epsilon);
      if (group == 0) {
        *reinterpret_cast<float2 *>(static_cast<float *>(p.scales) + scale_index) =
            make_float2(scale_inverse(mult_lo), scale_inverse(mult_hi));
      }
    } else {
      const uint8_t code_lo = float_to_e8m0(amax_lo);
      const uint8_t code_hi = float_to_e8m0(amax_hi);
      mult_lo = e8m0_reciprocal(code_lo);
      mult_hi = e8m0_reciprocal(code_hi);
      if (group == 0) {
        *reinterpret_cast<uint16_t *>(static_cast<uint8_t *>(p.scales) + scale_index) =
            static_cast<uint16_t>(code_lo | (code_hi << 8));
      }
    }
    store_channel(p, head, 2 * pair, span, group, lo, mult_lo);
    store_channel(p, head, 2 * pair + 1, span, group, hi, mult_hi);
  }
}

/* Columns of data_t that belong to no sequence (past the last token, up to the row stride). */
__device__ void zero_unowned_columns(const ChunkParams &p, int head) {
  const int64_t end = p.cu_seqlens != nullptr ? __ldg(p.cu_seqlens + p.num_seqs) : p.tokens;
  const int64_t width = p.data_t_stride - end;
  for (int64_t k = threadIdx.x; k < width * p.head_dim; k += kThreads) {
    const int64_t channel = k / width;
    p.data_t[(static_cast<int64_t>(head) * p.head_dim + channel) * p.data_t_stride + end + k -
             channel * width] = 0;
  }
}

/* Grid: x = chunk (the extra last block zeroes the unowned columns), y = head. */
template <typename T, int kChunk, ChunkRule kRule, bool kVectorized>
__global__ void __launch_bounds__(kThreads) chunk_cast_transposed_kernel(const ChunkParams p) {
  extern __shared__ uint4 shared_vectors[];
  uint32_t *staged = reinterpret_cast<uint32_t *>(shared_vectors);  // [kChunk, row_words]
  const int head = blockIdx.y;
  if (blockIdx.x == p.num_chunks) {
    zero_unowned_columns(p, head);
    return;
  }
  const ChunkSpan span = locate_chunk<kChunk>(p, blockIdx.x);
  stage_chunk<T, kChunk, kVectorized>(p, head, span, staged);
  __syncthreads();
  quantize_staged_columns<T, kChunk, kRule>(p, head, span, staged);
}

template <typename T, int kChunk, ChunkRule kRule>
cudaError_t launch_typed(const ChunkParams &p, bool vectorized, int64_t heads,
                         cudaStream_t stream) {
  const size_t shared_bytes = sizeof(uint32_t) * kChunk * p.row_words;
  auto kernel = vectorized ? chunk_cast_transposed_kernel<T, kChunk, kRule, true>
                           : chunk_cast_transposed_kernel<T, kChunk, kRule, false>;
  if (shared_bytes > kDefaultSharedBytes) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(p.num_chunks + 1, static_cast<unsigned>(heads));
  kernel<<<grid, kThreads, shared_bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, ChunkRule kRule>
cudaError_t launch_chunk_size(int chunk, const ChunkParams &p, bool vectorized, int64_t heads,
                              cudaStream_t stream) {
  if constexpr (kRule == ChunkRule::kMxfp8) {
    return launch_typed<T, kMxBlock, kRule>(p, vectorized, heads, stream);
  } else {
    switch (chunk) {
      case 16:
        return launch_typed<T, 16, kRule>(p, vectorized, heads, stream);
      case 32:
        return launch_typed<T, 32, kRule>(p, vectorized, heads, stream);
      case 64:
        return launch_typed<T, 64, kRule>(p, vectorized, heads, stream);
      default:
        return launch_typed<T, 128, kRule>(p, vectorized, heads, stream);
    }
  }
}

template <ChunkRule kRule>
cudaError_t launch_rule(const NVTEExactFP8TokenView &v, int chunk, const ChunkParams &p,
                        cudaStream_t stream) {
  const bool vectorized = is_vectorizable(v);
  if (v.dtype == NVTE_EXACT_FP8_BFLOAT16) {
    return launch_chunk_size<__nv_bfloat16, kRule>(chunk, p, vectorized, v.heads, stream);
  }
  return launch_chunk_size<__half, kRule>(chunk, p, vectorized, v.heads, stream);
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
                      opts};
  if (rule == ChunkRule::kCurrent) {
    return launch_rule<ChunkRule::kCurrent>(v, chunks.chunk, p, stream);
  }
  return launch_rule<ChunkRule::kMxfp8>(v, chunks.chunk, p, stream);
}

}  // namespace exact_fp8
}  // namespace transformer_engine
