/*
 * Tiles, shared-memory layouts and tiled MMAs of the sm90 mask-exact FP8 attention backward
 * (docs/backward.md, "The sm90 CUDA backward"). One kernel (backward_kernel.h): a CTA per
 * (sample, kv-head, 128 keys), three warpgroups (384 threads):
 *
 *   warpgroup 0, the producer (setmaxnreg gives its registers away): warp 0 issues the TMA
 *     loads, warp 1 adds each step's dQ to the dQ accumulator in the fixed order of
 *     Note [Ordered dQ accumulation] (backward_dq_accum.h);
 *   warpgroups 1 and 2, the consumers: warpgroup w owns keys 64 w .. 64 w + 63 of the tile.
 *     Steps of 64 query rows walk (query head of the kv-head's group, row block); per step
 *       S^T  = K8 . Q8^T            FP8 SS  [64 keys, 64 rows] a warpgroup (the forward's scores)
 *       dP^T = V . dO^T             16-bit SS [64 keys, 64 rows]
 *       dV  += P^T . dO             16-bit RS [64 keys, 128 d]   (P^T from registers)
 *       dK  += dS^T . Q_dq          16-bit RS [64 keys, 128 d]   (dS^T from registers)
 *       dQ_n = dS . K_dq            16-bit SS [64 rows, 64 d]    (dS of both warpgroups' keys
 *                                   through shared memory; warpgroup w computes d half w)
 *
 * Shared memory (d = 128):
 *   K8    [128 keys, 128 d] E4M3, K-major SW128                              16 KiB
 *   V     [128 keys, 128 d] 16-bit, K-major SW128                            32 KiB
 *   K_dq  [128 keys, 128 d] 16-bit, K-major SW128 (read MN-major for dQ)     32 KiB
 *   per stage (2): Q8 [64 rows, 128 d] E4M3 8 KiB, Q_dq and dO [64 rows, 128 d] 16-bit 16 KiB
 *     each, dS [64 rows, 128 keys] 16-bit MN-major 16 KiB, [3][64] fp32 row values 113.5 KiB
 *   dQ_n  [2 warpgroups][64 rows x 64 d] fp32 (Note [Ordered dQ accumulation])        32 KiB
 *
 * 16-bit: the input dtype, bf16 or fp16 (the MMAs' element type; the buffers hold its words).
 * The 16-bit [rows, 128 d] buffers serve two operands: K-major (rows, d) for the TMA load and for
 * dO as the B operand of dP^T, and MN-major (d, rows) for dO, Q_dq and K_dq as the B operand of
 * the products that sum over rows or keys. Both layouts put element (row r, channel c) at the
 * same byte (64-channel halves, 128-byte rows, the SW128 swizzle over 8-row groups), so one
 * buffer is read either way.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_TRAITS_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_TRAITS_H_

#include <cutlass/bfloat16.h>
#include <cutlass/float8.h>
#include <cutlass/half.h>

#include <cute/tensor.hpp>

#include "kernel_traits.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

using namespace cute;

constexpr int kHeadDim = 128;  // the backward's one head dim
constexpr int kBwdTile = 128;  // keys of a CTA (2 consumer warpgroups x 64)
constexpr int kBwdStep = 64;   // query rows of a step
constexpr int kBwdStages = 2;  // 3 measured the same for the two-kernel form (2026-12-03)
constexpr int kBwdMmaThreads = 256;                    // the two consumer warpgroups
constexpr int kBwdThreads = kBwdMmaThreads + 128;      // + the producer warpgroup (first)
constexpr int kBwdProducerRegisters = 24;              // setmaxnreg of the producer warpgroup
constexpr int kBwdConsumerRegisters = 240;             // setmaxnreg of a consumer warpgroup
static_assert((kBwdProducerRegisters + 2 * kBwdConsumerRegisters) * 128 <=
                  (65536 / kBwdThreads) / 8 * 8 * kBwdThreads,
              "setmaxnreg: producer + consumer registers exceed the CTA's launch allocation");
constexpr int kRowValues = 3;  // row scale, LSE2, D: BackwardParams::row_values
// dQ_n of one step and warpgroup: [64 rows, 64 d] fp32, 32 values a consumer thread
constexpr int kDqHalfFloats = kBwdStep * kHeadDim / 2;

struct BackwardTraits {
  using Fp8 = cutlass::float_e4m3_t;
  using Bf16 = cutlass::bfloat16_t;
  using Fp16 = cutlass::half_t;
  // The 16-bit operands (V, dO, Q_dq, K_dq, P, dS) are in the input dtype, Element (Bf16 or
  // Fp16): the tiled MMAs that read them take it as a parameter, the layouts and the storage
  // serve both (16-bit words).
  using WarpgroupsM = Layout<Shape<_2, _1, _1>>;  // 64 rows of M per warpgroup

  // [128 keys | 64 rows, 128 d] E4M3, K-major.
  using SmemFp8Tile = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                             Shape<Int<kBwdTile>, Int<kHeadDim>>{}));
  using SmemFp8Step = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                             Shape<Int<kBwdStep>, Int<kHeadDim>>{}));
  // [128 keys | 64 rows, 128 d] 16-bit, K-major (d contiguous).
  using Smem16Tile = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Bf16>{},
                                              Shape<Int<kBwdTile>, Int<kHeadDim>>{}));
  using Smem16Step = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Bf16>{},
                                              Shape<Int<kBwdStep>, Int<kHeadDim>>{}));
  // The same bytes as Smem16Step, read as [128 d, 64 rows] MN-major: the 64 x 8 atoms are
  // stacked along the rows first, as Smem16Step stacks its 8 x 64 atoms.
  using Smem16StepT = decltype(tile_to_shape(
      GMMA::Layout_MN_SW128_Atom<Bf16>{}, Shape<Int<kHeadDim>, Int<kBwdStep>>{}, Step<_2, _1>{}));

  // S^T: [128 keys, 64 rows] = A [128 keys, 128 d] . B [64 rows, 128 d]^T, FP8, both K-major.
  using MmaScores = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Fp8, Fp8, float, Shape<_64, Int<kBwdStep>, Int<kHeadDim>>>(),
      WarpgroupsM{}));
  // dP^T: [128 keys, 64 rows] = A [128 keys, 128 d] . B [64 rows, 128 d]^T, K-major.
  template <class Element>
  using MmaDpOf = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBwdStep>, Int<kHeadDim>>>(),
      WarpgroupsM{}));
  // dV, dK: [128 keys, 128 d] += A [128 keys, 64 rows] (registers) . B [64 rows, 128 d], B
  // MN-major (d contiguous).
  template <class Element>
  using MmaGradOf = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBwdStep>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      WarpgroupsM{}));
  // dQ_n: [64 rows, 128 d] = A [64 rows, 128 keys] . B [128 keys, 128 d], both MN-major (rows,
  // resp. d, contiguous); warpgroup w computes d half w (64 columns).
  template <class Element>
  using MmaDqOf = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, _64, Int<kBwdTile>>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));
  // The fp32 fragments of these products are the same for both dtypes (the dQ store kernel
  // and tests/build read them from the bf16 ones).
  using MmaDp = MmaDpOf<Bf16>;
  using MmaGrad = MmaGradOf<Bf16>;
  using MmaDq = MmaDqOf<Bf16>;

  // dS [64 rows, 128 keys] 16-bit, MN-major (rows contiguous): the A operand of dQ_n. Consumer
  // warpgroup w writes keys 64 w .. 64 w + 63 from its dS^T accumulator.
  using SmemDs = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Bf16>{},
                                        Shape<Int<kBwdStep>, Int<kBwdTile>>{}));
  // K_dq's bytes (Smem16Tile) read as [128 d, 128 keys] MN-major: the B operand of dQ_n.
  using Smem16TileT = decltype(tile_to_shape(
      GMMA::Layout_MN_SW128_Atom<Bf16>{}, Shape<Int<kHeadDim>, Int<kBwdTile>>{}, Step<_2, _1>{}));

  static constexpr int kFp8TileBytes = kBwdTile * kHeadDim;
  static constexpr int kFp8StepBytes = kBwdStep * kHeadDim;
  static constexpr int k16TileBytes = kBwdTile * kHeadDim * 2;
  static constexpr int k16StepBytes = kBwdStep * kHeadDim * 2;

  static constexpr int kDsBytes = kBwdStep * kBwdTile * 2;
  static_assert(cosize_v<Smem16StepT> == cosize_v<Smem16Step>, "one buffer, two views");
  static_assert(cosize_v<Smem16TileT> == cosize_v<Smem16Tile>, "one buffer, two views");
  static_assert(cosize_v<SmemDs> * 2 == kDsBytes, "dS tile layout");

  // Where a consumer thread stores dS^T into SmemDs: its S^T fragment values v = 4 j + 2 h and
  // v + 1 are rows 2 (lane % 4) + 8 j (+ 1) of key 16 warp + lane / 4 + 8 h (warp: the thread's
  // warp among the 8 consumer warps), one 32-bit word at byte
  //   (2 warp + h) * 1024 + (lane / 4) * 128 + ((j ^ lane / 4) * 16) + (lane % 4) * 4
  // (atom 2 warp + h, line lane / 4, the SW128 swizzle's 16-byte chunk j ^ line). With
  // base = ds_word_base(thread), the word of (h, j) is at (base ^ 16 j) + 1024 h: the XOR only
  // touches the chunk bits, which are the line's in base. tests/build checks both against cute.
  static CUTE_HOST_DEVICE constexpr uint32_t ds_word_base(int mma_thread) {
    const int lane = mma_thread % 32, line = lane / 4;
    return (2 * (mma_thread / 32)) * 1024 + line * 128 + line * 16 + (lane % 4) * 4;
  }
  static CUTE_HOST_DEVICE constexpr uint32_t ds_word_offset(uint32_t base, int h, int j) {
    return (base ^ (16 * j)) + 1024 * h;
  }

  struct SharedStorage {
    alignas(1024) Fp8 k8[kFp8TileBytes];
    alignas(1024) uint16_t v[kBwdTile * kHeadDim];     // 16-bit words: Element
    alignas(1024) uint16_t k_dq[kBwdTile * kHeadDim];
    alignas(1024) Fp8 q8[kBwdStages][kFp8StepBytes];
    alignas(1024) uint16_t q_dq[kBwdStages][kBwdStep * kHeadDim];
    alignas(1024) uint16_t d_out[kBwdStages][kBwdStep * kHeadDim];
    alignas(1024) uint16_t ds[kBwdStages][kBwdStep * kBwdTile];  // SmemDs, the step's dS
    // [2 warpgroups][8][128 threads][4] fp32: the step's dQ_n, 16 KiB a warpgroup
    // (Note [Ordered dQ accumulation])
    alignas(1024) float dq[2][kDqHalfFloats];
    alignas(16) float rows[kBwdStages][kRowValues][kBwdStep];  // BackwardParams::row_values
    alignas(8) uint64_t bar_kv;                 // K8, V and K_dq arrived
    alignas(8) uint64_t bar_full[kBwdStages];   // the step's Q8, Q_dq, dO and rows arrived
    alignas(8) uint64_t bar_empty[kBwdStages];  // every consumer thread is done with the stage
  };
  // + 1024 bytes to align the dynamic shared memory (the launch): 226 of the SM's 227 KiB
  static_assert(sizeof(SharedStorage) + 1024 <= 227 * 1024, "shared memory of one CTA");
};

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_TRAITS_H_
