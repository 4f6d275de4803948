/*
 * The sm90 mask-exact FP8 attention forward kernel: warp-specialized, two consumer warpgroups
 * ping-ponged, softmax overlapped with the next tile's Q.K^T inside each warpgroup.
 *
 * Grid: (b * h, query tiles), causal tiles longest first across all heads. Block: three
 * warpgroups (384 threads).
 *   warpgroup 0, the producer: its first warp issues the TMA loads and stages the K scales
 *     (mainloop.h, Producer) into a kStages ring, K and V with their own full / empty
 *     barriers; setmaxnreg gives its registers to the consumers.
 *   warpgroups 1 and 2, the consumers: 64 query rows each. Visit v of the KV tiles (boundary
 *     tiles first, mainloop.h KVTileRange) runs
 *       issue S(v) = Q8 . K8(v)^T; issue O += P(v-1) . V(v-1)      (one turn, see below)
 *       wait S(v) -> scores in log2 units with the per-key K scale and the per-row Q scale, the
 *       element-wise mask on boundary tiles -> online softmax (softmax.h) -> wait P.V(v-1) ->
 *       P(v) into the A operand of its P.V (E4M3 for an FP8 tile, bf16 for a boundary tile) ->
 *       O *= alpha(v) * (u / s(v)), u <- s(v)     (Note [V scale in the rescale])
 *     so the tensor cores run P.V(v-1) while the warpgroup does the softmax of S(v).
 *     Turns: the two consumers take turns issuing their WGMMAs (named barriers kTurnBarrier + c),
 *     so that one's softmax runs while the other's WGMMAs have the tensor cores.
 * P.V of an FP8 tile accumulates in the WGMMA's accumulator (the unit change is the rescale
 * before it). Numerics: Note [Mask-exact FP8 scaling] and Note [V scale in the rescale]
 * (exact_fp8/formats.py); docs/attention_kernel_sm90.md.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_H_

#include <cfloat>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "epilogue.h"
#include "kernel_traits.h"
#include "mainloop.h"
#include "params.h"
#include "softmax.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

constexpr uint32_t kTurnBarrier = 1;  // named barriers 1, 2: the consumers' turns (0: syncthreads)

// Waits for consumer c's turn to issue WGMMAs; passes it to the other consumer.
CUTLASS_DEVICE void wait_turn(int c) {
  cutlass::arch::NamedBarrier::sync(kMmaThreads, kTurnBarrier + c);
}
CUTLASS_DEVICE void pass_turn(int c) {
  cutlass::arch::NamedBarrier::arrive(kMmaThreads, kTurnBarrier + (1 - c));
}

// Every consumer thread arrives once: the stage's buffer may be refilled. Each thread's arrive
// releases its own earlier shared-memory reads of the stage (the K scales are read just before
// the stage is released, and used after), so that no read depends on another thread's arrive.
CUTLASS_DEVICE void release(uint64_t *bar) { cutlass::arch::ClusterBarrier::arrive(bar); }

// One consumer warpgroup's whole share of a query tile: its 64 rows. kFp8VEverywhere: the
// LEAKY mode (boundary tiles keep their element-wise mask but use P in E4M3 and V8^T with its
// chunk scale, which the hidden keys of the tile enter): a lower bound of the time for the
// exactness-cost benchmark and the negative control of the exactness tests; never a product path.
template <bool kFp8VEverywhere>
struct Consumer {
  using Traits = KernelTraits;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  AttentionParams const &p;
  typename Traits::SharedStorage &ss;
  int c;           // 0 or 1: which consumer warpgroup
  int mma_thread;  // 0..255: the thread's index in the tiled MMAs
  int batch, head, kv_head, q0;

  CUTLASS_DEVICE void run(KVTileRange const &range) {
    typename Traits::MmaQK mma_qk;
    typename Traits::MmaPV8 mma_pv8;
    typename Traits::MmaPV16 mma_pv16;
    auto thr_qk = mma_qk.get_thread_slice(mma_thread);
    auto thr_pv = mma_pv8.get_thread_slice(mma_thread);

    Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutFp8{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kQTile>, Int<kKVTile>>{});
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kQTile>, Int<kKVTile>>{}));
    Tensor tOrO = partition_fragment_C(mma_pv8, Shape<Int<kQTile>, Int<kHeadDim>>{});
    Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kQTile>, Int<kHeadDim>>{}));
    // P's A operand: bf16 for a boundary tile, E4M3 (the first half of the registers) for an
    // FP8 tile.
    Tensor tOrP16 = make_tensor<typename Traits::Bf16>(
        partition_shape_A(mma_pv16, Shape<Int<kQTile>, Int<kKVTile>>{}));
    Tensor tOrP8 = make_tensor(
        make_rmem_ptr(reinterpret_cast<typename Traits::Fp8 *>(raw_pointer_cast(tOrP16.data()))),
        partition_shape_A(mma_pv8, Shape<Int<kQTile>, Int<kKVTile>>{}));
    static_assert(decltype(size(tSrS))::value == 64 && decltype(size(tOrO))::value == 64);
    clear(tOrO);

    ScoreScales scales(p, tScS, batch, head, q0);
    OnlineSoftmax softmax;
    softmax.init();
    float u = 1.0f;  // the unit of tOrO: the V scale of the last FP8 tile (1: unquantized)

    // Issues O += P . V of the tile in `stage` (FP8 or boundary tile).
    auto issue_pv = [&](int stage, bool fp8_v) {
      if (fp8_v) {
        issue_pv_gemm<typename Traits::MmaPV8, typename Traits::SmemLayoutFp8>(
            mma_pv8, reinterpret_cast<typename Traits::Fp8 *>(ss.v[stage]), tOrP8, tOrO,
            mma_thread);
      } else {
        issue_pv_gemm<typename Traits::MmaPV16, typename Traits::SmemLayoutV16>(
            mma_pv16, reinterpret_cast<typename Traits::Bf16 *>(ss.v[stage]), tOrP16, tOrO,
            mma_thread);
      }
    };
    // S(visit) ready in tSrS (the K stage is released: its K8 was read by the WGMMA, its
    // scales are in registers) -> scores -> online softmax -> P(visit) in tSrS. The tile kind
    // is a compile-time constant: the element-wise mask exists only in the boundary variant.
    auto softmax_step = [&](int visit, auto boundary, ScoreScales::KeyScales const &k_scales,
                            float (&alpha)[2]) {
      constexpr bool kBoundary = decltype(boundary)::value;
      release(&ss.bar_k_empty[visit % kStages]);
      scales.apply<kBoundary>(tSrS, tScS, k_scales, range.tile(visit));
      softmax.step(tSrS, scales.row_scale, alpha);
    };
    // The stage's K scales and V scale (1 for a boundary tile), read once its K has arrived.
    auto tile_scales = [&](int stage, bool boundary, ScoreScales::KeyScales &k_scales) {
      ScoreScales::load(k_scales, tScS, ss.k_scale[stage]);
      return boundary && !kFp8VEverywhere ? 1.0f : ss.v_scale[stage];
    };
    auto p_to_operand = [&](auto boundary) {
      if constexpr (decltype(boundary)::value && !kFp8VEverywhere) {
        p_to_bf16_operand(tSrS, tOrP16);
      } else {
        p_to_fp8_operand(tSrS, tOrP8);
      }
    };
    // O *= alpha * (u / s_kt), u <- s_kt: Note [V scale in the rescale].
    auto rescale = [&](float const (&alpha)[2], float s_kt) {
      const float ratio = fminf(u / s_kt, FLT_MAX);
      u = s_kt;
      const float factor[2] = {alpha[0] * ratio, alpha[1] * ratio};
#pragma unroll
      for (int v = 0; v < 64; ++v) tOrO(v) *= factor[(v >> 1) & 1];
    };
    // Visit 0: S(0) alone.
    auto first_visit = [&](auto boundary) {
      Barrier::wait(&ss.bar_k_full[0], 0);
      ScoreScales::KeyScales k_scales;
      u = tile_scales(0, decltype(boundary)::value, k_scales);  // O is 0: only its unit is set
      wait_turn(c);
      issue_scores_gemm(mma_qk, tSrQ, ss.k[0], tSrS, mma_thread);
      pass_turn(c);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      float alpha[2];
      softmax_step(0, boundary, k_scales, alpha);
      p_to_operand(boundary);
    };
    // Visit v >= 1: S(v) and P.V(v-1) issued in one turn, softmax(v) while P.V(v-1) runs.
    auto visit_step = [&](int visit, auto boundary, bool fp8_prev) {
      const int stage = visit % kStages, stage_prev = (visit - 1) % kStages;
      Barrier::wait(&ss.bar_k_full[stage], (visit / kStages) & 1);
      ScoreScales::KeyScales k_scales;
      const float s_kt = tile_scales(stage, decltype(boundary)::value, k_scales);
      wait_turn(c);
      issue_scores_gemm(mma_qk, tSrQ, ss.k[stage], tSrS, mma_thread);
      Barrier::wait(&ss.bar_v_full[stage_prev], ((visit - 1) / kStages) & 1);
      issue_pv(stage_prev, kFp8VEverywhere || fp8_prev);
      pass_turn(c);
      warpgroup_wait<1>();  // S(v) is ready; P(v-1) . V(v-1) may still run
      warpgroup_fence_operand(tSrS);
      float alpha[2];
      softmax_step(visit, boundary, k_scales, alpha);
      warpgroup_wait<0>();  // P(v-1) . V(v-1) is done: its operands and O are free
      warpgroup_fence_operand(tOrO);
      release(&ss.bar_v_empty[stage_prev]);
      p_to_operand(boundary);
      rescale(alpha, s_kt);
    };

    if (range.num_tiles == 0) {
      store_output(p, softmax, u, tOrO, tOcO, batch, head, q0);
      return;
    }
    if (c == 1) pass_turn(c);  // consumer 0 issues first
    Barrier::wait(&ss.bar_q, 0);

    // Boundary tiles are visited first (KVTileRange), then the FP8 tiles.
    const int num_boundary = range.num_tiles - range.num_fp8;
    if (num_boundary > 0) {
      first_visit(cute::true_type{});
    } else {
      first_visit(cute::false_type{});
    }
    for (int visit = 1; visit < num_boundary; ++visit) {
      visit_step(visit, cute::true_type{}, /*fp8_prev=*/false);
    }
    for (int visit = max(num_boundary, 1); visit < range.num_tiles; ++visit) {
      visit_step(visit, cute::false_type{}, /*fp8_prev=*/visit > num_boundary);
    }
    {  // the last P.V
      const int visit = range.num_tiles - 1, stage = visit % kStages;
      Barrier::wait(&ss.bar_v_full[stage], (visit / kStages) & 1);
      issue_pv(stage, /*fp8_v=*/kFp8VEverywhere || visit >= num_boundary);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      release(&ss.bar_v_empty[stage]);
    }
    if (c == 0) wait_turn(c);  // consumes consumer 1's last pass: every turn barrier ends empty
    store_output(p, softmax, u, tOrO, tOcO, batch, head, q0);
  }
};

template <bool kFp8VEverywhere>
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

  const int warpgroup = threadIdx.x / 128;
  // CTAs start in blockIdx order, x fastest: every (sample, head)'s longest causal tile first.
  const int q_tile = p.causal ? p.num_q_tiles - 1 - blockIdx.y : blockIdx.y;
  const int batch = blockIdx.x / p.heads;
  const int head = blockIdx.x % p.heads;
  const int kv_head = head / (p.heads / p.heads_kv);
  const KVTileRange range = kv_tile_range(p, q_tile);

  if (threadIdx.x == 0) {
    Barrier::init(&ss.bar_q, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&ss.bar_k_full[s], kKFullArrivals);
      Barrier::init(&ss.bar_v_full[s], 1);
      Barrier::init(&ss.bar_k_empty[s], kConsumerArrivals);
      Barrier::init(&ss.bar_v_empty[s], kConsumerArrivals);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x < 32) {
      Producer producer{kp, ss, batch, kv_head, p.cu_vt[batch]};
      producer.run<kFp8VEverywhere>(head, q_tile, range);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    Consumer<kFp8VEverywhere> consumer{p, ss, warpgroup - 1, static_cast<int>(threadIdx.x) - 128, batch,
                      head, kv_head, q_tile * kQTile};
    consumer.run(range);
  }
#endif
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_H_
