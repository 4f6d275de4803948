/*
 * The dQ kernel of the sm90 mask-exact FP8 attention backward (backward_traits.h has the
 * tiles and the products; backward_common.h the numerics).
 *
 * Grid: (b * h, query tiles), causal tiles longest first as in the forward. Block: two
 * warpgroups; warpgroup w owns rows 64 w .. 64 w + 63 of the tile. Q8 and dO are loaded once;
 * the steps walk the 64-key blocks the tile's rows see in order, through a kBwdStages ring that
 * thread 0 refills kBwdStages - 1 steps ahead. dQ is summed in that fixed order (deterministic) and
 * written once, times softmax_scale.
 *
 * Mask-exactness (DESIGN.md section 2): keys past s_kv arrive as 0 (TMA bounds) and get
 * P = dS = 0 by a select, as do keys the causal mask hides; rows past s_q have LSE2 = +inf and
 * D = 0 and are never written.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DQ_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DQ_H_

#include <cute/tensor.hpp>

#include "backward_common.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// Thread 0: key block `step`'s K8, V, K_dq and K scales into its stage.
CUTLASS_DEVICE void dq_load_step(DqKernelParams const &kp, BackwardTraits::DqStorage &ss, int step,
                                 int kv_head, int batch) {
  using T = BackwardTraits;
  BackwardParams const &p = kp.p;
  const int stage = step % kBwdStages;
  uint64_t &bar = ss.bar_full[stage];
  BwdBarrier::arrive_and_expect_tx(&bar, T::kFp8StepBytes + 2 * T::kBf16StepBytes + kBwdStep * 4);
  load_tile<kBwdStep, T::SmemFp8Step>(kp.tma_k8, kp.kv_shape, ss.k8[stage], bar, kv_head, batch,
                                      step);
  load_tile<kBwdStep, T::SmemBf16Step>(kp.tma_v, kp.kv_shape, ss.v[stage], bar, kv_head, batch,
                                       step);
  load_tile<kBwdStep, T::SmemBf16Step>(kp.tma_k_dq, kp.kv_shape, ss.k_dq[stage], bar, kv_head,
                                       batch, step);
  const float *k_scale =
      p.k_scale + (static_cast<int64_t>(kv_head) * p.batch + batch) * p.keys_pad + step * kBwdStep;
  load_bulk(k_scale, ss.k_scale[stage], kBwdStep * 4, bar);
}

// Values of the thread's two rows (accumulator rows lane / 4 + 8 h of its warp).
struct DqRows {
  int row[2];
  float row_scale[2], lse2[2], delta[2];
};

// One step of the warpgroup's rows against 64 keys: S, dP, then dQ += dS . K_dq. kMasked: the
// causal diagonal or the end of the keys crosses the step (a select per element).
template <bool kMasked, class FragA8, class FragA16, class Frag, class FragOp, class FragAcc,
          class Coord>
CUTLASS_DEVICE void dq_step(BackwardParams const &p, BackwardTraits::DqStorage &ss, int stage,
                            int n0, DqRows const &rows, int mma_thread, FragA8 const &tSrQ,
                            FragA16 const &tdPrdO, Frag &tSrS, Frag &tdPrdP, FragOp &tdQrdS,
                            FragAcc &tdQrdQ, Coord const &tScS) {
  using T = BackwardTraits;
  typename T::MmaScores mma_s;
  typename T::MmaDp mma_dp;
  typename T::MmaGrad mma_g;
  Tensor tSrK =
      mma_s.get_thread_slice(mma_thread)
          .partition_fragment_B(make_tensor(make_smem_ptr(ss.k8[stage]), T::SmemFp8Step{}));
  Tensor tdPrV =
      mma_dp.get_thread_slice(mma_thread)
          .partition_fragment_B(make_tensor(make_smem_ptr(ss.v[stage]), T::SmemBf16Step{}));
  Tensor tdQrKt =
      mma_g.get_thread_slice(mma_thread)
          .partition_fragment_B(make_tensor(make_smem_ptr(ss.k_dq[stage]), T::SmemBf16StepT{}));

  issue_gemm<true, false>(mma_s, tSrQ, tSrK, tSrS);
  issue_gemm<true, false>(mma_dp, tdPrdO, tdPrV, tdPrdP);
  float const *k_scale = ss.k_scale[stage];
  auto visible = [&](int h, int col) {
    const int key = n0 + col;
    return key < p.seqlen_kv && (!p.causal || key <= rows.row[h]);
  };
  warpgroup_wait<1>();  // S is ready
  warpgroup_fence_operand(tSrS);
#pragma unroll
  for (int v = 0; v < size(tSrS); v += 2) {
    const int h = (v >> 1) & 1;
    const int col = get<1>(tScS(v));  // the key of the step (keys col, col + 1)
    const float2 ks = *reinterpret_cast<float2 const *>(k_scale + col);
    float p0 = probability(tSrS(v) * ks.x, rows.row_scale[h], rows.lse2[h]);
    float p1 = probability(tSrS(v + 1) * ks.y, rows.row_scale[h], rows.lse2[h]);
    if constexpr (kMasked) {
      p0 = visible(h, col) ? p0 : 0.0f;
      p1 = visible(h, col + 1) ? p1 : 0.0f;
    }
    tSrS(v) = p0;
    tSrS(v + 1) = p1;
  }
  warpgroup_wait<0>();  // dP is ready
  warpgroup_fence_operand(tdPrdP);
#pragma unroll
  for (int v = 0; v < size(tdPrdP); v += 2) {
    const int h = (v >> 1) & 1;
    const int col = get<1>(tScS(v));
    float ds0 = tSrS(v) * (tdPrdP(v) - rows.delta[h]);
    float ds1 = tSrS(v + 1) * (tdPrdP(v + 1) - rows.delta[h]);
    if constexpr (kMasked) {
      ds0 = visible(h, col) ? ds0 : 0.0f;
      ds1 = visible(h, col + 1) ? ds1 : 0.0f;
    }
    tdPrdP(v) = ds0;
    tdPrdP(v + 1) = ds1;
  }
  to_bf16_operand(tdPrdP, tdQrdS);
  issue_gemm<false, true>(mma_g, tdQrdS, tdQrKt, tdQrdQ);
  warpgroup_wait<0>();
  warpgroup_fence_operand(tdQrdQ);
}

__global__ void __launch_bounds__(kBwdThreads, 1)
    attention_bwd_dq_kernel(CUTE_GRID_CONSTANT DqKernelParams const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = BackwardTraits;
  extern __shared__ __align__(1024) char smem_raw[];
  char *smem = smem_raw + (1024 - reinterpret_cast<uintptr_t>(smem_raw) % 1024) % 1024;
  auto &ss = *reinterpret_cast<typename T::DqStorage *>(smem);
  BackwardParams const &p = kp.p;
  const int num_q_tiles = (p.seqlen_q + kBwdTile - 1) / kBwdTile;
  const int q_tile = p.causal ? num_q_tiles - 1 - blockIdx.y : blockIdx.y;
  const int batch = blockIdx.x / p.heads, head = blockIdx.x % p.heads;
  const int kv_head = head / (p.heads / p.heads_kv);
  const int m0 = q_tile * kBwdTile;
  const int last_row = min(m0 + kBwdTile, p.seqlen_q) - 1;
  const int kv_end = p.causal ? min(last_row + 1, p.seqlen_kv) : p.seqlen_kv;
  const int num_steps = kv_end > 0 ? (kv_end + kBwdStep - 1) / kBwdStep : 0;

  if (threadIdx.x == 0) {
    BwdBarrier::init(&ss.bar_q, 1);
#pragma unroll
    for (int s = 0; s < kBwdStages; ++s) BwdBarrier::init(&ss.bar_full[s], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    BwdBarrier::arrive_and_expect_tx(&ss.bar_q, T::kFp8TileBytes + T::kBf16TileBytes);
    load_tile<kBwdTile, T::SmemFp8Tile>(kp.tma_q8, kp.q_shape, ss.q8, ss.bar_q, head, batch,
                                        q_tile);
    load_tile<kBwdTile, T::SmemBf16Tile>(kp.tma_d_out, kp.q_shape, ss.d_out, ss.bar_q, head, batch,
                                         q_tile);
    for (int step = 0; step < min(num_steps, kBwdStages - 1); ++step) {
      dq_load_step(kp, ss, step, kv_head, batch);
    }
  }

  const int mma_thread = threadIdx.x;
  const int wg_row0 = m0 + (mma_thread / 128) * 64;  // the warpgroup's first row
  typename T::MmaScores mma_s;
  typename T::MmaDp mma_dp;
  typename T::MmaGrad mma_g;
  Tensor tSrQ = mma_s.get_thread_slice(mma_thread)
                    .partition_fragment_A(make_tensor(make_smem_ptr(ss.q8), T::SmemFp8Tile{}));
  Tensor tdPrdO =
      mma_dp.get_thread_slice(mma_thread)
          .partition_fragment_A(make_tensor(make_smem_ptr(ss.d_out), T::SmemBf16Tile{}));
  // [128 rows, 64 keys] fp32 accumulators (32 values a thread): S, then P; dP, then dS
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBwdTile>, Int<kBwdStep>>{});
  Tensor tdPrdP = partition_fragment_C(mma_dp, Shape<Int<kBwdTile>, Int<kBwdStep>>{});
  Tensor tScS = mma_s.get_thread_slice(mma_thread)
                    .partition_C(make_identity_tensor(Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
  Tensor tdQrdQ = partition_fragment_C(mma_g, Shape<Int<kBwdTile>, Int<kHeadDim>>{});
  Tensor tdQcdQ = mma_g.get_thread_slice(mma_thread)
                      .partition_C(make_identity_tensor(Shape<Int<kBwdTile>, Int<kHeadDim>>{}));
  Tensor tdQrdS = make_tensor<typename T::Bf16>(
      partition_shape_A(mma_g, Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
  clear(tdQrdQ);

  DqRows rows;
  const int64_t plane = static_cast<int64_t>(p.heads) * p.batch * p.rows_pad;
  const float *values = p.row_values + (static_cast<int64_t>(head) * p.batch + batch) * p.rows_pad;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rows.row[h] = m0 + get<0>(tScS(2 * h));  // < rows_pad: padded values past s_q
    rows.row_scale[h] = values[rows.row[h]];
    rows.lse2[h] = values[plane + rows.row[h]];
    rows.delta[h] = values[2 * plane + rows.row[h]];
  }

  BwdBarrier::wait(&ss.bar_q, 0);
  for (int step = 0; step < num_steps; ++step) {
    const int stage = step % kBwdStages;
    if (threadIdx.x == 0 && step + kBwdStages - 1 < num_steps) {  // into the stage freed last
      dq_load_step(kp, ss, step + kBwdStages - 1, kv_head, batch);
    }
    BwdBarrier::wait(&ss.bar_full[stage], (step / kBwdStages) & 1);
    const int n0 = step * kBwdStep;
    // causal: some row of the warpgroup sees a key of the step iff n0 <= wg_row0 + 63
    const bool seen = !p.causal || n0 <= wg_row0 + 63;
    const bool masked = (p.causal && n0 + kBwdStep - 1 > wg_row0) || n0 + kBwdStep > p.seqlen_kv;
    if (seen) {
      if (masked) {
        dq_step<true>(p, ss, stage, n0, rows, mma_thread, tSrQ, tdPrdO, tSrS, tdPrdP, tdQrdS,
                      tdQrdQ, tScS);
      } else {
        dq_step<false>(p, ss, stage, n0, rows, mma_thread, tSrQ, tdPrdO, tSrS, tdPrdP, tdQrdS,
                       tdQrdQ, tScS);
      }
    }
    __syncthreads();  // every thread is done with the stage: thread 0 may refill it
  }

  // dQ * softmax_scale of the tile's real rows ([b, s_q, h, d]).
  const int64_t row_stride = p.dq_stride_seq;
  const int64_t base = batch * p.dq_stride_batch + static_cast<int64_t>(head) * kHeadDim;
  store_rows(tdQrdQ, tdQcdQ, p.softmax_scale, static_cast<__nv_bfloat16 *>(p.dq) + base, row_stride,
             m0, p.seqlen_q);
#endif
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DQ_H_
