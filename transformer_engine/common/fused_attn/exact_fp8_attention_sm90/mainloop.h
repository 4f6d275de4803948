/*
 * Mainloop pieces of the sm90 mask-exact FP8 attention forward: which KV tiles a query tile
 * visits, the producer's TMA loads of the KV ring, and the WGMMA issues of the consumers.
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

// Causal masks (row i sees keys j <= i + causal_offset): the tile's last real row sees keys up to
// q_last + offset; a KV tile is FP8 when its last key is seen by the tile's first row q0, that is
// for the first (q0 + offset + 1) / 128 tiles (masks.fp8_tile_map's rule; tests/build checks it).
CUTLASS_HOST_DEVICE KVTileRange kv_tile_range(AttentionParams const &p, int q_tile) {
  const int q0 = q_tile * kQTile;
  const int q_last = min(q0 + kQTile, p.seqlen_q) - 1;  // last real row
  const int off = p.causal_offset;
  const int kv_end = p.causal ? max(min(q_last + off + 1, p.seqlen_kv), 0) : p.seqlen_kv;
  KVTileRange r;
  r.num_tiles = kv_end > 0 ? (kv_end + kKVTile - 1) / kKVTile : 0;
  const int complete = p.seqlen_kv / kKVTile;
  const int seen_whole = p.causal ? max(q0 + off + 1, 0) / kKVTile : complete;
  r.num_fp8 = min(min(seen_whole, complete), r.num_tiles);
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
  // V [b, s_kv, h_kv, d] bf16 or fp16 as (d, s_kv, h_kv, b): MN-major B operand of P.V; the
  // descriptor is typed bf16, and the TMA copies 16-bit words as they are (fp16 V too)
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

// The producer: the first warp of the producer warpgroup. Its lane 0 issues every TMA load of
// the CTA; its 32 lanes copy each K tile's 128 K scales (0 past s_kv) and the tile's V chunk
// scale into shared memory and arrive on the tile's K barrier. Visit i of the KV tiles uses
// stage i % kStages; the stage is refilled once all consumer threads released it (empty
// barriers), K and V separately.
struct Producer {
  using Traits = KernelTraits;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  KernelParams const &kp;
  typename Traits::SharedStorage &ss;
  int batch;
  int kv_head;
  int vt_col0;  // V8^T column of the sample's first key (cu_vt[b])

  // kFp8VEverywhere: the LEAKY benchmark / negative-control mode (V8^T and its chunk scale for
  // the boundary tiles too, see kernel.h); false: the mask-exact rules.
  template <bool kFp8VEverywhere>
  CUTLASS_DEVICE void run(int head, int q_tile, KVTileRange const &range) {
    const int lane = threadIdx.x & 31;
    const int64_t t_kv = static_cast<int64_t>(kp.p.batch) * kp.p.seqlen_kv;
    // [s_kv] fp32: the K scales of the sample and kv-head
    const float *k_scale = kp.p.k_scale + kv_head * t_kv + static_cast<int64_t>(batch) *
                                                               kp.p.seqlen_kv;
    if (lane == 0) load_q(head, q_tile);
    // [num_chunks of the sample] fp32: the V scales of the sample and kv-head
    const float *v_scale =
        kp.p.v_scale + static_cast<int64_t>(kv_head) * kp.p.num_chunks + kp.p.cu_chunks[batch];
    // The K and V scales are loaded one visit ahead: their latency overlaps the ring's waits.
    float4 scales = range.num_tiles > 0 ? load_k_scales(k_scale, range.tile(0), lane) : float4{};
    float chunk_scale = range.num_tiles > 0 ? v_scale[range.tile(0)] : 1.0f;
    for (int visit = 0; visit < range.num_tiles; ++visit) {
      const int kt = range.tile(visit);
      const int stage = visit % kStages;
      const int round = visit / kStages;  // the stage's use count before this one
      if (round > 0) Barrier::wait(&ss.bar_k_empty[stage], (round - 1) & 1);
      if (lane == 0) load_k(stage, kt);
      *reinterpret_cast<float4 *>(&ss.k_scale[stage][4 * lane]) = scales;
      const bool fp8_v = kFp8VEverywhere || kt < range.num_fp8;
      if (lane == 0) ss.v_scale[stage] = fp8_v ? chunk_scale : 1.0f;
      cutlass::arch::ClusterBarrier::arrive(&ss.bar_k_full[stage]);  // release: the stores above
      if (visit + 1 < range.num_tiles) {
        scales = load_k_scales(k_scale, range.tile(visit + 1), lane);
        chunk_scale = v_scale[range.tile(visit + 1)];  // read, used only for an FP8 tile
      }
      if (round > 0) Barrier::wait(&ss.bar_v_empty[stage], (round - 1) & 1);
      if (lane == 0) load_v(stage, kt, fp8_v);
    }
  }

  // The K scales of keys 4 lane .. 4 lane + 3 of KV tile kt (0 past s_kv).
  CUTLASS_DEVICE float4 load_k_scales(const float *k_scale, int kt, int lane) const {
    const int key0 = kt * kKVTile + 4 * lane;
    float ks[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ks[i] = key0 + i < kp.p.seqlen_kv ? k_scale[key0 + i] : 0.0f;
    return float4{ks[0], ks[1], ks[2], ks[3]};
  }

  CUTLASS_DEVICE void load_q(int head, int q_tile) {
    Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(kp.t_q, int32_t(kHeadDim), kp.p.heads));
    Tensor gQ = local_tile(domain_offset(make_coord(batch * kp.p.seqlen_q, 0), mQ(_, _, head)),
                           Shape<Int<kQTile>, Int<kHeadDim>>{}, make_coord(q_tile, 0));
    Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutFp8{});
    auto [tQg, tQs] = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(gQ));
    Barrier::arrive_and_expect_tx(&ss.bar_q, Traits::kFp8TileBytes);
    copy(kp.tma_q.with(ss.bar_q), tQg, tQs);
  }

  // K8 of KV tile kt into `stage`.
  CUTLASS_DEVICE void load_k(int stage, int kt) {
    uint64_t &bar = ss.bar_k_full[stage];
    Barrier::arrive_and_expect_tx(&bar, Traits::kFp8TileBytes);
    Tensor mK = kp.tma_k.get_tma_tensor(make_shape(kp.t_kv, int32_t(kHeadDim), kp.p.heads_kv));
    Tensor gK = local_tile(domain_offset(make_coord(batch * kp.p.seqlen_kv, 0), mK(_, _, kv_head)),
                           Shape<Int<kKVTile>, Int<kHeadDim>>{}, make_coord(kt, 0));
    Tensor sK = make_tensor(make_smem_ptr(ss.k[stage]), typename Traits::SmemLayoutFp8{});
    auto [tKg, tKs] = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
    copy(kp.tma_k.with(bar), tKg, tKs);
  }

  // V of KV tile kt into `stage`: V8^T for an FP8 tile, the unquantized V for a boundary tile.
  CUTLASS_DEVICE void load_v(int stage, int kt, bool fp8_v) {
    uint64_t &bar = ss.bar_v_full[stage];
    Barrier::arrive_and_expect_tx(&bar, fp8_v ? Traits::kFp8TileBytes : Traits::kV16TileBytes);
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

// Issues S = Q8 . K8^T of one KV tile into the 64 x 128 fp32 fragment tSrS (zeroed first) as
// one WGMMA batch; the caller waits for it (warpgroup_wait).
template <class FragQ, class FragS>
CUTLASS_DEVICE void issue_scores_gemm(typename KernelTraits::MmaQK &mma, FragQ const &tSrQ,
                                      KernelTraits::Fp8 *smem_k, FragS &tSrS, int mma_thread) {
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename KernelTraits::SmemLayoutFp8{});
  Tensor tSrK = mma.get_thread_slice(mma_thread).partition_fragment_B(sK);
  warpgroup_fence_operand(tSrS);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int k = 0; k < size<2>(tSrQ); ++k) {
    gemm(mma, tSrQ(_, _, k), tSrK(_, _, k), tSrS);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tSrS);
}

// Issues tOrT = P . V of one KV tile (P from registers; tOrT overwritten: the product starts
// from zero, Note [Two-level P.V accumulation]) as one WGMMA batch; the caller waits.
// Mma: MmaPV8 with V8^T, or MmaPV16 with V (same accumulator layout).
template <class Mma, class Layout_, class FragP, class FragT, class Element>
CUTLASS_DEVICE void issue_pv_gemm(Mma &mma, Element *smem_v, FragP &tOrP, FragT &tOrT,
                                  int mma_thread) {
  Tensor sV = make_tensor(make_smem_ptr(smem_v), Layout_{});
  Tensor tOrV = mma.get_thread_slice(mma_thread).partition_fragment_B(sV);
  warpgroup_fence_operand(tOrT);
  warpgroup_fence_operand(tOrP);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int k = 0; k < size<2>(tOrP); ++k) {
    gemm(mma, tOrP(_, _, k), tOrV(_, _, k), tOrT);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tOrT);
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_MAINLOOP_H_
