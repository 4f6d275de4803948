/*
 * Mainloop of the sm90 mask-exact FP8 attention forward: the TMA loads of the 2-stage KV ring
 * and the per-KV-tile work of the consumer warpgroups.
 *
 * Which KV tiles a query tile visits, and which of them use FP8 V (Note [Mask-exact FP8
 * scaling], masks.fp8_tile_map): with q0 the tile's first row and s_kv the keys of the sample,
 *   causal (top-left): row i sees keys j <= i; tiles kt < min(q_tile, s_kv / 128) are seen whole
 *     by every row (FP8 V); the tiles from there to the last row's last key are boundary tiles.
 *   no mask: every complete tile is FP8; the incomplete last tile (s_kv % 128 != 0) is boundary.
 * A boundary tile uses Q8 . K8^T for its scores (per-token Q and K scales never leak) and the
 * unquantized V (bf16 P . V WGMMA) under the element-wise mask.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_MAINLOOP_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_MAINLOOP_H_

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "kernel_traits.h"
#include "params.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// The KV tiles of one query tile: [0, num_fp8) FP8 V, [num_fp8, num_tiles) boundary tiles.
// They are visited boundary tiles first (the diagonal of a causal mask: the running max then
// sees the row's nearest keys first), then the FP8 tiles in order, as the Triton kernel does.
struct KVTileRange {
  int num_tiles;
  int num_fp8;

  // The KV tile of visit i (0 <= i < num_tiles).
  CUTLASS_HOST_DEVICE int tile(int i) const {
    const int num_boundary = num_tiles - num_fp8;
    return i < num_boundary ? num_fp8 + i : i - num_boundary;
  }
};

CUTLASS_HOST_DEVICE KVTileRange kv_tile_range(AttentionParams const &p, int q_tile) {
  const int q0 = q_tile * kQTile;
  const int q_last = min(q0 + kQTile, p.seqlen_q) - 1;  // last real row
  const int kv_end = p.causal ? min(q_last + 1, p.seqlen_kv) : p.seqlen_kv;
  KVTileRange r;
  r.num_tiles = kv_end > 0 ? (kv_end + kKVTile - 1) / kKVTile : 0;
  const int complete = p.seqlen_kv / kKVTile;
  r.num_fp8 = min(p.causal ? min(q_tile, complete) : complete, r.num_tiles);
  return r;
}

// Global tensors of the TMA loads (cute's (rows, contiguous, batch...) mode order).
struct GmemLayouts {
  using Fp8 = KernelTraits::Fp8;
  using Bf16 = KernelTraits::Bf16;
  // [h, t_q, d] E4M3 as (t_q, d, h); [h_kv, t_kv, d] as (t_kv, d, h_kv)
  using ShapeRows = Shape<int32_t, int32_t, int32_t>;
  using StrideRows = Stride<int64_t, _1, int64_t>;
  // V8^T [h_kv, d, vt_width] E4M3 as (d, vt_width, h_kv): K-major B operand of P.V
  using StrideVt = Stride<int64_t, _1, int64_t>;
  // V [b, s_kv, h_kv, d] bf16 as (d, s_kv, h_kv, b): MN-major B operand of P.V
  using ShapeV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideV = Stride<_1, int64_t, int64_t, int64_t>;

  using TmaFp8 = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Fp8 const *>(nullptr)), ShapeRows{}, StrideRows{}),
      KernelTraits::SmemLayoutFp8{}));
  using TmaV16 = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Bf16 const *>(nullptr)), ShapeV{}, StrideV{}),
      KernelTraits::SmemLayoutV16{}));
};

// Everything the kernel reads: the plain parameters and the four TMA descriptors.
struct KernelParams {
  AttentionParams p;
  GmemLayouts::TmaFp8 tma_q;   // Q8 tiles [128 rows, 128 d]
  GmemLayouts::TmaFp8 tma_k;   // K8 tiles [128 keys, 128 d]
  GmemLayouts::TmaFp8 tma_vt;  // V8^T tiles [128 d, 128 keys]
  GmemLayouts::TmaV16 tma_v;   // V tiles [128 d, 128 keys] (boundary tiles)
  int32_t t_q;                 // b * s_q
  int32_t t_kv;                // b * s_kv
  int32_t vt_width;            // columns of V8^T
};

// The TMA side of the ring: issued by one thread.
struct Producer {
  using Traits = KernelTraits;
  KernelParams const &kp;
  typename Traits::SharedStorage &ss;
  int batch;
  int kv_head;
  int vt_col0;  // V8^T column of the sample's first key (cu_vt[b])

  CUTLASS_DEVICE void load_q(int head, int q_tile) {
    Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(kp.t_q, int32_t(kHeadDim), kp.p.heads));
    Tensor gQ = local_tile(domain_offset(make_coord(batch * kp.p.seqlen_q, 0), mQ(_, _, head)),
                           Shape<Int<kQTile>, Int<kHeadDim>>{}, make_coord(q_tile, 0));
    Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutFp8{});
    auto [tQg, tQs] = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(gQ));
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&ss.bar_q,
                                                                   Traits::kFp8TileBytes);
    copy(kp.tma_q.with(ss.bar_q), tQg, tQs);
  }

  // KV tile kt into the stage of visit `visit`.
  CUTLASS_DEVICE void load_kv(int visit, int kt, bool fp8_v) {
    const int stage = visit % kStages;
    uint64_t &bar = ss.bar_full[stage];
    const uint32_t bytes = Traits::kFp8TileBytes + (fp8_v ? Traits::kFp8TileBytes
                                                          : Traits::kV16TileBytes);
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&bar, bytes);

    Tensor mK = kp.tma_k.get_tma_tensor(make_shape(kp.t_kv, int32_t(kHeadDim), kp.p.heads_kv));
    Tensor gK = local_tile(domain_offset(make_coord(batch * kp.p.seqlen_kv, 0), mK(_, _, kv_head)),
                           Shape<Int<kKVTile>, Int<kHeadDim>>{}, make_coord(kt, 0));
    Tensor sK = make_tensor(make_smem_ptr(ss.k[stage]), typename Traits::SmemLayoutFp8{});
    auto [tKg, tKs] = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
    copy(kp.tma_k.with(bar), tKg, tKs);

    if (fp8_v) {
      Tensor mVt =
          kp.tma_vt.get_tma_tensor(make_shape(int32_t(kHeadDim), kp.vt_width, kp.p.heads_kv));
      Tensor gVt = local_tile(domain_offset(make_coord(0, vt_col0), mVt(_, _, kv_head)),
                              Shape<Int<kHeadDim>, Int<kKVTile>>{}, make_coord(0, kt));
      Tensor sVt = make_tensor(make_smem_ptr(reinterpret_cast<typename Traits::Fp8 *>(ss.v[stage])),
                               typename Traits::SmemLayoutFp8{});
      auto [tVg, tVs] = tma_partition(kp.tma_vt, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sVt),
                                      group_modes<0, 2>(gVt));
      copy(kp.tma_vt.with(bar), tVg, tVs);
    } else {
      Tensor mV = kp.tma_v.get_tma_tensor(
          make_shape(int32_t(kHeadDim), kp.p.seqlen_kv, kp.p.heads_kv, kp.p.batch));
      Tensor gV = local_tile(mV(_, _, kv_head, batch), Shape<Int<kHeadDim>, Int<kKVTile>>{},
                             make_coord(0, kt));
      Tensor sV = make_tensor(
          make_smem_ptr(reinterpret_cast<typename Traits::Bf16 *>(ss.v[stage])),
          typename Traits::SmemLayoutV16{});
      auto [tVg, tVs] = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));
      copy(kp.tma_v.with(bar), tVg, tVs);  // keys past s_kv arrive as 0 (TMA bounds)
    }
  }
};

// S = Q8 . K8^T of one KV tile into the 64 x 128 fp32 fragment tSrS (zeroed first).
template <class FragQ, class FragS>
CUTLASS_DEVICE void scores_gemm(typename KernelTraits::MmaQK &mma, FragQ const &tSrQ,
                                KernelTraits::Fp8 *smem_k, FragS &tSrS, int thread) {
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename KernelTraits::SmemLayoutFp8{});
  Tensor tSrK = mma.get_thread_slice(thread).partition_fragment_B(sK);
  warpgroup_fence_operand(tSrS);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int k = 0; k < size<2>(tSrQ); ++k) {
    gemm(mma, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// tOrO (+)= P . V of one KV tile (A from registers): a fresh product with `fresh`, else added
// to tOrO inside the MMA. Mma: MmaPV8 with V8^T, or MmaPV16 with V.
template <class Mma, class Layout_, class FragP, class FragO, class Element>
CUTLASS_DEVICE void pv_gemm(Mma &mma, Element *smem_v, FragP &tOrP, FragO &tOrO, int thread,
                            bool fresh) {
  Tensor sV = make_tensor(make_smem_ptr(smem_v), Layout_{});
  Tensor tOrV = mma.get_thread_slice(thread).partition_fragment_B(sV);
  warpgroup_fence_operand(tOrO);
  warpgroup_fence_operand(tOrP);
  warpgroup_arrive();
  mma.accumulate_ = fresh ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(tOrP); ++k) {
    gemm(mma, tOrP(_, _, k), tOrV(_, _, k), tOrO);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_wait<0>();
  warpgroup_fence_operand(tOrO);
  warpgroup_fence_operand(tOrP);
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_MAINLOOP_H_
