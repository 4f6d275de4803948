/*
 * Row kernels of the mask-exact FP8 quantizers: Q and K, one scale per (token, head) row or per
 * 32 channels of it. One pass: each row is read once (16-byte vectors), its amax reduced across
 * the lanes that hold it, and its E4M3 bytes written head-major. See Note [Mask-exact FP8
 * scaling] (exact_fp8/formats.py).
 */
#include <algorithm>
#include <numeric>

#include "exact_fp8_kernels.h"
#include "exact_fp8_numerics.cuh"

namespace transformer_engine {
namespace exact_fp8 {
namespace {

constexpr int kRowsPerThread = 4;  // independent 16-byte loads in flight per thread
constexpr int kThreadsPerBlock = 256;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr int64_t kMaxGridY = 65535;  // the grid's head axis

struct RowwiseParams {
  const void *x;  // [batch, seqlen, heads, head_dim] view, element strides below
  int64_t stride_batch;
  int64_t stride_seq;
  int64_t stride_head;
  int seqlen;
  int64_t tokens;  // batch * seqlen
  int head_dim;
  uint8_t *data;  // [heads, tokens, head_dim] E4M3
  void *scales;   // kPerToken: fp32 [heads, tokens]; kMxfp8: E8M0 [heads, tokens, head_dim / 32]
  ScaleOptions opts;
};

__device__ __forceinline__ void store_vec8_e4m3(uint8_t *dst, const float *x, float multiplier) {
  *reinterpret_cast<uint2 *>(dst) =
      make_uint2(cast4_to_e4m3(x, multiplier), cast4_to_e4m3(x + 4, multiplier));
}

/* One launch casts one tensor, or two of the same dtype, head_dim and batch (attention's Q and
 * K): blockIdx.y < heads0 is a head of part[0], the rest of part[1]. */
struct RowwisePair {
  RowwiseParams part[2];
  int heads0;  // heads of part[0]; part[1] is never read when it has no head
};

/* Block: blockDim.x = head_dim / 8 lanes hold one (token, head) row, one 16-byte vector each;
 * blockDim.y rows; a thread handles kRowsPerThread tokens. Grid: (tokens of the longer
 * sequence, heads of both parts, sample), so no index needs a division. */
template <typename T, RowRule kRule, bool kVectorized>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    rowwise_cast_kernel(const __grid_constant__ RowwisePair pair) {
  const bool second = static_cast<int>(blockIdx.y) >= pair.heads0;
  const RowwiseParams &p = pair.part[second];  // read in place from the parameter space
  const int lane = threadIdx.x;
  const int head = blockIdx.y - (second ? pair.heads0 : 0);
  const int64_t sample = blockIdx.z;
  if (blockIdx.x * kRowsPerThread * blockDim.y >= p.seqlen) return;  // the shorter part's tail
  const T *src = static_cast<const T *>(p.x) + sample * p.stride_batch + head * p.stride_head +
                 lane * kVecElems;
  const int first = blockIdx.x * kRowsPerThread * blockDim.y + threadIdx.y;

  uint4 raw[kRowsPerThread];
#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int s = first + k * blockDim.y;
    raw[k] = make_uint4(0u, 0u, 0u, 0u);
    if (s < p.seqlen) raw[k] = load_vec8<T, kVectorized>(src + s * p.stride_seq);
  }

#pragma unroll
  for (int k = 0; k < kRowsPerThread; ++k) {
    const int s = first + k * blockDim.y;
    float x[kVecElems];
    unpack_vec8<T>(raw[k], x);
    const int64_t row = head * p.tokens + sample * p.seqlen + s;  // (head, token) of the outputs
    uint8_t *dst = p.data + row * p.head_dim + lane * kVecElems;
    if constexpr (kRule == RowRule::kPerToken) {
      // See Note [Mask-exact FP8 scaling]: amax over the d channels of this token and head only.
      const float amax = group_max(abs_max8(x, 0.0f), blockDim.x);
      const float scale =
          compute_scale_from_amax(amax, p.opts.use_power_2_scales, p.opts.amax_epsilon);
      if (s >= p.seqlen) continue;
      store_vec8_e4m3(dst, x, scale);
      if (lane == 0) static_cast<float *>(p.scales)[row] = scale_inverse(scale);
    } else {
      // See Note [Mask-exact FP8 scaling]: amax over 32 channels of this token and head only.
      constexpr int kLanesPerBlock = kMxBlock / kVecElems;
      const uint8_t code = float_to_e8m0(group_max(abs_max8(x, 0.0f), kLanesPerBlock));
      if (s >= p.seqlen) continue;
      store_vec8_e4m3(dst, x, e8m0_reciprocal(code));
      if (lane % kLanesPerBlock == 0) {
        static_cast<uint8_t *>(p.scales)[row * (p.head_dim / kMxBlock) + lane / kLanesPerBlock] =
            code;
      }
    }
  }
}

/* Rows per block: about kThreadsPerBlock threads, and whole warps (the lane groups that reduce
 * one amax never straddle a warp: a group's width divides both the row's lanes and 32). */
int rows_per_block(int lanes) {
  const int multiple = 32 / std::gcd(lanes, 32);
  const int rows = std::max(1, kThreadsPerBlock / lanes);
  return (rows + multiple - 1) / multiple * multiple;
}

template <typename T, RowRule kRule>
cudaError_t launch_typed(const RowwisePair &pair, int64_t seqlen, bool vectorized, int64_t batch,
                         int64_t heads, cudaStream_t stream) {
  const int lanes = pair.part[0].head_dim / kVecElems;
  const dim3 block(lanes, rows_per_block(lanes));
  const int tokens_per_block = block.y * kRowsPerThread;
  const dim3 grid((seqlen + tokens_per_block - 1) / tokens_per_block,
                  static_cast<unsigned>(heads), static_cast<unsigned>(batch));
  if (vectorized) {
    rowwise_cast_kernel<T, kRule, true><<<grid, block, 0, stream>>>(pair);
  } else {
    rowwise_cast_kernel<T, kRule, false><<<grid, block, 0, stream>>>(pair);
  }
  return cudaGetLastError();
}

RowwiseParams rowwise_params(const NVTEExactFP8TokenView &x, ScaleOptions opts, uint8_t *data,
                             void *scales) {
  return RowwiseParams{x.data,
                       x.stride_batch,
                       x.stride_seq,
                       x.stride_head,
                       static_cast<int>(x.seqlen),
                       x.batch * x.seqlen,
                       static_cast<int>(x.head_dim),
                       data,
                       scales,
                       opts};
}

/* One launch for the pair (the views' dtype, head_dim and batch alike: the callers check). */
cudaError_t launch_pair(RowRule rule, const RowwisePair &pair, NVTEExactFP8DType dtype,
                        int64_t seqlen, bool vectorized, int64_t batch, int64_t heads,
                        cudaStream_t stream) {
  const bool bf16 = dtype == NVTE_EXACT_FP8_BFLOAT16;
  if (rule == RowRule::kPerToken) {
    return bf16 ? launch_typed<__nv_bfloat16, RowRule::kPerToken>(pair, seqlen, vectorized, batch,
                                                                  heads, stream)
                : launch_typed<__half, RowRule::kPerToken>(pair, seqlen, vectorized, batch, heads,
                                                           stream);
  }
  return bf16 ? launch_typed<__nv_bfloat16, RowRule::kMxfp8>(pair, seqlen, vectorized, batch,
                                                             heads, stream)
              : launch_typed<__half, RowRule::kMxfp8>(pair, seqlen, vectorized, batch, heads,
                                                      stream);
}

}  // namespace

cudaError_t launch_rowwise_cast(RowRule rule, const NVTEExactFP8TokenView &x, ScaleOptions opts,
                                uint8_t *data, void *scales, cudaStream_t stream) {
  if (x.batch == 0 || x.seqlen == 0) return cudaSuccess;
  const RowwiseParams p = rowwise_params(x, opts, data, scales);
  const RowwisePair pair{{p, p}, static_cast<int>(x.heads)};
  return launch_pair(rule, pair, x.dtype, x.seqlen, is_vectorizable(x), x.batch, x.heads, stream);
}

cudaError_t launch_per_token_cast_pair(const NVTEExactFP8TokenView &a, uint8_t *data_a,
                                       float *scale_inv_a, const NVTEExactFP8TokenView &b,
                                       uint8_t *data_b, float *scale_inv_b, ScaleOptions opts,
                                       cudaStream_t stream) {
  if (a.batch == 0 || (a.seqlen == 0 && b.seqlen == 0)) return cudaSuccess;
  if (a.seqlen == 0) return launch_rowwise_cast(RowRule::kPerToken, b, opts, data_b, scale_inv_b,
                                                stream);
  if (b.seqlen == 0) return launch_rowwise_cast(RowRule::kPerToken, a, opts, data_a, scale_inv_a,
                                                stream);
  if (a.heads + b.heads > kMaxGridY) {  // one grid cannot hold both parts' heads
    const cudaError_t err = launch_rowwise_cast(RowRule::kPerToken, a, opts, data_a, scale_inv_a,
                                                stream);
    if (err != cudaSuccess) return err;
    return launch_rowwise_cast(RowRule::kPerToken, b, opts, data_b, scale_inv_b, stream);
  }
  const RowwisePair pair{
      {rowwise_params(a, opts, data_a, scale_inv_a), rowwise_params(b, opts, data_b, scale_inv_b)},
      static_cast<int>(a.heads)};
  const int64_t seqlen = a.seqlen > b.seqlen ? a.seqlen : b.seqlen;
  return launch_pair(RowRule::kPerToken, pair, a.dtype, seqlen,
                     is_vectorizable(a) && is_vectorizable(b), a.batch, a.heads + b.heads, stream);
}

}  // namespace exact_fp8
}  // namespace transformer_engine
