/*
 * C API of the sm90 mask-exact FP8 attention backward (exact_fp8_attention_sm90.h): argument
 * checks, the TMA descriptors and the launches of backward_kernel.h (dK, dV and the dQ
 * accumulator) and of backward_dq_accum.h's store (dQ).
 */
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backward_dq_accum.h"
#include "backward_kernel.h"
#include "dynamic_smem.h"
#include "transformer_engine/exact_fp8_attention_sm90.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

extern thread_local std::string last_error;  // launcher.cu

namespace {

NVTEExactFP8Status fail(NVTEExactFP8Status status, const std::string &message) {
  last_error = std::string("nvte_exact_fp8_attention_sm90_bwd: ") + message;
  return status;
}

bool aligned16(const void *ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int round_up(int64_t x, int to) { return static_cast<int>((x + to - 1) / to * to); }

std::string check(const NVTEExactFP8AttentionSm90BwdArgs &a) {
  if (a.head_dim != kHeadDim) return "head_dim must be 128, got " + std::to_string(a.head_dim);
  if (a.batch < 1 || a.seqlen_q < 1 || a.seqlen_kv < 1 || a.heads < 1 || a.heads_kv < 1) {
    return "batch, seqlen_q, seqlen_kv, heads and heads_kv must be >= 1";
  }
  if (a.heads % a.heads_kv != 0) return "heads_kv must divide heads";
  if (a.causal != 0 && a.causal != 1) return "causal must be 0 or 1";
  if (a.dtype != NVTE_EXACT_FP8_BFLOAT16 && a.dtype != NVTE_EXACT_FP8_FLOAT16) {
    return "dtype must be NVTE_EXACT_FP8_BFLOAT16 or NVTE_EXACT_FP8_FLOAT16";
  }
  const int64_t limit = INT32_MAX;
  if (a.batch * a.seqlen_q * a.heads > limit / kHeadDim ||
      a.batch * a.seqlen_kv * a.heads > limit / kHeadDim ||
      a.heads > 65535 || a.batch > 65535) {
    return "b * s * h * d must stay below 2^31, h and b <= 65535";
  }
  if (!a.q8 || !a.q_dq || !a.k8 || !a.k_dq || !a.k_scale || !a.v || !a.d_out || !a.row_values ||
      !a.dq || !a.dk || !a.dv || !a.dq_accum || !a.dq_count) {
    return "a device pointer is null";
  }
  if (!aligned16(a.q8) || !aligned16(a.q_dq) || !aligned16(a.k8) || !aligned16(a.k_dq) ||
      !aligned16(a.k_scale) || !aligned16(a.v) || !aligned16(a.d_out) || !aligned16(a.row_values) ||
      !aligned16(a.dq) || !aligned16(a.dk) || !aligned16(a.dv) || !aligned16(a.dq_accum) ||
      !aligned16(a.dq_count)) {
    return "every array must be 16-byte aligned (TMA and bulk copies)";
  }
  for (const int64_t stride : {a.v_stride_batch, a.v_stride_seq, a.d_out_stride_batch,
                               a.d_out_stride_seq, a.dq_stride_batch, a.dq_stride_seq,
                               a.dkv_stride_batch, a.dkv_stride_seq}) {
    if (stride < 0 || stride % 8 != 0) {
      return "the strides of v, d_out, dq, dk and dv must be non-negative multiples of 8 (TMA)";
    }
  }
  return "";
}

using G = BackwardGmem;

/* A [heads, b * s, d] token-major operand as (s, d, head, sample). */
template <class T>
auto token_major(const void *ptr, int32_t b, int32_t s, int32_t heads) {
  const int64_t d = kHeadDim;
  return make_tensor(make_gmem_ptr(static_cast<T const *>(ptr)),
                     G::Shape4{s, int32_t(kHeadDim), heads, b},
                     G::Stride4{d, _1{}, int64_t(b) * s * d, int64_t(s) * d});
}

/* A [b, s, heads, d] operand (element strides stride_batch, stride_seq, d, 1; 0, 0: the
 * contiguous layout's) as (s, d, head, sample). */
template <class T>
auto sample_major(const void *ptr, int32_t b, int32_t s, int32_t heads, int64_t stride_batch,
                  int64_t stride_seq) {
  const int64_t d = kHeadDim;
  const int64_t seq = stride_seq ? stride_seq : int64_t(heads) * d;
  return make_tensor(make_gmem_ptr(static_cast<T const *>(ptr)),
                     G::Shape4{s, int32_t(kHeadDim), heads, b},
                     G::Stride4{seq, _1{}, d, stride_batch ? stride_batch : int64_t(s) * seq});
}

NVTEExactFP8Status launch(const NVTEExactFP8AttentionSm90BwdArgs &a, cudaStream_t stream) {
  using T = BackwardTraits;
  using Fp8 = T::Fp8;
  using Bf16 = T::Bf16;
  const int32_t b = static_cast<int32_t>(a.batch), h = static_cast<int32_t>(a.heads);
  const int32_t h_kv = static_cast<int32_t>(a.heads_kv);
  const int32_t s_q = static_cast<int32_t>(a.seqlen_q), s_kv = static_cast<int32_t>(a.seqlen_kv);

  BackwardParams p{};
  p.row_values = a.row_values;
  p.k_scale = a.k_scale;
  p.dq = a.dq;
  p.dk = a.dk;
  p.dv = a.dv;
  p.dq_stride_seq = a.dq_stride_seq ? a.dq_stride_seq : int64_t(h) * kHeadDim;
  p.dq_stride_batch = a.dq_stride_batch ? a.dq_stride_batch : int64_t(s_q) * p.dq_stride_seq;
  p.dkv_stride_seq = a.dkv_stride_seq ? a.dkv_stride_seq : int64_t(h_kv) * kHeadDim;
  p.dkv_stride_batch = a.dkv_stride_batch ? a.dkv_stride_batch : int64_t(s_kv) * p.dkv_stride_seq;
  p.batch = b;
  p.seqlen_q = s_q;
  p.seqlen_kv = s_kv;
  p.heads = h;
  p.heads_kv = h_kv;
  p.rows_pad = round_up(s_q, kBwdTile);
  p.keys_pad = round_up(s_kv, kBwdTile);
  p.causal = a.causal != 0;
  p.dq_accum = a.dq_accum;
  p.dq_count = a.dq_count;
  p.row_blocks = (s_q + kBwdStep - 1) / kBwdStep;
  p.softmax_scale = a.softmax_scale;

  auto q8 = token_major<Fp8>(a.q8, b, s_q, h);
  auto q_dq = token_major<Bf16>(a.q_dq, b, s_q, h);
  auto k8 = token_major<Fp8>(a.k8, b, s_kv, h_kv);
  auto k_dq = token_major<Bf16>(a.k_dq, b, s_kv, h_kv);
  auto v = sample_major<Bf16>(a.v, b, s_kv, h_kv, a.v_stride_batch, a.v_stride_seq);
  auto d_out = sample_major<Bf16>(a.d_out, b, s_q, h, a.d_out_stride_batch, a.d_out_stride_seq);
  const G::Shape4 q_shape{s_q, int32_t(kHeadDim), h, b};
  const G::Shape4 kv_shape{s_kv, int32_t(kHeadDim), h_kv, b};

  BackwardKernelParams kp{};
  kp.p = p;
  kp.q_shape = q_shape;
  kp.kv_shape = kv_shape;
  kp.tma_k8 = make_tma_copy(SM90_TMA_LOAD{}, k8, T::SmemFp8Tile{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, T::Smem16Tile{});
  kp.tma_k_dq = make_tma_copy(SM90_TMA_LOAD{}, k_dq, T::Smem16Tile{});
  kp.tma_q8 = make_tma_copy(SM90_TMA_LOAD{}, q8, T::SmemFp8Step{});
  kp.tma_q_dq = make_tma_copy(SM90_TMA_LOAD{}, q_dq, T::Smem16Step{});
  kp.tma_d_out = make_tma_copy(SM90_TMA_LOAD{}, d_out, T::Smem16Step{});

  const int smem = static_cast<int>(sizeof(T::SharedStorage)) + 1024;
  // The kernels of the input dtype (bf16 or fp16; check()).
  const bool fp16 = a.dtype == NVTE_EXACT_FP8_FLOAT16;
  auto kernel = fp16 ? attention_bwd_kernel<T::Fp16> : attention_bwd_kernel<Bf16>;
  auto store_dq =
      fp16 ? attention_bwd_dq_store_kernel<T::Fp16> : attention_bwd_dq_store_kernel<Bf16>;
  cudaError_t err = fp16 ? allow_dynamic_smem<SmemSlot::kBackwardFp16>(kernel, smem)
                         : allow_dynamic_smem<SmemSlot::kBackward>(kernel, smem);
  if (err == cudaSuccess) {
    err = cudaMemsetAsync(a.dq_count, 0, sizeof(int32_t) * int64_t(h) * b * p.row_blocks, stream);
  }
  if (err != cudaSuccess) return fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(err));
  const dim3 grid((s_kv + kBwdTile - 1) / kBwdTile, h_kv, b);
  kernel<<<grid, kBwdThreads, smem, stream>>>(kp);
  err = cudaGetLastError();
  if (err != cudaSuccess) return fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(err));
  const dim3 grid_dq(p.row_blocks, h, b);
  store_dq<<<grid_dq, kBwdMmaThreads, 0, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return fail(NVTE_EXACT_FP8_CUDA_ERROR, cudaGetErrorString(err));
  return NVTE_EXACT_FP8_SUCCESS;
}

}  // namespace
}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

extern "C" {

NVTEExactFP8Status nvte_exact_fp8_attention_sm90_bwd(const NVTEExactFP8AttentionSm90BwdArgs *args,
                                                     cudaStream_t stream) {
  namespace s = transformer_engine::exact_fp8::sm90;
  if (args == nullptr) return s::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, "args is null");
  const std::string problem = s::check(*args);
  if (!problem.empty()) return s::fail(NVTE_EXACT_FP8_INVALID_ARGUMENT, problem);
  try {
    return s::launch(*args, stream);
  } catch (const std::exception &e) {  // none expected; never across the C boundary
    return s::fail(NVTE_EXACT_FP8_CUDA_ERROR, e.what());
  }
}

}  // extern "C"
