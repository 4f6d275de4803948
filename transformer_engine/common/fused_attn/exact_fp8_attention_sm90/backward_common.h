/*
 * Pieces of the sm90 backward's kernels: the TMA loads of one tile, the WGMMA batches, the
 * probabilities and score gradients (the numerics of docs/backward.md, as the Triton backward
 * computes them), the fp32 -> 16-bit register operands and the gradient stores.
 *
 * Numerics (Note [Mask-exact FP8 scaling]; docs/backward.md): with t = (FP8 product) * key scale
 * and row_scale = q_scale * softmax_scale * log2 e, the forward's own score of (row, key),
 *   P  = 2^min(t * row_scale - LSE2, 0)   (one FFMA; P <= 1 by construction, 0 where NaN)
 *   dS = P * (dP - D)
 * and both are 0 where the mask hides (row, key), by a select, never a product: a hidden
 * position's dP (V or dO near bf16's max) never reaches dS.
 */
#ifndef TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_COMMON_H_
#define TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_COMMON_H_

#include <cuda_bf16.h>
#include <cutlass/arch/barrier.h>

#include <cute/tensor.hpp>

#include "backward_params.h"
#include "backward_traits.h"
#include "softmax.h"

namespace transformer_engine {
namespace exact_fp8 {
namespace sm90 {

using BwdBarrier = cutlass::arch::ClusterTransactionBarrier;

// TMA load of rows [tile * kRows, tile * kRows + kRows) of (head, sample) of a (rows, d, head,
// sample) operand into `smem` (layout Layout_); completes on `bar` (the caller expects the bytes).
template <int kRows, class Layout_, class Tma, class T>
CUTLASS_DEVICE void load_tile(Tma const &tma, BackwardGmem::Shape4 const &shape, T *smem,
                              uint64_t &bar, int head, int batch, int tile) {
  Tensor m = tma.get_tma_tensor(shape);
  Tensor g =
      local_tile(m(_, _, head, batch), Shape<Int<kRows>, Int<kHeadDim>>{}, make_coord(tile, 0));
  Tensor s = make_tensor(make_smem_ptr(smem), Layout_{});
  auto [tg, ts] =
      tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
  copy(tma.with(bar), tg, ts);
}

// A bulk copy of `bytes` (a multiple of 16, 16-byte aligned ends) into shared memory.
CUTLASS_DEVICE void load_bulk(void const *gmem, void *smem, int bytes, uint64_t &bar) {
  SM90_BULK_COPY_G2S::copy(gmem, &bar, smem, bytes);
}

// Issues C = A . B (kZero) or C += A . B as one WGMMA batch, A from registers if kRegisterA;
// the caller waits.
template <bool kZero, bool kRegisterA, class Mma, class FragA, class FragB, class FragC>
CUTLASS_DEVICE void issue_gemm(Mma &mma, FragA &a, FragB const &b, FragC &c) {
  warpgroup_fence_operand(c);
  if constexpr (kRegisterA) warpgroup_fence_operand(a);
  warpgroup_arrive();
  mma.accumulate_ = kZero ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
}

// P of one (row, key) from t = (FP8 product) * key scale (see the file's comment).
CUTLASS_DEVICE float probability(float t, float row_scale, float lse2) {
  const float x = fmaf(t, row_scale, -lse2);
  const float p = fast_exp2(fminf(x, 0.0f));
  return x == x ? p : 0.0f;  // NaN: inf - inf of a row whose forward overflowed
}

// fp32 accumulator fragment (64 x 64) -> the A operand of a register-sourced WGMMA in its
// element type (bf16 or fp16; cute's ALayout_64x16 per 16 columns orders its values as the
// accumulator does).
template <class FragC, class FragA>
CUTLASS_DEVICE void to_16bit_operand(FragC const &c, FragA &a) {
  static_assert(decltype(size(c))::value == decltype(size(a))::value, "operand fragments");
  using Element = typename FragA::value_type;
  uint32_t *words = reinterpret_cast<uint32_t *>(raw_pointer_cast(a.data()));
#pragma unroll
  for (int v = 0; v < size(c); v += 2) words[v / 2] = pack_16bit_pair<Element>(c(v), c(v + 1));
}

// Stores a warpgroup's fp32 gradient fragment times `scale` as Element (bf16 or fp16) rows of a
// [rows, ...] tensor: row r at base + r * row_stride (elements), rows >= num_rows skipped.
template <class Element, class Frag, class Coord>
CUTLASS_DEVICE void store_rows(Frag const &acc, Coord const &coord, float scale, void *base_ptr,
                               int64_t row_stride, int row0, int num_rows) {
  uint16_t *base = static_cast<uint16_t *>(base_ptr);  // 16-bit words
#pragma unroll
  for (int v = 0; v < size(acc); v += 2) {
    const int row = row0 + get<0>(coord(v));
    if (row >= num_rows) continue;
    *reinterpret_cast<uint32_t *>(base + row * row_stride + get<1>(coord(v))) =
        pack_16bit_pair<Element>(acc(v) * scale, acc(v + 1) * scale);
  }
}

}  // namespace sm90
}  // namespace exact_fp8
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_FUSED_ATTN_EXACT_FP8_ATTENTION_SM90_BACKWARD_COMMON_H_
