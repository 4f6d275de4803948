/*
 * The sm90 mask-exact FP8 attention forward kernel (first step: no warp specialization).
 *
 * Grid: (query tiles, b * h), causal tiles longest first. Block: two warpgroups (256 threads),
 * 64 query rows each; thread 0 also issues the TMA loads. Per KV tile kt, boundary tiles first
 * (mainloop.h, KVTileRange), through a 2-stage ring:
 *   wait full[visit % 2] -> S = Q8 . K8^T (SS WGMMA, E4M3) -> scores in log2 units with the
 *   per-key K scale and the per-row Q scale -> online softmax (softmax.h) -> for an FP8 tile
 *   O = O * alpha * (u / s_kt) + P8 . V8 (a fresh RS WGMMA product, E4M3; P_SCALE in the
 *   exponent), for a boundary tile O = O * alpha * u, then O += P . V (RS WGMMA, bf16) -> all
 *   threads done: thread 0 reuses the stage for the tile two visits later.
 * Numerics: Note [Mask-exact FP8 scaling] and Note [V scale in the rescale] (exact_fp8/formats.py).
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_H_

#include <cfloat>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "epilogue.h"
#include "kernel_traits.h"
#include "mainloop.h"
#include "params.h"
#include "softmax.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

__global__ void __launch_bounds__(kThreads, 1)
    attention_fwd_kernel(CUTE_GRID_CONSTANT KernelParams const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Traits = KernelTraits;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  // SW128 tiles need 1024-byte aligned buffers: the launch adds 1024 bytes for this.
  extern __shared__ __align__(1024) char smem_raw[];
  char *smem = smem_raw + (1024 - reinterpret_cast<uintptr_t>(smem_raw) % 1024) % 1024;
  auto &ss = *reinterpret_cast<typename Traits::SharedStorage *>(smem);
  AttentionParams const &p = kp.p;

  const int thread = threadIdx.x;
  const int q_tile = p.causal ? p.num_q_tiles - 1 - blockIdx.x : blockIdx.x;
  const int batch = blockIdx.y / p.heads;
  const int head = blockIdx.y % p.heads;
  const int kv_head = head / (p.heads / p.heads_kv);
  const int q0 = q_tile * kQTile;
  const KVTileRange range = kv_tile_range(p, q_tile);

  if (thread == 0) {
    Barrier::init(&ss.bar_q, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) Barrier::init(&ss.bar_full[s], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  Producer producer{kp, ss, batch, kv_head, p.cu_vt[batch]};
  if (thread == 0) {
    producer.load_q(head, q_tile);
    for (int visit = 0; visit < min(kStages, range.num_tiles); ++visit) {
      producer.load_kv(visit, range.tile(visit), range.tile(visit) < range.num_fp8);
    }
  }

  typename Traits::MmaQK mma_qk;
  typename Traits::MmaPV8 mma_pv8;
  typename Traits::MmaPV16 mma_pv16;
  auto thr_qk = mma_qk.get_thread_slice(thread);
  auto thr_pv = mma_pv8.get_thread_slice(thread);

  Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutFp8{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kQTile>, Int<kKVTile>>{});
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kQTile>, Int<kKVTile>>{}));
  Tensor tOrO = partition_fragment_C(mma_pv8, Shape<Int<kQTile>, Int<kHeadDim>>{});
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kQTile>, Int<kHeadDim>>{}));
  Tensor tOrP8 = make_tensor<typename Traits::Fp8>(
      partition_shape_A(mma_pv8, Shape<Int<kQTile>, Int<kKVTile>>{}));
  Tensor tOrP16 = make_tensor<typename Traits::Bf16>(
      partition_shape_A(mma_pv16, Shape<Int<kQTile>, Int<kKVTile>>{}));
  static_assert(decltype(size(tSrS))::value == 64 && decltype(size(tOrO))::value == 64);
  clear(tOrO);

  // The per-row factor of the scores: q_scale * softmax_scale * log2(e) (0 for rows past s_q).
  const int64_t t_q = static_cast<int64_t>(p.batch) * p.seqlen_q;
  const int64_t t_kv = static_cast<int64_t>(p.batch) * p.seqlen_kv;
  float row_scale[2];
  int row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row[h] = q0 + get<0>(tScS(2 * h));
    row_scale[h] = row[h] < p.seqlen_q
                       ? p.q_scale[head * t_q + static_cast<int64_t>(batch) * p.seqlen_q + row[h]] *
                             p.scale_log2
                       : 0.0f;
  }
  const float *k_scale = p.k_scale + kv_head * t_kv + static_cast<int64_t>(batch) * p.seqlen_kv;
  const float *v_scale =
      p.v_scale + static_cast<int64_t>(kv_head) * p.num_chunks + p.cu_chunks[batch];

  OnlineSoftmax softmax;
  softmax.init();
  float u = 1.0f;  // the unit of tOrO: the V scale of the last FP8 tile (1: unquantized)

  Barrier::wait(&ss.bar_q, 0);
  for (int visit = 0; visit < range.num_tiles; ++visit) {
    const int kt = range.tile(visit);
    const int stage = visit % kStages;
    const bool fp8_v = kt < range.num_fp8;
    const float s_kt = fp8_v ? v_scale[kt] : 1.0f;
    Barrier::wait(&ss.bar_full[stage], (visit / kStages) & 1);
    scores_gemm(mma_qk, tSrQ, ss.k[stage], tSrS, thread);

    // Per-key K scales of this thread's 32 columns, read while the WGMMA runs.
    const int key0 = kt * kKVTile;
    float ks[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int key = key0 + get<1>(tScS((i & 1) + 4 * (i >> 1)));  // value c + 4 j
      ks[i] = key < p.seqlen_kv ? k_scale[key] : 0.0f;
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);

    // Scores in log2 units; the element-wise mask on boundary tiles only.
#pragma unroll
    for (int v = 0; v < 64; ++v) {
      const int h = (v >> 1) & 1;
      const float t = tSrS(v) * ks[(v & 1) + 2 * (v >> 2)];
      float s = t * row_scale[h];
      if (!fp8_v) {
        const int key = key0 + get<1>(tScS(v));
        const bool visible = key < p.seqlen_kv && (!p.causal || key <= row[h]);
        s = visible ? s : -INFINITY;
      }
      tSrS(v) = s;
    }
    float alpha[2];
    softmax.step(tSrS, alpha);

    // Note [V scale in the rescale]: acc <- acc * (alpha * (u / s_kt)) + P . V, u <- s_kt.
    const float ratio = fminf(u / s_kt, FLT_MAX);
    u = s_kt;
    const float factor[2] = {alpha[0] * ratio, alpha[1] * ratio};

    if (fp8_v) {
      // The FP8 tile's product is computed fresh, into the registers S no longer needs, and
      // added to the rescaled acc in fp32 (the FP8 MMA accumulates at reduced precision; the
      // Triton kernel does the same).
      p_to_fp8_operand(tSrS, tOrP8);
      pv_gemm<typename Traits::MmaPV8, typename Traits::SmemLayoutFp8>(
          mma_pv8, reinterpret_cast<typename Traits::Fp8 *>(ss.v[stage]), tOrP8, tSrS, thread,
          /*fresh=*/true);
#pragma unroll
      for (int v = 0; v < 64; ++v) tOrO(v) = tOrO(v) * factor[(v >> 1) & 1] + tSrS(v);
    } else {  // bf16 P . V accumulates in fp32 inside the MMA
#pragma unroll
      for (int v = 0; v < 64; ++v) tOrO(v) *= factor[(v >> 1) & 1];
      p_to_bf16_operand(tSrS, tOrP16);
      pv_gemm<typename Traits::MmaPV16, typename Traits::SmemLayoutV16>(
          mma_pv16, reinterpret_cast<typename Traits::Bf16 *>(ss.v[stage]), tOrP16, tOrO, thread,
          /*fresh=*/false);
    }
    __syncthreads();  // every warpgroup is done with the stage
    if (thread == 0 && visit + kStages < range.num_tiles) {
      const int next = range.tile(visit + kStages);
      producer.load_kv(visit + kStages, next, next < range.num_fp8);
    }
  }
  store_output(p, softmax, u, tOrO, tOcO, batch, head, q0);
#endif
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_H_
