/*
 * The sm90 mask-exact FP8 attention forward kernel: warp-specialized, two consumer warpgroups
 * whose softmax runs while the other's WGMMAs have the tensor cores.
 *
 * Grid: persistent, one CTA per SM (or per item, if fewer), each walking the work items of
 * tile_scheduler.h: query tiles of (sequence, head)s, causal tiles longest first across all
 * heads, drawn from a global counter as a CTA gets ready for the next. Block: three warpgroups
 * (384 threads).
 *   warpgroup 0, the producer: its first warp draws and publishes the items and issues their
 *     TMA loads and stages the K scales (mainloop.h, Producer) into a kStages ring that runs
 *     on across the CTA's query tiles, K and V with their own full / empty barriers, Q8 once
 *     the last tile's S products are done; its second warp prefetches each tile's Q scales into L2
 *     and zeroes the tail visits' V (zero_v_tail); setmaxnreg gives their registers to the
 *     consumers.
 *   warpgroups 1 and 2, the consumers: 64 query rows each. Visit v of the KV tiles (boundary
 *     tiles first, mainloop.h KVTileRange) runs
 *       wait T(v-1) = P(v-1) . V(v-1) -> O = O * factor(v-1) + T(v-1) in fp32
 *       issue S(v) = Q8 . K8(v)^T into the same registers; wait for it -> scores in log2 units
 *       with the per-key K scale and the per-row Q scale, the element-wise mask on boundary
 *       tiles -> online softmax (softmax.h) -> P(v) into the A operand of its P.V (E4M3 for
 *       an FP8 tile, the input dtype for a boundary tile) -> issue T(v) = P(v) . V(v) into a
 *       fresh accumulator -> factor(v) = alpha(v) * (u / s(v)), u <- s(v) (Note [V scale in
 *       the rescale]), under T(v)
 *     (Note [Two-level P.V accumulation]). The FP8 tiles are visited two at a time,
 *     256 keys (Consumer::run, visit_pair): S of both, one softmax, then T of each in
 *     turn, each added with its own chunk's factor; an odd last FP8 tile is visited alone.
 *     A warpgroup's GEMMs run one at a time, except the two S products of a 256-key visit;
 *     the other warpgroup's softmax fills the tensor cores' gaps. The two take turns at their
 *     loops of exp2 (ExpTurn), which keep the MUFU units busy.
 * Numerics: Note [Mask-exact FP8 scaling], Note [V scale in the rescale] and Note [Two-level
 * P.V accumulation] (exact_fp8/formats.py); docs/attention_kernel_sm90.md.
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
#include "tile_scheduler.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

// Every consumer thread arrives once: the stage's buffer may be refilled. Each thread's arrive
// releases its own earlier shared-memory reads of the stage (the K scales are read just before
// the stage is released, and used after), so that no read depends on another thread's arrive.
CUTLASS_DEVICE void release(uint64_t *bar) { cutlass::arch::ClusterBarrier::arrive(bar); }

// Named barriers of the forward's consumer warpgroups (ids after CUTLASS's reserved ones;
// cutlass::arch::NamedBarrier adds the offset).
enum FwdNamedBarrier : uint32_t {
  kBarExpTurn = 0,  // + warpgroup: the warpgroup may run its exponent loop (256 threads)
};

// The two consumer warpgroups take turns at their exponent loops (docs/attention_kernel_sm90.md,
// One CTA): each waits for its turn before its loop of exp2 and passes it to the other after,
// so that the MUFU units, which the loop keeps busy, serve one warpgroup at a time while the
// other runs the rest of its visit (GEMM waits, scores, the O update). Warpgroup 0 has the
// first turn. Both warpgroups run the same visits, one loop each; the last pass of warpgroup 1
// is skipped, for nobody waits for it. ptxas moves register arithmetic freely across a named
// barrier: the loop is tied to the barriers through the thread's shared-memory slot (wait
// reloads the loop's bias from it after the barrier, pass stores the loop's sums to it before
// the arrive).
struct ExpTurn {
  uint32_t warpgroup;  // 0 or 1
  uint32_t slot;       // the thread's 8-byte shared-memory slot (shared address)
  bool last = false;   // the visit is the query tile's last

  CUTLASS_DEVICE void start() const {
    if (warpgroup == 1) cutlass::arch::NamedBarrier::arrive(kMmaThreads, kBarExpTurn);
  }
  // bias: the loop's exponent bias of the thread's two rows, returned through the slot.
  CUTLASS_DEVICE void wait(float (&bias)[2]) const {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(slot), "f"(bias[0]), "f"(bias[1])
                 : "memory");
    cutlass::arch::NamedBarrier::sync(kMmaThreads, kBarExpTurn + warpgroup);
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(bias[0]), "=f"(bias[1]) : "r"(slot)
                 : "memory");
  }
  // done: a value computed from every exp2 of the loop (its sums).
  CUTLASS_DEVICE void pass(float done) const {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(slot), "f"(done) : "memory");
    if (!(last && warpgroup == 1)) {
      cutlass::arch::NamedBarrier::arrive(kMmaThreads, kBarExpTurn + (warpgroup ^ 1));
    }
  }
};

// One consumer warpgroup's whole share of a query tile: its 64 rows. kFp8VEverywhere: the
// LEAKY mode (boundary tiles keep their element-wise mask but use P in E4M3 and V8^T with its
// chunk scale, which the hidden keys of the tile enter): a lower bound of the time for the
// exactness-cost benchmark and the negative control of the exactness tests; never a product path.
template <class Traits, bool kFp8VEverywhere, class Element>
struct Consumer {
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kStages = Traits::kStages;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  AttentionParams const &p;
  Sequence const &seq;
  typename Traits::SharedStorage &ss;
  int mma_thread;  // 0..255: the thread's index in the tiled MMAs
  int head, q_tile;

  // first: the CTA's visits before this query tile's (its visit i uses the ring's stage
  // (first + i) % kStages, parity ((first + i) / kStages) & 1); q_parity: the parity of this
  // query tile's Q8 on bar_q. The stage and parity stay written out at each use: taken from
  // one helper, ptxas spilled more in the d = 64 pair loop and it ran 0.993-0.998x (H100,
  // 2026-12-06, benchmarks/results/attention_forward_sm90.md).
  CUTLASS_DEVICE void run(KVTileRange const &range, int first, uint32_t q_parity) {
    typename Traits::MmaQK mma_qk;
    typename Traits::MmaPV8 mma_pv8;
    typename Traits::template MmaPV16<Element> mma_pv16;
    auto thr_qk = mma_qk.get_thread_slice(mma_thread);
    auto thr_pv = mma_pv8.get_thread_slice(mma_thread);

    Tensor sQ = make_tensor(make_smem_ptr(ss.q), typename Traits::SmemLayoutRows{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kQTile>, Int<kKVTile>>{});
    // S of a 256-key visit's second tile (visit_pair)
    Tensor tSrS2 = partition_fragment_C(mma_qk, Shape<Int<kQTile>, Int<kKVTile>>{});
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<Int<kQTile>, Int<kKVTile>>{}));
    // O in fp32, never a WGMMA accumulator (Note [Two-level P.V accumulation]); a tile's
    // P.V product T at d = 128 lands in tSrS, the registers of its scores (free once P is in its
    // operand registers), in the accumulator layout of a 64 x d product. At d = 64 T has 32
    // registers of its own: inside tSrS's, ptxas serialized the d = 64 kernels' WGMMAs (C7511)
    // after most changes to the visit's code (docs/attention_kernel_sm90.md, item 10).
    Tensor tOrO = partition_fragment_C(mma_pv8, Shape<Int<kQTile>, Int<kHeadDim>>{});
    Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<Int<kQTile>, Int<kHeadDim>>{}));
    auto make_t = [&] {
      if constexpr (kHeadDim == 128) {
        return make_tensor(tSrS.data(), tOrO.layout());
      } else {
        return partition_fragment_C(mma_pv8, Shape<Int<kQTile>, Int<kHeadDim>>{});
      }
    };
    Tensor tOrT = make_t();
    // P's A operand: the input dtype (bf16 or fp16) for a boundary tile, E4M3 (the first half
    // of the registers) for an FP8 tile.
    Tensor tOrP16 = make_tensor<Element>(
        partition_shape_A(mma_pv16, Shape<Int<kQTile>, Int<kKVTile>>{}));
    Tensor tOrP8 = make_tensor(
        make_rmem_ptr(reinterpret_cast<typename Traits::Fp8 *>(raw_pointer_cast(tOrP16.data()))),
        partition_shape_A(mma_pv8, Shape<Int<kQTile>, Int<kKVTile>>{}));
    // A 256-key visit's second tile's E4M3 P: the second half of the 16-bit P registers.
    Tensor tOrP8b = make_tensor(tOrP8.data() + size(tOrP8), tOrP8.layout());
    static_assert(decltype(size(tSrS))::value == 64 &&
                  decltype(size(tOrO))::value == kHeadDim / 2);
    clear(tOrO);

    const int q0 = q_tile * kQTile;
    ScoreScales scales(p, seq, tScS, head, q0);
    OnlineSoftmax softmax;
    softmax.init();
    float u = 1.0f;  // the unit of tOrO: the V scale of the last FP8 tile (1: unquantized)
    ExpTurn turn{static_cast<uint32_t>(mma_thread / 128),
                 cute::cast_smem_ptr_to_uint(&ss.turn_slot[mma_thread])};

    // S(visit) ready in tSrS (the K stage is released: its K8 was read by the WGMMA, its
    // scales are in registers) -> scores -> online softmax -> P(visit) in tSrS. The tile kind
    // is a compile-time constant: the element-wise mask exists only in the boundary variant.
    auto softmax_step = [&](int visit, auto boundary, ScoreScales::KeyScales const &k_scales,
                            float (&alpha)[2]) {
      constexpr bool kBoundary = decltype(boundary)::value;
      release(&ss.bar_k_empty[(first + visit) % kStages]);
      // the last S product has read Q8: the producer may load the next query tile's
      if (visit + 1 == range.num_tiles()) release(&ss.bar_q_empty);
      scales.apply<kBoundary>(tSrS, tScS, k_scales, range.tile(visit));
      turn.last = visit + 1 == range.num_tiles();
      softmax.template step<!kBoundary>(tSrS, scales.row_scale, alpha, turn);
    };
    // The stage's V scale (1 for a boundary tile), read once its K has arrived.
    auto v_scale = [&](int stage, bool boundary) {
      return boundary && !kFp8VEverywhere ? 1.0f : ss.v_scale[stage];
    };
    // The factor of O before the next tile's product is added: alpha * (u / s_kt), u <- s_kt
    // (Note [V scale in the rescale]), set after the softmax of the tile (1 before the first).
    float factor[2] = {1.0f, 1.0f};
    auto set_factor = [&](int visit, float const (&alpha)[2], float s_kt) {
      const float ratio = visit == 0 ? 1.0f : fminf(u / s_kt, FLT_MAX);  // O is 0 at visit 0
      u = s_kt;
      factor[0] = alpha[0] * ratio;
      factor[1] = alpha[1] * ratio;
    };
    // P(visit) into the A operand, then T = P(visit) . V(visit) issued into tOrT, free now (an
    // E4M3 P and V8^T for an FP8 tile, P and V in the input dtype for a boundary tile).
    auto issue_pv = [&](int visit, auto boundary) {
      const int stage = (first + visit) % kStages;
      Barrier::wait(&ss.bar_v_full[stage], ((first + visit) / kStages) & 1);
      if constexpr (decltype(boundary)::value && !kFp8VEverywhere) {
        p_to_16bit_operand(tSrS, tOrP16);
        issue_pv_gemm<typename Traits::template MmaPV16<Element>,
                      typename Traits::SmemLayoutV16>(
            mma_pv16, reinterpret_cast<Element *>(ss.v[stage]), tOrP16, tOrT, mma_thread);
      } else {
        p_to_fp8_operand(tSrS, tOrP8);
        issue_pv_gemm<typename Traits::MmaPV8, typename Traits::SmemLayoutVt>(
            mma_pv8, reinterpret_cast<typename Traits::Fp8 *>(ss.v[stage]), tOrP8, tOrT,
            mma_thread);
      }
    };
    // Waits for T = P(visit) . V(visit) and adds it to O in fp32: O = O * factor + T
    // (Note [Two-level P.V accumulation]). visit = -1 (before a query tile's first visit, when
    // that is an FP8 visit): tOrT holds zeros, no stage to release.
    auto add_pv = [&](int visit) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrT);
      if (visit >= 0) release(&ss.bar_v_empty[(first + visit) % kStages]);
#pragma unroll
      for (int v = 0; v < size(tOrO); ++v) {
        tOrO(v) = fmaf(tOrO(v), factor[(v >> 1) & 1], tOrT(v));
      }
    };
    // Visit v: O += P.V(v-1) (v >= 1), S(v), its softmax, P(v) . V(v) issued. The visit
    // lambdas are always_inline: called, they put the fragments on a 1.2 KiB stack frame.
    auto visit_step = [&](int visit, auto boundary) __attribute__((always_inline)) {
      const int stage = (first + visit) % kStages;
      Barrier::wait(&ss.bar_k_full[stage], ((first + visit) / kStages) & 1);
      constexpr bool kBoundary = decltype(boundary)::value;
      const float s_kt = v_scale(stage, kBoundary);
      // The K scales: an FP8 visit reads them once S(v) is issued, so that their loads run
      // under S(v) and do not hold the O update and the issue of S(v) back; a boundary visit
      // reads them here (read late there, ptxas serializes the d = 64 kernels' WGMMAs: C7511).
      ScoreScales::KeyScales k_scales;
      if constexpr (kBoundary) ScoreScales::load(k_scales, tScS, ss.k_scale[stage]);
      // FP8 visits add T(v - 1) without a branch: at a branch ptxas waits for the loads in
      // flight (docs/attention_kernel_sm90.md, item 10).
      if (!kBoundary || visit > 0) add_pv(visit - 1);
      issue_scores_gemm<Traits>(mma_qk, tSrQ, ss.k[stage], tSrS, mma_thread);
      if constexpr (!kBoundary) ScoreScales::load(k_scales, tScS, ss.k_scale[stage]);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      float alpha[2];
      softmax_step(visit, boundary, k_scales, alpha);
      issue_pv(visit, boundary);
      // after the issue: the division u / s(v) (its latency and its slow-path branch) runs
      // under T(v) instead of ahead of P's conversion
      set_factor(visit, alpha, s_kt);
    };

    // Visits visit and visit + 1, two FP8 tiles, as one 256-key visit (docs/
    // attention_kernel_sm90.md, item 15): O += P.V(visit - 1); S of both tiles issued back to
    // back; one softmax over their 256 keys (one row maximum, one exponent loop and turn);
    // both P converted to E4M3; then the two P.V products one after the other, each chunk with
    // its own V scale (O = (O * factor_a + T_a) * factor_b + T_b, Note [V scale in the
    // rescale]), T_a added to O before T_b is issued into the same registers: S of 256 keys, O
    // and P leave no room for two products in flight. The tile pairs are fixed by the mask's
    // geometry (KVTileRange), never by a value. Its two P.V issues stay written out: through
    // one helper shared with issue_pv, ptxas scheduled the d = 128 visit otherwise and it ran
    // 0.98-1.00x (H100, 2026-12-06).
    auto visit_pair = [&](int visit) __attribute__((always_inline)) {
      const int stage_a = (first + visit) % kStages, stage_b = (first + visit + 1) % kStages;
      Barrier::wait(&ss.bar_k_full[stage_a], ((first + visit) / kStages) & 1);
      const float s_a = v_scale(stage_a, false);
      add_pv(visit - 1);
      issue_scores_gemm<Traits>(mma_qk, tSrQ, ss.k[stage_a], tSrS, mma_thread);
      Barrier::wait(&ss.bar_k_full[stage_b], ((first + visit + 1) / kStages) & 1);
      const float s_b = v_scale(stage_b, false);
      issue_scores_gemm<Traits>(mma_qk, tSrQ, ss.k[stage_b], tSrS2, mma_thread);
      // The first tile's K scales are applied while the second tile's S is computed (taking
      // its scores' top bit patterns there too measured slower, 2026-12-06).
      warpgroup_wait<1>();
      warpgroup_fence_operand(tSrS);
      ScoreScales::apply_fp8(tSrS, tScS, ss.k_scale[stage_a]);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS2);
      ScoreScales::apply_fp8(tSrS2, tScS, ss.k_scale[stage_b]);
      release(&ss.bar_k_empty[stage_a]);
      release(&ss.bar_k_empty[stage_b]);
      const bool last = visit + 2 == range.num_tiles();
      if (last) release(&ss.bar_q_empty);
      turn.last = last;
      float alpha[2];
      FragPair<decltype(tSrS), decltype(tSrS2)> s_pair{tSrS, tSrS2};
      softmax.template step<true>(s_pair, scales.row_scale, alpha, turn);
      p_to_fp8_operand(tSrS, tOrP8);
      p_to_fp8_operand(tSrS2, tOrP8b);
      Barrier::wait(&ss.bar_v_full[stage_a], ((first + visit) / kStages) & 1);
      issue_pv_gemm<typename Traits::MmaPV8, typename Traits::SmemLayoutVt>(
          mma_pv8, reinterpret_cast<typename Traits::Fp8 *>(ss.v[stage_a]), tOrP8, tOrT,
          mma_thread);
      set_factor(visit, alpha, s_a);
      add_pv(visit);
      Barrier::wait(&ss.bar_v_full[stage_b], ((first + visit + 1) / kStages) & 1);
      issue_pv_gemm<typename Traits::MmaPV8, typename Traits::SmemLayoutVt>(
          mma_pv8, reinterpret_cast<typename Traits::Fp8 *>(ss.v[stage_b]), tOrP8b, tOrT,
          mma_thread);
      const float one[2] = {1.0f, 1.0f};
      set_factor(visit + 1, one, s_b);
    };

    if (q_tile == 0) store_rows_past_grid<kHeadDim>(p, seq, head, mma_thread);  // thd padding
    const int num_tiles = range.num_tiles();
    if (num_tiles == 0) {  // no real row sees a key: zeros and -inf
      store_output<kHeadDim, Element>(p, seq, softmax, u, tOrO, tOcO, head, q0,
                                      ss.o_rows[mma_thread / 32]);
      return;
    }
    Barrier::wait(&ss.bar_q, q_parity);
    turn.start();

    // Boundary tiles are visited first (KVTileRange), then the FP8 tiles.
    const int num_boundary = range.num_boundary();
    if (num_boundary == 0) clear(tOrT);  // T(-1) = 0: the first FP8 visit's add_pv(-1)
    for (int visit = 0; visit < num_boundary; ++visit) visit_step(visit, cute::true_type{});
    // The FP8 tiles two at a time (256-key visits). The odd last FP8 tile's visit sits in a
    // loop: under an if, ptxas serialized every WGMMA (C7514).
    int visit = num_boundary;
    for (; visit + 1 < num_tiles; visit += 2) visit_pair(visit);
    for (; visit < num_tiles; ++visit) visit_step(visit, cute::false_type{});
    add_pv(num_tiles - 1);
    store_output<kHeadDim, Element>(p, seq, softmax, u, tOrO, tOcO, head, q0,
                                      ss.o_rows[mma_thread / 32]);
  }
};

// The query tile's Q scales ([h, t_q] fp32: 128 rows, at most five 128-byte lines) into L2,
// lanes 0-4 a line each: the consumers read them at the tile's start (ScoreScales), where, with
// Q8 and the first K8 loaded ahead, a load from memory would be waited for. (The tail warp
// issues them: the producer's 40 registers leave no room.)
CUTLASS_DEVICE void prefetch_q_scales(AttentionParams const &p, Sequence const &seq,
                                      TileCoord const &c, int lane) {
  const int row = min(c.q_tile * kQTile + 32 * lane, c.q_tile * kQTile + kQTile - 1);
  if (lane > kQTile / 32 || row >= seq.len_q) return;  // only real rows' scales are read
  const float *at = p.q_scale + static_cast<int64_t>(c.head) * p.tokens_q + seq.tok_q + row;
  asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
}

// The producer warp's walk: draws the items (tile_scheduler.h), publishes them (and -1 at the
// end) and issues the loads of each.
template <class Traits, bool kFp8VEverywhere>
CUTLASS_DEVICE void produce(KernelParams<Traits> const &kp, typename Traits::SharedStorage &ss,
                            TileRing ring) {
  AttentionParams const &p = kp.p;
  const int lane = threadIdx.x & 31;
  TileEntry e{0, 0, 0u, 0};  // first: the CTA's visits so far; q_parity: its Q8 loads' parity
  for (;;) {
    int item = lane == 0 ? draw_item(kp.counter_slot, kp.total_items) : 0;
    item = __shfl_sync(0xffffffff, item, 0);
    e.item = item < kp.total_items ? item : -1;
    if (lane == 0) ring.publish(e);
    if (e.item < 0) return;
    Sequence seq;
    const TileCoord c = TileCoord::decode(p, item, seq);
    if (c.q_tile < 0) continue;
    const KVTileRange range = kv_tile_range(p, seq, c.q_tile);
    if (range.num_tiles() == 0) continue;  // the consumers write the rows' zeros without Q8
    // The visit whose V the tail warp zeroes past len_kv (the leaky variant reads V8^T only and
    // runs dense samples only)
    const int tail = kFp8VEverywhere ? -1 : tail_visit(p, seq, range);
    const int kv_head = c.head / (p.heads / p.heads_kv);
    Producer<Traits> producer{kp, ss, seq, c.batch, kv_head, p.cu_vt[c.batch]};
    producer.template run<kFp8VEverywhere>(c.head, c.q_tile, range, tail, e);
    e.first += range.num_tiles();
    e.q_parity ^= 1u;
  }
}

// The tail warp's walk: prefetches each item's Q scales (prefetch_q_scales) as soon as it is
// published, and zeroes the V of its tail visit past len_kv (zero_v_tail).
template <class Traits, bool kFp8VEverywhere>
CUTLASS_DEVICE void zero_tails(AttentionParams const &p, typename Traits::SharedStorage &ss,
                               TileRing ring) {
  constexpr int kStages = Traits::kStages;
  const int lane = threadIdx.x & 31;
  uint32_t parity = 0;  // bit s: the parity of stage s's next wait on its bar_v_tail
  for_each_tile(ring, p, [&](TileEntry const &e, Sequence const &seq, TileCoord const &c) {
    prefetch_q_scales(p, seq, c, lane);
    if (kFp8VEverywhere) return;  // no tail visits (dense samples, V8^T only)
    const int tail = tail_visit(p, seq, kv_tile_range(p, seq, c.q_tile));
    if (tail >= 0) {
      const int stage = (e.first + tail) % kStages;
      zero_v_tail<Traits>(ss, stage, (parity >> stage) & 1u, seq.len_kv % kKVTile);
      parity ^= 1u << stage;
    }
  });
}

// The consumer warpgroups' walk: each item's query tile (Consumer::run) and its output.
template <class Traits, bool kFp8VEverywhere, class Element>
CUTLASS_DEVICE void consume(AttentionParams const &p, typename Traits::SharedStorage &ss,
                            TileRing ring) {
  for_each_tile(ring, p, [&](TileEntry const &e, Sequence const &seq, TileCoord const &c)
                             __attribute__((always_inline)) {
    Consumer<Traits, kFp8VEverywhere, Element> consumer{
        p, seq, ss, static_cast<int>(thread_index_per_tile()) - 128, c.head, c.q_tile};
    consumer.run(kv_tile_range(p, seq, c.q_tile), e.first, e.q_parity);
  });
}

// Traits: KernelTraits<d>; Element: the dtype of V (boundary tiles) and O, bf16 or fp16
// (ElementTypes::Bf16, ::Fp16). A persistent grid: at most one CTA per SM, each walking items
// of the tile scheduler until none is left.
template <class Traits, bool kFp8VEverywhere, class Element>
__global__ void __launch_bounds__(kThreads, 1)
    attention_fwd_kernel(CUTE_GRID_CONSTANT KernelParams<Traits> const kp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  // SW128 tiles need 1024-byte aligned buffers: the launch adds 1024 bytes for this.
  extern __shared__ __align__(1024) char smem_raw[];
  char *smem = smem_raw + (1024 - reinterpret_cast<uintptr_t>(smem_raw) % 1024) % 1024;
  auto &ss = *reinterpret_cast<typename Traits::SharedStorage *>(smem);
  const int warpgroup = threadIdx.x / 128;
  TileRing ring{ss.tiles};

  if (threadIdx.x == 0) {
    Barrier::init(&ss.bar_q, 1);
    Barrier::init(&ss.bar_q_empty, kConsumerArrivals);
#pragma unroll
    for (int s = 0; s < Traits::kStages; ++s) {
      Barrier::init(&ss.bar_k_full[s], kKFullArrivals);
      Barrier::init(&ss.bar_v_full[s], 1);
      Barrier::init(&ss.bar_k_empty[s], kConsumerArrivals);
      Barrier::init(&ss.bar_v_empty[s], kConsumerArrivals);
      Barrier::init(&ss.bar_v_tail[s], 1);
    }
    ring.init();
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x < 32) {
      produce<Traits, kFp8VEverywhere>(kp, ss, ring);
    } else if (threadIdx.x < 64) {
      zero_tails<Traits, kFp8VEverywhere>(kp.p, ss, ring);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    consume<Traits, kFp8VEverywhere, Element>(kp.p, ss, ring);
  }
#endif
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_KERNEL_H_
