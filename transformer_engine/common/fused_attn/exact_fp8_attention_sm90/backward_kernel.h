/*
 * The sm90 mask-exact FP8 attention backward kernel: dK, dV and dQ in one pass over the
 * (row block, key tile) pairs (backward_traits.h has the tiles and the products;
 * backward_common.h the numerics; backward_dq_accum.h the order of dQ's sum).
 *
 * Grid: (key tiles, h_kv, b), highest key tile first (Note [Ordered dQ accumulation]). Block:
 * three warpgroups. Warpgroup 0 (setmaxnreg 24): warp 0 loads K8, V and K_dq once, then each
 * step's Q8, Q_dq, dO and row values into a kBwdStages ring (a stage is refilled once every
 * consumer thread has released it); warp 1 adds each step's dQ_n to the dQ accumulator.
 * Warpgroups 1 and 2 (setmaxnreg 240) own 64 keys each; a step of 64 query rows runs
 *   S^T, dP^T -> P^T and dS^T (registers; dS also into shared memory) -> dV += P^T . dO ->
 *   both warpgroups' dS written (named barrier) -> dQ_n = dS . K_dq (the warpgroup's d half)
 *   and dK += dS^T . Q_dq -> dQ_n into shared memory for the writer.
 * dK and dV are summed over the steps in a fixed order and written once, dK times
 * softmax_scale; dQ's sum is ordered by the writer. Deterministic throughout.
 *
 * Mask-exactness (DESIGN.md section 2): rows past s_q arrive as 0 (TMA bounds) with LSE2 = +inf
 * and D = 0, so their P and dS are 0; an element (key j, row i) the mask hides (j > i under the
 * causal mask, or j >= s_kv) gets P = dS = 0 by a select, never by a product, so neither dV, dK
 * nor dQ sees its scores or dP; a warpgroup whose keys no row of the step sees skips its
 * products and gives dQ_n exact zeros (its dS). Keys past s_kv are computed and never written.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_KERNEL_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_KERNEL_H_

#include <cutlass/arch/reg_reconfig.h>

#include <climits>

#include <cute/tensor.hpp>

#include "backward_common.h"
#include "backward_dq_accum.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// The 16-bit buffers of the shared storage as the operand dtype (the MMAs' view) or as the
// bf16-typed words the tensor maps move (BackwardGmem: the TMA copies bf16 and fp16 alike).
template <class Element>
CUTLASS_DEVICE Element *as(uint16_t *words) {
  return reinterpret_cast<Element *>(words);
}
CUTLASS_DEVICE BackwardTraits::Bf16 *words16(uint16_t *words) {
  return as<BackwardTraits::Bf16>(words);
}

// Warp 0 of the producer warpgroup, one lane: the step's Q8, Q_dq, dO and row values into its
// stage.
CUTLASS_DEVICE void load_step(BackwardKernelParams const &kp, BackwardTraits::SharedStorage &ss,
                              BackwardSteps const &steps, int step, int kv_head, int batch) {
  using T = BackwardTraits;
  BackwardParams const &p = kp.p;
  const int stage = step % kBwdStages;
  const int head = kv_head * steps.group + steps.head_in_group(step);
  const int m = steps.row_block(step);
  uint64_t &bar = ss.bar_full[stage];
  BwdBarrier::arrive_and_expect_tx(
      &bar, T::kFp8StepBytes + 2 * T::k16StepBytes + kRowValues * kBwdStep * 4);
  load_tile<kBwdStep, T::SmemFp8Step>(kp.tma_q8, kp.q_shape, ss.q8[stage], bar, head, batch, m);
  load_tile<kBwdStep, T::Smem16Step>(kp.tma_q_dq, kp.q_shape, words16(ss.q_dq[stage]), bar, head,
                                     batch, m);
  load_tile<kBwdStep, T::Smem16Step>(kp.tma_d_out, kp.q_shape, words16(ss.d_out[stage]), bar, head,
                                     batch, m);
  const int64_t plane = static_cast<int64_t>(p.heads) * p.batch * p.rows_pad;
  const float *rows =
      p.row_values + (static_cast<int64_t>(head) * p.batch + batch) * p.rows_pad + m * kBwdStep;
#pragma unroll
  for (int r = 0; r < kRowValues; ++r) {
    load_bulk(rows + r * plane, ss.rows[stage][r], kBwdStep * 4, bar);
  }
}

CUTLASS_DEVICE void run_loads(BackwardKernelParams const &kp, BackwardTraits::SharedStorage &ss,
                              BackwardSteps const &steps, int key_tile, int kv_head, int batch) {
  using T = BackwardTraits;
  BwdBarrier::arrive_and_expect_tx(&ss.bar_kv, T::kFp8TileBytes + 2 * T::k16TileBytes);
  load_tile<kBwdTile, T::SmemFp8Tile>(kp.tma_k8, kp.kv_shape, ss.k8, ss.bar_kv, kv_head, batch,
                                      key_tile);
  load_tile<kBwdTile, T::Smem16Tile>(kp.tma_v, kp.kv_shape, words16(ss.v), ss.bar_kv, kv_head,
                                     batch, key_tile);
  load_tile<kBwdTile, T::Smem16Tile>(kp.tma_k_dq, kp.kv_shape, words16(ss.k_dq), ss.bar_kv, kv_head,
                                     batch, key_tile);
  const int num_steps = steps.count();
  for (int step = 0; step < num_steps; ++step) {
    const int stage = step % kBwdStages;
    if (step >= kBwdStages) {  // the stage's previous step released by every consumer thread
      BwdBarrier::wait(&ss.bar_empty[stage], (step / kBwdStages - 1) & 1);
    }
    load_step(kp, ss, steps, step, kv_head, batch);
  }
}

// dS^T of the warpgroup's keys (the 16-bit words of its register operand, or zeros) into the
// step's dS [64 rows, 128 keys] (SmemDs; BackwardTraits::ds_word_offset gives the words' places:
// the two values of a word are rows c, c + 1 of one key, adjacent bytes of the MN-major layout).
template <bool kZero, class FragOp>
CUTLASS_DEVICE void store_ds(FragOp const &tdKrdS, uint32_t ds_base, uint16_t *smem) {
  using T = BackwardTraits;
  uint32_t const *words = reinterpret_cast<uint32_t const *>(raw_pointer_cast(tdKrdS.data()));
  char *bytes = reinterpret_cast<char *>(smem);
#pragma unroll
  for (int j = 0; j < kBwdStep / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      *reinterpret_cast<uint32_t *>(bytes + T::ds_word_offset(ds_base, h, j)) =
          kZero ? 0u : words[h + 2 * j];
    }
  }
}

// The score products of a step that sees the warpgroup's keys: S^T and dP^T, then P^T and dS^T
// in registers (the A operands of dV and dK) and dS in shared memory. kMasked: the causal
// diagonal or the end of the keys crosses the step (a select per element). P^T is converted only
// once dS^T is done, so that no 16-bit operand is live beside the two fp32 tiles (the registers
// of the consumers' 240 hold dV, dK, S^T and dP^T, 192 a thread, at that point).
template <bool kMasked, class Element, class Frag, class FragOp, class Coord>
CUTLASS_DEVICE void score_gradients(BackwardTraits::SharedStorage &ss, int stage, int r0,
                                    float const (&key_scale)[2], int const (&first_row)[2],
                                    int mma_thread, Frag &tSrS, Frag &tdPrdP, FragOp &tdVrP,
                                    FragOp &tdKrdS, Coord const &tScS) {
  using T = BackwardTraits;
  typename T::MmaScores mma_s;
  typename T::template MmaDpOf<Element> mma_dp;
  auto thr_s = mma_s.get_thread_slice(mma_thread);
  auto thr_dp = mma_dp.get_thread_slice(mma_thread);
  Tensor tSrK = thr_s.partition_fragment_A(make_tensor(make_smem_ptr(ss.k8), T::SmemFp8Tile{}));
  Tensor tdPrV = thr_dp.partition_fragment_A(
      make_tensor(make_smem_ptr(as<Element>(ss.v)), T::Smem16Tile{}));
  Tensor tSrQ =
      thr_s.partition_fragment_B(make_tensor(make_smem_ptr(ss.q8[stage]), T::SmemFp8Step{}));
  Tensor tdPrdO = thr_dp.partition_fragment_B(
      make_tensor(make_smem_ptr(as<Element>(ss.d_out[stage])), T::Smem16Step{}));

  // (key h, row) may enter the gradients: one compare (first_row: the causal mask and the real
  // keys, see BackwardConsumer::run).
  auto visible = [&](int h, int row) { return row >= first_row[h]; };
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
      p0 = visible(h, r0 + col) ? p0 : 0.0f;
      p1 = visible(h, r0 + col + 1) ? p1 : 0.0f;
    }
    tSrS(v) = p0;
    tSrS(v + 1) = p1;
  }
  warpgroup_wait<0>();  // dP^T is ready
  warpgroup_fence_operand(tdPrdP);
#pragma unroll
  for (int v = 0; v < size(tdPrdP); v += 2) {
    const int h = (v >> 1) & 1;
    const int col = get<1>(tScS(v));
    const float2 d = *reinterpret_cast<float2 const *>(delta + col);
    float ds0 = tSrS(v) * (tdPrdP(v) - d.x);
    float ds1 = tSrS(v + 1) * (tdPrdP(v + 1) - d.y);
    if constexpr (kMasked) {
      ds0 = visible(h, r0 + col) ? ds0 : 0.0f;
      ds1 = visible(h, r0 + col + 1) ? ds1 : 0.0f;
    }
    tdPrdP(v) = ds0;
    tdPrdP(v + 1) = ds1;
  }
  to_16bit_operand(tSrS, tdVrP);
  to_16bit_operand(tdPrdP, tdKrdS);
  store_ds<false>(tdKrdS, T::ds_word_base(mma_thread), ss.ds[stage]);
}

// Consumer warpgroups 1 and 2: the CTA's 128 keys, 64 a warpgroup. Element: the dtype of the
// 16-bit operands and of the gradients (bf16 or fp16).
template <class Element>
struct BackwardConsumer {
  using T = BackwardTraits;
  BackwardParams const &p;
  typename T::SharedStorage &ss;
  int mma_thread;  // 0..255: the thread's index in the tiled MMAs
  int key_tile, kv_head, batch;

  CUTLASS_DEVICE void run(BackwardSteps const &steps) {
    using cutlass::arch::NamedBarrier;
    const int n0 = key_tile * kBwdTile;
    const int wg = mma_thread / 128;
    const int wg_key0 = n0 + wg * 64;  // the warpgroup's first key
    typename T::MmaScores mma_s;
    typename T::template MmaDpOf<Element> mma_dp;
    typename T::template MmaGradOf<Element> mma_g;
    typename T::template MmaDqOf<Element> mma_dq;
    // [128 keys, 64 rows] fp32 accumulators (32 values a thread): S^T, then P^T; dP^T, then dS^T
    Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBwdTile>, Int<kBwdStep>>{});
    Tensor tdPrdP = partition_fragment_C(mma_dp, Shape<Int<kBwdTile>, Int<kBwdStep>>{});
    Tensor tScS = mma_s.get_thread_slice(mma_thread)
                      .partition_C(make_identity_tensor(Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
    Tensor tdVrdV = partition_fragment_C(mma_g, Shape<Int<kBwdTile>, Int<kHeadDim>>{});
    Tensor tdKrdK = partition_fragment_C(mma_g, Shape<Int<kBwdTile>, Int<kHeadDim>>{});
    Tensor tdVcdV = mma_g.get_thread_slice(mma_thread)
                        .partition_C(make_identity_tensor(Shape<Int<kBwdTile>, Int<kHeadDim>>{}));
    Tensor tdVrP =
        make_tensor<Element>(partition_shape_A(mma_g, Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
    Tensor tdKrdS =
        make_tensor<Element>(partition_shape_A(mma_g, Shape<Int<kBwdTile>, Int<kBwdStep>>{}));
    auto thr_dq = mma_dq.get_thread_slice(mma_thread);
    Tensor tdQrKt = thr_dq.partition_fragment_B(
        make_tensor(make_smem_ptr(as<Element>(ss.k_dq)), T::Smem16TileT{}));
    clear(tdVrdV);
    clear(tdKrdK);

    // The thread's two keys (accumulator rows lane / 4 + 8 h of its warp), their K scales and
    // the first row that may see each: the key itself (causal), row 0 (no mask), none (a key
    // past s_kv).
    int first_row[2];
    float key_scale[2];
    const float *k_scale =
        p.k_scale + (static_cast<int64_t>(kv_head) * p.batch + batch) * p.keys_pad;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = n0 + get<0>(tScS(2 * h));
      key_scale[h] = k_scale[key];  // 0 past s_kv (keys_pad covers the tile)
      first_row[h] = key >= p.seqlen_kv ? INT_MAX : (p.causal ? key : INT_MIN);
    }
    // this thread's float4 slots of the warpgroup's dQ_n (Note [Ordered dQ accumulation])
    float4 *dq_slots = reinterpret_cast<float4 *>(ss.dq[wg]) + mma_thread % 128;

    BwdBarrier::wait(&ss.bar_kv, 0);
    const int num_steps = steps.count();
    for (int step = 0; step < num_steps; ++step) {
      const int stage = step % kBwdStages;
      BwdBarrier::wait(&ss.bar_full[stage], (step / kBwdStages) & 1);
      const int r0 = steps.row_block(step) * kBwdStep;
      // some row of the step sees a key of the warpgroup; an element of the step is hidden
      const bool seen = wg_key0 < p.seqlen_kv && (!p.causal || wg_key0 <= r0 + kBwdStep - 1);
      const bool masked = (p.causal && wg_key0 + 63 > r0) || wg_key0 + 64 > p.seqlen_kv;
      auto thr_g = mma_g.get_thread_slice(mma_thread);
      if (seen) {
        if (masked) {
          score_gradients<true, Element>(ss, stage, r0, key_scale, first_row, mma_thread, tSrS, tdPrdP,
                                tdVrP, tdKrdS, tScS);
        } else {
          score_gradients<false, Element>(ss, stage, r0, key_scale, first_row, mma_thread, tSrS, tdPrdP,
                                 tdVrP, tdKrdS, tScS);
        }
        Tensor tdVrdOt = thr_g.partition_fragment_B(
            make_tensor(make_smem_ptr(as<Element>(ss.d_out[stage])), typename T::Smem16StepT{}));
        issue_gemm<false, true>(mma_g, tdVrP, tdVrdOt, tdVrdV);
      } else {
        store_ds<true>(tdKrdS, T::ds_word_base(mma_thread), ss.ds[stage]);
      }
      cutlass::arch::fence_view_async_shared();  // dS written -> read by the WGMMAs
      NamedBarrier::sync(kBwdMmaThreads, kBarDsReady);

      // dQ_n = dS . K_dq (d half wg); then dK += dS^T . Q_dq
      Tensor tdQrdS = thr_dq.partition_fragment_A(
          make_tensor(make_smem_ptr(as<Element>(ss.ds[stage])), typename T::SmemDs{}));
      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBwdStep>, Int<kHeadDim>>{});
      issue_gemm<true, false>(mma_dq, tdQrdS, tdQrKt, tdQrdQ);
      if (seen) {
        Tensor tdKrQt = thr_g.partition_fragment_B(
            make_tensor(make_smem_ptr(as<Element>(ss.q_dq[stage])), typename T::Smem16StepT{}));
        issue_gemm<false, true>(mma_g, tdKrdS, tdKrQt, tdKrdK);
        warpgroup_wait<1>();  // dV and dQ_n are done (dK may run)
      } else {
        warpgroup_wait<0>();
      }
      warpgroup_fence_operand(tdQrdQ);
      NamedBarrier::sync(kDqSyncThreads, kBarDqEmpty + wg);  // the writer read the last one
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dq_slots[i * 128] =
            make_float4(tdQrdQ(4 * i), tdQrdQ(4 * i + 1), tdQrdQ(4 * i + 2), tdQrdQ(4 * i + 3));
      }
      cutlass::arch::fence_view_async_shared();  // dQ_n written -> read by the bulk copy
      NamedBarrier::arrive(kDqSyncThreads, kBarDqFull + wg);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdVrdV);
      warpgroup_fence_operand(tdKrdK);
      cutlass::arch::ClusterBarrier::arrive(&ss.bar_empty[stage]);  // this thread is done
    }

    // dV and dK * softmax_scale of the tile's real keys ([b, s_kv, h_kv, d]).
    const int64_t row_stride = p.dkv_stride_seq;
    const int64_t base = batch * p.dkv_stride_batch + static_cast<int64_t>(kv_head) * kHeadDim;
    store_rows<Element>(tdVrdV, tdVcdV, 1.0f, static_cast<uint16_t *>(p.dv) + base, row_stride,
                        n0, p.seqlen_kv);
    store_rows<Element>(tdKrdK, tdVcdV, p.softmax_scale, static_cast<uint16_t *>(p.dk) + base,
                        row_stride, n0, p.seqlen_kv);
  }
};

// Element: the dtype of V, dO, Q_dq, K_dq and the gradients, bf16 or fp16 (BackwardTraits).
template <class Element>
__global__ void __launch_bounds__(kBwdThreads, 1)
    attention_bwd_kernel(CUTE_GRID_CONSTANT BackwardKernelParams const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = BackwardTraits;
  extern __shared__ __align__(1024) char smem_raw[];
  char *smem = smem_raw + (1024 - reinterpret_cast<uintptr_t>(smem_raw) % 1024) % 1024;
  auto &ss = *reinterpret_cast<typename T::SharedStorage *>(smem);
  BackwardParams const &p = kp.p;
  // Highest key tile first: Note [Ordered dQ accumulation].
  const int key_tile = gridDim.x - 1 - blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  const BackwardSteps steps(p, key_tile);
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    BwdBarrier::init(&ss.bar_kv, 1);
#pragma unroll
    for (int s = 0; s < kBwdStages; ++s) {
      BwdBarrier::init(&ss.bar_full[s], 1);
      BwdBarrier::init(&ss.bar_empty[s], kBwdMmaThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kBwdProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (warp == 0) {
      if (cute::elect_one_sync()) run_loads(kp, ss, steps, key_tile, kv_head, batch);
    } else if (warp == 1) {
      DqWriter writer{p, ss, key_tile, kv_head, batch};
      writer.run(steps);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kBwdConsumerRegisters>();
    BackwardConsumer<Element> consumer{p, ss, static_cast<int>(threadIdx.x) - 128, key_tile,
                                       kv_head, batch};
    consumer.run(steps);
  }
#endif
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_KERNEL_H_
