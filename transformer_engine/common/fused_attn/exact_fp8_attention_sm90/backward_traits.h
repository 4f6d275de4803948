/*
 * Tiles, shared-memory layouts and tiled MMAs of the sm90 mask-exact FP8 attention backward
 * (docs/backward.md, "The sm90 CUDA backward"). Two kernels, each with two consumer warpgroups
 * of 64 rows (256 threads; thread 0 also issues the TMA loads of a two-stage ring):
 *
 *   dK/dV (backward_dkdv.h): one CTA per (sample, kv-head, 128 keys); steps of 64 query rows.
 *     Warpgroup w owns keys 64 w .. 64 w + 63 of the tile and computes, per step,
 *       S^T  = K8 . Q8^T            FP8 SS  [64 keys, 64 rows]   (the forward's scores)
 *       dP^T = V . dO^T             bf16 SS [64 keys, 64 rows]
 *       dV  += P^T . dO             bf16 RS [64 keys, 128 d]     (P^T from registers)
 *       dK  += dS^T . Q_dq          bf16 RS [64 keys, 128 d]     (dS^T from registers)
 *   dQ (backward_dq.h): one CTA per (sample, head, 128 query rows); steps of 64 keys.
 *     Warpgroup w owns rows 64 w .. 64 w + 63 and computes, per step,
 *       S  = Q8 . K8^T   FP8 SS,   dP = dO . V^T   bf16 SS,   dQ += dS . K_dq   bf16 RS
 *
 * Shared memory, dK/dV (d = 128):
 *   K8    [128 keys, 128 d] E4M3, K-major SW128                              16 KiB
 *   V     [128 keys, 128 d] bf16, K-major SW128                              32 KiB
 *   per stage (2): Q8 [64 rows, 128 d] E4M3 8 KiB, Q_dq and dO [64 rows, 128 d] bf16 16 KiB
 *     each, [3][64] fp32 row values (row scale, LSE2, D)                   81.5 KiB
 * Shared memory, dQ:
 *   Q8 [128 rows, 128 d] E4M3 16 KiB, dO [128 rows, 128 d] bf16 32 KiB
 *   per stage (2): K8 [64 keys, 128 d] E4M3 8 KiB, V and K_dq [64 keys, 128 d] bf16 16 KiB
 *     each, K scales [64] fp32                                               80.5 KiB
 *
 * The bf16 [64, 128] buffers serve two operands: K-major (rows, d) for the TMA load and for
 * dO as the B operand of dP^T, and MN-major (d, rows) for dO, Q_dq and K_dq as the B operand of
 * the register-sourced products. Both layouts put element (row r, channel c) at the same byte
 * (64-channel halves of 8 KiB, 128-byte rows, the SW128 swizzle over 8-row groups), so one
 * buffer is read either way.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_TRAITS_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_TRAITS_H_

#include <cutlass/bfloat16.h>
#include <cutlass/float8.h>

#include <cute/tensor.hpp>

#include "kernel_traits.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

using namespace cute;

constexpr int kBwdTile = 128;     // keys of a dK/dV CTA, rows of a dQ CTA (2 warpgroups x 64)
constexpr int kBwdStep = 64;      // rows of a dK/dV step, keys of a dQ step
constexpr int kBwdStages = 2;     // 3 measured the same (backward_h200.md, 2026-12-03)
constexpr int kBwdThreads = 256;  // two consumer warpgroups; thread 0 issues the loads
constexpr int kRowValues = 3;     // row scale, LSE2, D: BackwardParams::row_values

struct BackwardTraits {
  using Fp8 = cutlass::float_e4m3_t;
  using Bf16 = cutlass::bfloat16_t;
  using WarpgroupsM = Layout<Shape<_2, _1, _1>>;  // 64 rows of M per warpgroup

  // [128 | 64, 128 d] E4M3, K-major.
  using SmemFp8Tile = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                             Shape<Int<kBwdTile>, Int<kHeadDim>>{}));
  using SmemFp8Step = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                             Shape<Int<kBwdStep>, Int<kHeadDim>>{}));
  // [128 | 64, 128 d] bf16, K-major (d contiguous).
  using SmemBf16Tile = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Bf16>{},
                                              Shape<Int<kBwdTile>, Int<kHeadDim>>{}));
  using SmemBf16Step = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Bf16>{},
                                              Shape<Int<kBwdStep>, Int<kHeadDim>>{}));
  // The same bytes as SmemBf16Step, read as [128 d, 64 rows] MN-major: the 64 x 8 atoms are
  // stacked along the rows first, as SmemBf16Step stacks its 8 x 64 atoms.
  using SmemBf16StepT = decltype(tile_to_shape(
      GMMA::Layout_MN_SW128_Atom<Bf16>{}, Shape<Int<kHeadDim>, Int<kBwdStep>>{}, Step<_2, _1>{}));

  // Scores: [128, 64] = A [128, 128 d] . B [64, 128 d]^T, FP8, both K-major.
  using MmaScores = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Fp8, Fp8, float, Shape<_64, Int<kBwdStep>, Int<kHeadDim>>>(),
      WarpgroupsM{}));
  // dP^T (dK/dV) or dP (dQ): [128, 64] = A [128, 128 d] . B [64, 128 d]^T, bf16, K-major.
  using MmaDp = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Bf16, Bf16, float, Shape<_64, Int<kBwdStep>, Int<kHeadDim>>>(),
      WarpgroupsM{}));
  // dV, dK (dK/dV) or dQ (dQ): [128, 128 d] += A [128, 64] (registers) . B [64, 128 d], B
  // MN-major (d contiguous).
  using MmaGrad = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Bf16, Bf16, float, Shape<_64, Int<kHeadDim>, Int<kBwdStep>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      WarpgroupsM{}));

  static constexpr int kFp8TileBytes = kBwdTile * kHeadDim;
  static constexpr int kFp8StepBytes = kBwdStep * kHeadDim;
  static constexpr int kBf16TileBytes = kBwdTile * kHeadDim * 2;
  static constexpr int kBf16StepBytes = kBwdStep * kHeadDim * 2;
  static_assert(cosize_v<SmemBf16StepT> == cosize_v<SmemBf16Step>, "one buffer, two views");

  struct DkdvStorage {
    alignas(1024) Fp8 k8[kFp8TileBytes];
    alignas(1024) Bf16 v[kBwdTile * kHeadDim];
    alignas(1024) Fp8 q8[kBwdStages][kFp8StepBytes];
    alignas(1024) Bf16 q_dq[kBwdStages][kBwdStep * kHeadDim];
    alignas(1024) Bf16 d_out[kBwdStages][kBwdStep * kHeadDim];
    alignas(16) float rows[kBwdStages][kRowValues][kBwdStep];  // BackwardParams::row_values
    alignas(8) uint64_t bar_kv;                                // K8 and V arrived
    alignas(8) uint64_t bar_full[kBwdStages];  // the step's Q8, Q_dq, dO and rows arrived
  };

  struct DqStorage {
    alignas(1024) Fp8 q8[kFp8TileBytes];
    alignas(1024) Bf16 d_out[kBwdTile * kHeadDim];
    alignas(1024) Fp8 k8[kBwdStages][kFp8StepBytes];
    alignas(1024) Bf16 v[kBwdStages][kBwdStep * kHeadDim];
    alignas(1024) Bf16 k_dq[kBwdStages][kBwdStep * kHeadDim];
    alignas(16) float k_scale[kBwdStages][kBwdStep];
    alignas(8) uint64_t bar_q;                 // Q8 and dO arrived
    alignas(8) uint64_t bar_full[kBwdStages];  // the step's K8, V, K_dq and K scales arrived
  };
};

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_TRAITS_H_
