/*
 * Mainloop pieces of the sm90 mask-exact FP8 attention forward: which KV tiles a query tile
 * visits, the producer's TMA loads of the KV ring, and the WGMMA issues of the consumers.
 *
 * Which KV tiles a query tile visits, and which of them use FP8 V (Note [Mask-exact FP8
 * scaling], masks.fp8_tile_map; the Triton kernel's kv_tile_ranges): the tiles some real row of
 * the query tile sees, [kv_lo, kv_hi), and among them the FP8 tiles [fp8_lo, fp8_hi): complete
 * tiles whose every key every real row of the query tile sees. The others are boundary tiles:
 * right ones [fp8_hi, kv_hi) (the causal diagonal, the sequence's incomplete last tile) and left
 * ones [kv_lo, fp8_lo) (a sliding window's edge). A boundary tile uses Q8 . K8^T for its scores
 * (per-token Q and K scales never leak) and the unquantized V (a 16-bit P . V WGMMA) under the
 * element-wise mask.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_MAINLOOP_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_MAINLOOP_H_

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "kernel_traits.h"
#include "params.h"
#include "tile_scheduler.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// The KV tiles of one query tile, visited right boundary tiles first (the running max then sees
// the row's nearest keys first, and their loads are not left exposed at the end), then the left
// boundary tiles, then the FP8 tiles in order, as the Triton kernel visits them.
struct KVTileRange {
  int kv_lo, fp8_lo, fp8_hi, kv_hi;  // kv_lo <= fp8_lo <= fp8_hi <= kv_hi

  CUTLASS_HOST_DEVICE int num_tiles() const { return kv_hi - kv_lo; }
  CUTLASS_HOST_DEVICE int num_boundary() const { return num_tiles() - (fp8_hi - fp8_lo); }
  CUTLASS_HOST_DEVICE bool is_fp8(int kt) const { return fp8_lo <= kt && kt < fp8_hi; }

  // The KV tile of visit i (0 <= i < num_tiles()).
  CUTLASS_HOST_DEVICE int tile(int i) const {
    const int right = kv_hi - fp8_hi, left = fp8_lo - kv_lo;
    if (i < right) return fp8_hi + i;
    return i < right + left ? kv_lo + (i - right) : fp8_lo + (i - right - left);
  }
  // The visit of KV tile kt (kv_lo <= kt < kv_hi): tile()'s inverse.
  CUTLASS_HOST_DEVICE int visit(int kt) const {
    const int right = kv_hi - fp8_hi, left = fp8_lo - kv_lo;
    if (kt >= fp8_hi) return kt - fp8_hi;
    return kt < fp8_lo ? right + (kt - kv_lo) : right + left + (kt - fp8_lo);
  }
};

CUTLASS_HOST_DEVICE int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// masks.fp8_tile_map's rule for query tile q_tile of sequence s (the Triton kernel's
// kv_tile_ranges; tests/build checks it by brute force). In int64: the window sides may be
// kUnbounded. The real rows [q0, q_last] see the columns [col_lo, col_hi) between them
// (contiguous: a window moves with the row); a complete tile is FP8 when the last real row sees
// its first key and the first row its last key (then every row sees all of it).
CUTLASS_HOST_DEVICE KVTileRange kv_tile_range(AttentionParams const &p, Sequence const &s,
                                              int q_tile) {
  const int64_t q0 = static_cast<int64_t>(q_tile) * kQTile;
  const int64_t q_last = min(q0 + kQTile, static_cast<int64_t>(s.len_q)) - 1;  // last real row
  const int64_t left = p.window_left, right = p.window_right;
  const int64_t col_lo = max(q0 + s.diag - left, int64_t(0));
  const int64_t col_hi = min(q_last + s.diag + right + 1, static_cast<int64_t>(s.len_kv));
  KVTileRange r;
  r.kv_lo = static_cast<int>(col_lo / kKVTile);
  const bool some = q_last >= q0 && col_hi > col_lo;
  r.kv_hi = some ? static_cast<int>((col_hi + kKVTile - 1) / kKVTile) : r.kv_lo;
  const int64_t fp8_lo = (max(q_last + s.diag - left, int64_t(0)) + kKVTile - 1) / kKVTile;
  const int64_t fp8_hi = min(static_cast<int64_t>(s.len_kv / kKVTile),
                             max(q0 + s.diag + right + 1, int64_t(0)) / kKVTile);
  r.fp8_lo = static_cast<int>(clamp64(fp8_lo, r.kv_lo, r.kv_hi));
  r.fp8_hi = static_cast<int>(clamp64(fp8_hi, r.fp8_lo, r.kv_hi));
  return r;
}

// The visit whose V tile is to be zeroed past the sequence's last key, or -1: the incomplete last
// tile (len_kv % 128 != 0) when the memory past len_kv holds other tokens (p.zero_v_tail: a
// padding mask or thd; dense samples end at the tensor map's bound, where TMA fills zeros). Its
// P is 0 at those keys, but 0 times an Inf or NaN there would be NaN. It is always a boundary
// tile (never complete).
CUTLASS_HOST_DEVICE int tail_visit(AttentionParams const &p, Sequence const &s,
                                   KVTileRange const &r) {
  const int kt = s.len_kv / kKVTile;
  const bool tail = p.zero_v_tail && s.len_kv % kKVTile != 0 && r.kv_lo <= kt && kt < r.kv_hi;
  return tail ? r.visit(kt) : -1;
}

// Global tensors of the TMA loads (cute's (rows, contiguous, batch...) mode order), for the
// tiles of Traits (KernelTraits<d>).
template <class Traits>
struct GmemLayouts {
  using Fp8 = typename Traits::Fp8;
  using Bf16 = typename Traits::Bf16;
  // [h, t_q, d] E4M3 as (t_q, d, h); [h_kv, t_kv, d] as (t_kv, d, h_kv)
  using ShapeRows = Shape<int32_t, int32_t, int32_t>;
  using StrideRows = Stride<int64_t, _1, int64_t>;
  // V8^T [h_kv, d, vt_width] E4M3 as (d, vt_width, h_kv): K-major B operand of P.V
  using StrideVt = Stride<int64_t, _1, int64_t>;
  // V [b, s_kv, h_kv, d] bf16 or fp16 as (d, s_kv, h_kv, b): MN-major B operand of P.V; the
  // descriptor is typed bf16, and the TMA copies 16-bit words as they are (fp16 V too)
  using ShapeV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideV = Stride<_1, int64_t, int64_t, int64_t>;

  using TmaRows = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Fp8 const *>(nullptr)), ShapeRows{}, StrideRows{}),
      typename Traits::SmemLayoutRows{}));
  using TmaVt = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Fp8 const *>(nullptr)), ShapeRows{}, StrideVt{}),
      typename Traits::SmemLayoutVt{}));
  using TmaV16 = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<Bf16 const *>(nullptr)), ShapeV{}, StrideV{}),
      typename Traits::SmemLayoutV16{}));
};

// Everything the kernel reads: the plain parameters and the four TMA descriptors.
template <class Traits>
struct KernelParams {
  using G = GmemLayouts<Traits>;
  AttentionParams p;
  typename G::TmaRows tma_q;  // Q8 tiles [128 rows, d]
  typename G::TmaRows tma_k;  // K8 tiles [128 keys, d]
  typename G::TmaVt tma_vt;   // V8^T tiles [d, 128 keys]
  typename G::TmaV16 tma_v;   // V tiles [d, 128 keys] (boundary tiles)
  int32_t v_rows;              // V's rows per sample in the tensor map (thd: the pack's tokens)
  int32_t v_samples;           // its samples (thd: 1)
  int32_t vt_width;            // columns of V8^T
  int32_t total_items;         // work items of the tile scheduler: b * h * num_q_tiles
  int32_t counter_slot;        // its counter (tile_scheduler.h tile_counters)
};

// The producer: the first warp of the producer warpgroup. Its lane 0 issues every TMA load of
// the CTA; its 32 lanes copy each K tile's 128 K scales (0 past len_kv) and the tile's V chunk
// scale into shared memory and arrive on the tile's K barrier. The ring runs on across the
// CTA's query tiles: the CTA's g-th visit uses stage g % kStages; the stage is refilled once all
// consumer threads released it (empty barriers), K and V separately. The V tile of visit tail
// (tail_visit) lands on the stage's bar_v_tail instead of its bar_v_full: the second producer
// warp zeroes its keys past len_kv (zero_v_tail) and then completes bar_v_full.
template <class Traits>
struct Producer {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kStages = Traits::kStages;
  KernelParams<Traits> const &kp;
  typename Traits::SharedStorage &ss;
  Sequence const &seq;
  int batch;
  int kv_head;
  int vt_col0;  // V8^T column of the sequence's first key (cu_vt[n])

  // kFp8VEverywhere: the LEAKY benchmark / negative-control mode (V8^T and its chunk scale for
  // the boundary tiles too, see kernel.h); false: the mask-exact rules. at: where the CTA's
  // rings stand (the query tile's visit i uses stage (at.first + i) % kStages; a Q8 load after
  // the CTA's first waits for the consumers to release the last); range has tiles.
  template <bool kFp8VEverywhere>
  CUTLASS_DEVICE void run(int head, int q_tile, KVTileRange const &range, int tail,
                          TileEntry const &at) {
    const int lane = thread_index_per_tile() & 31;
    const int num_tiles = range.num_tiles();
    const int first = at.first;
    // [len_kv] fp32: the K scales of the sequence and kv-head
    const float *k_scale =
        kp.p.k_scale + static_cast<int64_t>(kv_head) * kp.p.tokens_kv + seq.tok_kv;
    // [num_chunks of the sequence] fp32: the V scales of the sequence and kv-head
    const float *v_scale =
        kp.p.v_scale + static_cast<int64_t>(kv_head) * kp.p.num_chunks + kp.p.cu_chunks[batch];
    // The K and V scales are loaded one visit ahead: their latency overlaps the ring's waits.
    float4 scales = load_k_scales(k_scale, range.tile(0), lane);
    float chunk_scale = v_scale[range.tile(0)];
    for (int visit = 0; visit < num_tiles; ++visit) {
      const int kt = range.tile(visit);
      const int stage = (first + visit) % kStages;
      const int round = (first + visit) / kStages;  // the stage's use count before this one
      if (round > 0) Barrier::wait(&ss.bar_k_empty[stage], (round - 1) & 1);
      if (lane == 0) load_k(stage, kt);
      if (visit == 0 && lane == 0) {  // Q8 once the last query tile's S products are done
        if (first > 0) Barrier::wait(&ss.bar_q_empty, at.q_parity ^ 1u);
        load_q(head, q_tile);
      }
      // keys 4 lane + {0, 1} and 4 lane + {2, 3}: two pairs of adjacent slots
      *reinterpret_cast<float2 *>(&ss.k_scale[stage][k_scale_slot(4 * lane)]) =
          make_float2(scales.x, scales.y);
      *reinterpret_cast<float2 *>(&ss.k_scale[stage][k_scale_slot(4 * lane + 2)]) =
          make_float2(scales.z, scales.w);
      const bool fp8_v = kFp8VEverywhere || range.is_fp8(kt);
      if (lane == 0) ss.v_scale[stage] = fp8_v ? chunk_scale : 1.0f;
      cutlass::arch::ClusterBarrier::arrive(&ss.bar_k_full[stage]);  // release: the stores above
      if (visit + 1 < num_tiles) {
        scales = load_k_scales(k_scale, range.tile(visit + 1), lane);
        chunk_scale = v_scale[range.tile(visit + 1)];  // read, used only for an FP8 tile
      }
      if (round > 0) Barrier::wait(&ss.bar_v_empty[stage], (round - 1) & 1);
      uint64_t *v_bar = visit == tail ? &ss.bar_v_tail[stage] : &ss.bar_v_full[stage];
      if (lane == 0) load_v(stage, kt, fp8_v, v_bar);
    }
  }

  // The K scales of keys 4 lane .. 4 lane + 3 of KV tile kt (0 past len_kv).
  CUTLASS_DEVICE float4 load_k_scales(const float *k_scale, int kt, int lane) const {
    const int key0 = kt * kKVTile + 4 * lane;
    float ks[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ks[i] = key0 + i < seq.len_kv ? k_scale[key0 + i] : 0.0f;
    return float4{ks[0], ks[1], ks[2], ks[3]};
  }

  CUTLASS_DEVICE void load_q(int head, int q_tile) {
    Tensor mQ = kp.tma_q.get_tma_tensor(make_shape(kp.p.tokens_q, int32_t(kHeadDim), kp.p.heads));
    Tensor gQ = local_tile(domain_offset(make_coord(seq.tok_q, 0), mQ(_, _, head)),
                           Shape<Int<kQTile>, Int<kHeadDim>>{}, make_coord(q_tile, 0));
    Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutRows{});
    auto [tQg, tQs] = tma_partition(kp.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                    group_modes<0, 2>(gQ));
    Barrier::arrive_and_expect_tx(&ss.bar_q, Traits::kFp8TileBytes);
    copy(kp.tma_q.with(ss.bar_q), tQg, tQs);
  }

  // K8 of KV tile kt into `stage` (rows past the sequence: other tokens' or the map's zeros,
  // masked by the boundary tile's element-wise mask).
  CUTLASS_DEVICE void load_k(int stage, int kt) {
    uint64_t &bar = ss.bar_k_full[stage];
    Barrier::arrive_and_expect_tx(&bar, Traits::kFp8TileBytes);
    Tensor mK =
        kp.tma_k.get_tma_tensor(make_shape(kp.p.tokens_kv, int32_t(kHeadDim), kp.p.heads_kv));
    Tensor gK = local_tile(domain_offset(make_coord(seq.tok_kv, 0), mK(_, _, kv_head)),
                           Shape<Int<kKVTile>, Int<kHeadDim>>{}, make_coord(kt, 0));
    Tensor sK = make_tensor(make_smem_ptr(ss.k[stage]), typename Traits::SmemLayoutRows{});
    auto [tKg, tKs] = tma_partition(kp.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                    group_modes<0, 2>(gK));
    copy(kp.tma_k.with(bar), tKg, tKs);
  }

  // V of KV tile kt into `stage`: V8^T for an FP8 tile, the unquantized V for a boundary tile;
  // its transaction bytes complete `bar` (the stage's bar_v_full, or bar_v_tail).
  CUTLASS_DEVICE void load_v(int stage, int kt, bool fp8_v, uint64_t *bar) {
    Barrier::arrive_and_expect_tx(bar, fp8_v ? Traits::kFp8TileBytes : Traits::kV16TileBytes);
    if (fp8_v) {
      Tensor mVt =
          kp.tma_vt.get_tma_tensor(make_shape(int32_t(kHeadDim), kp.vt_width, kp.p.heads_kv));
      Tensor gVt = local_tile(domain_offset(make_coord(0, vt_col0), mVt(_, _, kv_head)),
                              Shape<Int<kHeadDim>, Int<kKVTile>>{}, make_coord(0, kt));
      Tensor sVt = make_tensor(make_smem_ptr(reinterpret_cast<typename Traits::Fp8 *>(ss.v[stage])),
                               typename Traits::SmemLayoutVt{});
      auto [tVg, tVs] = tma_partition(kp.tma_vt, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sVt),
                                      group_modes<0, 2>(gVt));
      copy(kp.tma_vt.with(*bar), tVg, tVs);
    } else {
      Tensor mV = kp.tma_v.get_tma_tensor(
          make_shape(int32_t(kHeadDim), kp.v_rows, kp.p.heads_kv, kp.v_samples));
      Tensor gV =
          local_tile(domain_offset(make_coord(0, seq.v_row0), mV(_, _, kv_head, seq.v_batch)),
                     Shape<Int<kHeadDim>, Int<kKVTile>>{}, make_coord(0, kt));
      Tensor sV = make_tensor(
          make_smem_ptr(reinterpret_cast<typename Traits::Bf16 *>(ss.v[stage])),
          typename Traits::SmemLayoutV16{});
      auto [tVg, tVs] = tma_partition(kp.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(gV));
      copy(kp.tma_v.with(*bar), tVg, tVs);  // keys past the map's rows arrive as 0 (TMA bounds)
    }
  }
};

// The second warp of the producer warpgroup, for a tail visit (tail_visit) in `stage`: once that
// V tile has landed (the stage's bar_v_tail, whose parity the caller tracks), it zeroes the
// tile's keys from first_key on and completes the stage's bar_v_full. SmemLayoutV16 holds each
// (key, 64-d half) in one 128-byte row of an SW128 atom, whose swizzle permutes 16-byte chunks
// inside the row only (tests/build checks this against cute), so the rows are zeroed whole,
// chunk order aside.
template <class Traits>
CUTLASS_DEVICE void zero_v_tail(typename Traits::SharedStorage &ss, int stage, uint32_t parity,
                                int first_key) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int kHalves = Traits::kHeadDim / 64;  // 128-byte rows of a key
  const int lane = threadIdx.x & 31;
  Barrier::wait(&ss.bar_v_tail[stage], parity);
  uint8_t *v = ss.v[stage];
  const int chunks = (kKVTile - first_key) * kHalves * 8;  // 16-byte chunks: (key, half, chunk)
  for (int c = lane; c < chunks; c += 32) {
    const int key = first_key + c / (8 * kHalves), half = (c >> 3) % kHalves;
    *reinterpret_cast<uint4 *>(v + Traits::v16_row_bytes(key, half) + 16 * (c & 7)) =
        uint4{0, 0, 0, 0};
  }
  cutlass::arch::fence_view_async_shared();  // the zeros, before the WGMMAs (async proxy) read
  __syncwarp();
  if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&ss.bar_v_full[stage]);
}

// Issues S = Q8 . K8^T of one KV tile into the 64 x 128 fp32 fragment tSrS (zeroed first) as
// one WGMMA batch; the caller waits for it (warpgroup_wait).
template <class Traits, class FragQ, class FragS>
CUTLASS_DEVICE void issue_scores_gemm(typename Traits::MmaQK &mma, FragQ const &tSrQ,
                                      typename Traits::Fp8 *smem_k, FragS &tSrS, int mma_thread) {
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutRows{});
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
