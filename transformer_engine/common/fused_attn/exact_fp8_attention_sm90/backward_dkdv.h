/*
 * The dK/dV kernel of the sm90 mask-exact FP8 attention backward (backward_traits.h has the
 * tiles and the products; backward_common.h the numerics).
 *
 * Grid: (key tiles, h_kv, b): the first key tiles, which the most query rows see under a causal
 * mask, start first. Block: two warpgroups; warpgroup w owns keys 64 w .. 64 w + 63 of the
 * tile. K8 and V are loaded once; the steps walk (query head of the kv-head's group, 64-row
 * block) head-major over the row blocks that see the tile, through a kBwdStages ring that thread
 * 0 refills kBwdStages - 1 steps ahead. dK and dV are summed in that fixed order (deterministic)
 * and written once, dK times softmax_scale.
 *
 * Mask-exactness (DESIGN.md section 2): rows past s_q arrive as 0 (TMA bounds) with LSE2 = +inf
 * and D = 0, so their P and dS are 0; under the causal mask an element (key j, row i) with
 * j > i gets P = dS = 0 by a select; keys past s_kv are computed and never written.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DKDV_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DKDV_H_

#include <cute/tensor.hpp>

#include "backward_common.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// The row blocks of a dK/dV CTA: steps (g, m) for g < group, m_begin <= m < m_begin + num_m.
struct DkdvSteps {
  int m_begin;
  int num_m;
  int group;

  CUTLASS_DEVICE DkdvSteps(BackwardParams const &p, int key_tile) {
    const int num_row_blocks = (p.seqlen_q + kBwdStep - 1) / kBwdStep;
    // causal: rows i >= the tile's first key see it; n0 is a multiple of kBwdStep
    m_begin = p.causal ? key_tile * kBwdTile / kBwdStep : 0;
    num_m = max(num_row_blocks - m_begin, 0);
    group = p.heads / p.heads_kv;
  }
  CUTLASS_DEVICE int count() const { return group * num_m; }
  CUTLASS_DEVICE int head_in_group(int step) const { return step / num_m; }
  CUTLASS_DEVICE int row_block(int step) const { return m_begin + step % num_m; }
};

// Thread 0: the step's Q8, Q_dq, dO and row values into `stage`.
CUTLASS_DEVICE void dkdv_load_step(DkdvKernelParams const &kp, BackwardTraits::DkdvStorage &ss,
                                   DkdvSteps const &steps, int step, int kv_head, int batch) {
  using T = BackwardTraits;
  BackwardParams const &p = kp.p;
  const int stage = step % kBwdStages;
  const int head = kv_head * steps.group + steps.head_in_group(step);
  const int m = steps.row_block(step);
  uint64_t &bar = ss.bar_full[stage];
  BwdBarrier::arrive_and_expect_tx(
      &bar, T::kFp8StepBytes + 2 * T::kBf16StepBytes + kRowValues * kBwdStep * 4);
  load_tile<kBwdStep, T::SmemFp8Step>(kp.tma_q8, kp.q_shape, ss.q8[stage], bar, head, batch, m);
  load_tile<kBwdStep, T::SmemBf16Step>(kp.tma_q_dq, kp.q_shape, ss.q_dq[stage], bar, head, batch,
                                       m);
  load_tile<kBwdStep, T::SmemBf16Step>(kp.tma_d_out, kp.q_shape, ss.d_out[stage], bar, head, batch,
                                       m);
  const int64_t plane = static_cast<int64_t>(p.heads) * p.batch * p.rows_pad;
  const float *rows =
      p.row_values + (static_cast<int64_t>(head) * p.batch + batch) * p.rows_pad + m * kBwdStep;
#pragma unroll
  for (int r = 0; r < kRowValues; ++r) {
    load_bulk(rows + r * plane, ss.rows[stage][r], kBwdStep * 4, bar);
  }
}

// One step of warpgroup-owned keys against 64 rows: S^T, dP^T, then dV += P^T . dO and
// dK += dS^T . Q_dq. kMasked: the causal mask crosses the step (a select per element).
template <bool kMasked, class Frag, class FragOp, class FragAcc, class Coord>
CUTLASS_DEVICE void dkdv_step(BackwardTraits::DkdvStorage &ss, int stage, int r0,
                              float const (&key_scale)[2], int const (&key)[2], int mma_thread,
                              Frag &tSrS, Frag &tdPrdP, FragOp &tdVrP, FragOp &tdKrdS,
                              FragAcc &tdVrdV, FragAcc &tdKrdK, Coord const &tScS) {
  using T = BackwardTraits;
  typename T::MmaScores mma_s;
  typename T::MmaDp mma_dp;
  typename T::MmaGrad mma_g;
  auto thr_s = mma_s.get_thread_slice(mma_thread);
  auto thr_dp = mma_dp.get_thread_slice(mma_thread);
  auto thr_g = mma_g.get_thread_slice(mma_thread);
  Tensor tSrK = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(ss.k8), T::SmemFp8Tile{}));
  Tensor tdPrV = thr_dp.partition_fragment_A(make_tensor(make_smem_ptr(ss.v), T::SmemBf16Tile{}));
  Tensor tSrQ =
      thr_s.partition_fragment_B(make_tensor(make_smem_ptr(ss.q8[stage]), T::SmemFp8Step{}));
  Tensor tdPrdO =
      thr_dp.partition_fragment_B(make_tensor(make_smem_ptr(ss.d_out[stage]), T::SmemBf16Step{}));
  Tensor tdVrdOt =
      thr_g.partition_fragment_B(make_tensor(make_smem_ptr(ss.d_out[stage]), T::SmemBf16StepT{}));
  Tensor tdKrQt =
      thr_g.partition_fragment_B(make_tensor(make_smem_ptr(ss.q_dq[stage]), T::SmemBf16StepT{}));

  issue_gemm<true, false>(mma_s, tSrK, tSrQ, tSrS);
  issue_gemm<true, false>(mma_dp, tdPrV, tdPrdO, tdPrdP);
  float const *row_scale = ss.rows[stage][0];
  float const *lse2 = ss.rows[stage][1];
  float const *delta = ss.rows[stage][2];
  warpgroup_wait<1>();  // S^T is ready
  warpgroup_fence_operand(tSrS);
#pragma unroll
  for (int v = 0; v < size(tSrS); v += 2) {
    const int h = (v >> 1) & 1;
    const int col = get<1>(tScS(v));  // the row of the step (columns col, col + 1)
    const float2 rs = *reinterpret_cast<float2 const *>(row_scale + col);
    const float2 l2 = *reinterpret_cast<float2 const *>(lse2 + col);
    float p0 = probability(tSrS(v) * key_scale[h], rs.x, l2.x);
    float p1 = probability(tSrS(v + 1) * key_scale[h], rs.y, l2.y);
    if constexpr (kMasked) {
      p0 = key[h] <= r0 + col ? p0 : 0.0f;
      p1 = key[h] <= r0 + col + 1 ? p1 : 0.0f;
    }
    tSrS(v) = p0;
    tSrS(v + 1) = p1;
  }
  to_bf16_operand(tSrS, tdVrP);
  issue_gemm<false, true>(mma_g, tdVrP, tdVrdOt, tdVrdV);
  warpgroup_wait<1>();  // dP^T is ready (dV may run)
  warpgroup_fence_operand(tdPrdP);
#pragma unroll
  for (int v = 0; v < size(tdPrdP); v += 2) {
    const int h = (v >> 1) & 1;
    const int col = get<1>(tScS(v));
    const float2 d = *reinterpret_cast<float2 const *>(delta + col);
    float ds0 = tSrS(v) * (tdPrdP(v) - d.x);
    float ds1 = tSrS(v + 1) * (tdPrdP(v + 1) - d.y);
    if constexpr (kMasked) {
      ds0 = key[h] <= r0 + col ? ds0 : 0.0f;
      ds1 = key[h] <= r0 + col + 1 ? ds1 : 0.0f;
    }
    tdPrdP(v) = ds0;
    tdPrdP(v + 1) = ds1;
  }
  to_bf16_operand(tdPrdP, tdKrdS);
  issue_gemm<false, true>(mma_g, tdKrdS, tdKrQt, tdKrdK);
  warpgroup_wait<0>();
  warpgroup_fence_operand(tdVrdV);
  warpgroup_fence_operand(tdKrdK);
}

__global__ void __launch_bounds__(kBwdThreads, 1)
    attention_bwd_dkdv_kernel(CUTE_GRID_CONSTANT DkdvKernelParams const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = BackwardTraits;
  extern __shared__ __align__(1024) char smem_raw[];
  char *smem = smem_raw + (1024 - reinterpret_cast<uintptr_t>(smem_raw) % 1024) % 1024;
  auto &ss = *reinterpret_cast<typename T::DkdvStorage *>(smem);
  BackwardParams const &p = kp.p;
  const int key_tile = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  const int n0 = key_tile * kBwdTile;
  const DkdvSteps steps(p, key_tile);
  const int num_steps = steps.count();

  if (threadIdx.x == 0) {
    BwdBarrier::init(&ss.bar_kv, 1);
#pragma unroll
    for (int s = 0; s < kBwdStages; ++s) BwdBarrier::init(&ss.bar_full[s], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    BwdBarrier::arrive_and_expect_tx(&ss.bar_kv, T::kFp8TileBytes + T::kBf16TileBytes);
    load_tile<kBwdTile, T::SmemFp8Tile>(kp.tma_k8, kp.kv_shape, ss.k8, ss.bar_kv, kv_head, batch,
                                        key_tile);
    load_tile<kBwdTile, T::SmemBf16Tile>(kp.tma_v, kp.kv_shape, ss.v, ss.bar_kv, kv_head, batch,
                                         key_tile);
    for (int step = 0; step < min(num_steps, kBwdStages - 1); ++step) {
      dkdv_load_step(kp, ss, steps, step, kv_head, batch);
    }
  }

  const int mma_thread = threadIdx.x;
  const int wg_key0 = n0 + (mma_thread / 128) * 64;  // the warpgroup's first key
  typename T::MmaScores mma_s;
  typename T::MmaDp mma_dp;
  typename T::MmaGrad mma_g;
  // [128 keys, 64 rows] fp32 accumulators (32 values a thread): S^T, then P^T; dP^T, then dS^T
  Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBwdTile>, Int<kBwdStep>>{});
  Tensor tdPrdP = partition_fragment_C(mma_dp, Shape<Int<kBwdTile>, Int<kBwdStep>>{});
  Tensor tScS = mma_s.get_thread_slice(mma_thread)
                    .partition_C(make_identity_tensor(Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
  Tensor tdVrdV = partition_fragment_C(mma_g, Shape<Int<kBwdTile>, Int<kHeadDim>>{});
  Tensor tdKrdK = partition_fragment_C(mma_g, Shape<Int<kBwdTile>, Int<kHeadDim>>{});
  Tensor tdVcdV = mma_g.get_thread_slice(mma_thread)
                      .partition_C(make_identity_tensor(Shape<Int<kBwdTile>, Int<kHeadDim>>{}));
  Tensor tdVrP = make_tensor<typename T::Bf16>(
      partition_shape_A(mma_g, Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
  Tensor tdKrdS = make_tensor<typename T::Bf16>(
      partition_shape_A(mma_g, Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
  clear(tdVrdV);
  clear(tdKrdK);

  // The thread's two keys (accumulator rows lane / 4 + 8 h of its warp) and their K scales.
  int key[2];
  float key_scale[2];
  const float *k_scale = p.k_scale + (static_cast<int64_t>(kv_head) * p.batch + batch) * p.keys_pad;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    key[h] = n0 + get<0>(tScS(2 * h));
    key_scale[h] = k_scale[key[h]];  // 0 past s_kv (keys_pad covers the tile)
  }

  BwdBarrier::wait(&ss.bar_kv, 0);
  for (int step = 0; step < num_steps; ++step) {
    const int stage = step % kBwdStages;
    if (threadIdx.x == 0 && step + kBwdStages - 1 < num_steps) {  // into the stage freed last
      dkdv_load_step(kp, ss, steps, step + kBwdStages - 1, kv_head, batch);
    }
    BwdBarrier::wait(&ss.bar_full[stage], (step / kBwdStages) & 1);
    const int r0 = steps.row_block(step) * kBwdStep;
    // causal: the warpgroup's keys are seen by some row of the step iff wg_key0 <= r0 + 63
    const bool seen = !p.causal || wg_key0 <= r0 + kBwdStep - 1;
    const bool masked = p.causal && wg_key0 + 63 > r0;
    if (seen) {
      if (masked) {
        dkdv_step<true>(ss, stage, r0, key_scale, key, mma_thread, tSrS, tdPrdP, tdVrP, tdKrdS,
                        tdVrdV, tdKrdK, tScS);
      } else {
        dkdv_step<false>(ss, stage, r0, key_scale, key, mma_thread, tSrS, tdPrdP, tdVrP, tdKrdS,
                         tdVrdV, tdKrdK, tScS);
      }
    }
    __syncthreads();  // every thread is done with the stage: thread 0 may refill it
  }

  // dV and dK * softmax_scale of the tile's real keys ([b, s_kv, h_kv, d]).
  const int64_t row_stride = p.dkv_stride_seq;
  const int64_t base = batch * p.dkv_stride_batch + static_cast<int64_t>(kv_head) * kHeadDim;
  store_rows(tdVrdV, tdVcdV, 1.0f, static_cast<__nv_bfloat16 *>(p.dv) + base, row_stride, n0,
             p.seqlen_kv);
  store_rows(tdKrdK, tdVcdV, p.softmax_scale, static_cast<__nv_bfloat16 *>(p.dk) + base, row_stride,
             n0, p.seqlen_kv);
#endif
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_DKDV_H_
